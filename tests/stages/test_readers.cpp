// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/pipeline.h"
#include "stoker/stages/readers.h"
#include "support.h"

using namespace stoker;
using stoker::test::TempDir;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<std::byte>;

template <class... T>
Bytes bytes_of(T... values) {
  return {static_cast<std::byte>(values)...};
}

void append(Bytes& out, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  out.insert(out.end(), p, p + n);
}

void append_be32(Bytes& out, std::uint32_t v) {
  const Bytes b = bytes_of(v >> 24, (v >> 16) & 0xFF, (v >> 8) & 0xFF, v & 0xFF);
  out.insert(out.end(), b.begin(), b.end());
}

void write_file(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

Bytes read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

// A gzip file the way zlib's gzip writer makes it.
void write_gzip(const fs::path& path, const Bytes& bytes) {
  gzFile gz = gzopen(path.c_str(), "wb");
  REQUIRE(gz != nullptr);
  REQUIRE(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(gz) == Z_OK);
}

Bytes idx_images(std::uint32_t count, std::uint32_t height, std::uint32_t width, std::uint32_t magic = 0x803) {
  Bytes out;
  append_be32(out, magic);
  append_be32(out, count);
  append_be32(out, height);
  append_be32(out, width);
  for (std::uint32_t i = 0; i < count * height * width; ++i) out.push_back(static_cast<std::byte>(i * 7 + 3));
  return out;
}

Bytes idx_labels(std::uint32_t count) {
  Bytes out;
  append_be32(out, 0x801);
  append_be32(out, count);
  for (std::uint32_t i = 0; i < count; ++i) out.push_back(static_cast<std::byte>(i % 10));
  return out;
}

// A .npy file: `dict` is the header's dictionary text, padding and lengths are added here.
Bytes npy_file(const std::string& dict, const void* data, std::size_t data_bytes, int version = 1) {
  const std::size_t preamble = version == 1 ? 10 : 12;
  std::string header = dict;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes out = bytes_of(0x93, 'N', 'U', 'M', 'P', 'Y', version, 0);
  const auto n = static_cast<std::uint32_t>(header.size());
  if (version == 1)
    out.insert(out.end(), {std::byte(n & 0xFF), std::byte(n >> 8)});
  else
    out.insert(out.end(),
               {std::byte(n & 0xFF), std::byte((n >> 8) & 0xFF), std::byte((n >> 16) & 0xFF), std::byte(n >> 24)});
  append(out, header.data(), header.size());
  append(out, data, data_bytes);
  return out;
}

std::string npy_dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

// The exception's message, which must name `file` and contain `problem`.
template <class F>
void check_data_error(F&& f, const fs::path& file, const std::string& problem) {
  try {
    f();
    FAIL("no DataError for " << file << " (expected '" << problem << "')");
  } catch (const DataError& e) {
    const std::string what = e.what();
    INFO("message: " << what);
    CHECK(what.find(file.string()) != std::string::npos);
    CHECK(what.find(problem) != std::string::npos);
    CHECK(e.file() == file.string());
  }
}

std::vector<std::uint64_t> all_ids(Reader& reader) {
  std::vector<std::uint64_t> ids;
  while (auto s = reader()) ids.push_back(s->id);
  return ids;
}

}  // namespace

TEST_SUITE("IDX reader") {
  TEST_CASE("plain and gzip IDX files load the same, detected by content, not by name") {
    TempDir dir;
    const Bytes images = idx_images(5, 3, 4), labels = idx_labels(5);
    write_file(dir / "images.idx", images);
    write_file(dir / "labels.idx", labels);
    write_gzip(dir / "images.plain-name", images);  // gzip under a name that does not say so
    write_gzip(dir / "labels.gz", labels);

    for (const auto& [im, lb] : {std::pair{"images.idx", "labels.idx"}, std::pair{"images.plain-name", "labels.gz"}}) {
      CAPTURE(im);
      const IdxDataset data = load_idx(dir / im, dir / lb);
      REQUIRE(data.size() == 5);
      CHECK(data.images.count == 5);
      CHECK(data.shape() == Shape{1, 1, 3, 4, false});
      for (std::size_t i = 0; i < 5; ++i) {
        CHECK(data.labels[i] == static_cast<std::int32_t>(i % 10));
        const auto px = data.image(i);
        for (std::size_t j = 0; j < px.size(); ++j) CHECK(px[j] == static_cast<std::uint8_t>((i * 12 + j) * 7 + 3));
      }
    }
  }

  TEST_CASE("gzip: concatenated members are one stream, and garbage after the end is an error") {
    TempDir dir;
    const Bytes images = idx_images(4, 3, 3);
    const auto half = static_cast<std::ptrdiff_t>(images.size() / 2);
    write_gzip(dir / "a.gz", Bytes(images.begin(), images.begin() + half));
    write_gzip(dir / "b.gz", Bytes(images.begin() + half, images.end()));
    Bytes both = read_bytes(dir / "a.gz");
    const Bytes second = read_bytes(dir / "b.gz");
    both.insert(both.end(), second.begin(), second.end());  // what `cat a.gz b.gz` makes
    CHECK(gunzip(both, "both") == images);
    CHECK(parse_idx_images(both, "both").pixels.size() == 4 * 3 * 3);
    both.push_back(std::byte{0});
    CHECK_THROWS_WITH_AS(gunzip(both, "both"), "both: 1 bytes of garbage after the gzip data", DataError);
  }

  TEST_CASE("IdxReader yields every sample with its id and label, and restarts each epoch") {
    TempDir dir;
    write_file(dir / "images", idx_images(7, 2, 2));
    write_file(dir / "labels", idx_labels(7));
    IdxReader reader(load_idx(dir / "images", dir / "labels"));
    CHECK(reader.size() == 7);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (std::uint64_t i = 0; i < 7; ++i) {
        auto s = reader();
        REQUIRE(s);
        CHECK(s->id == i);
        CHECK(s->label == static_cast<std::int32_t>(i));
        CHECK(s->shape == Shape{1, 1, 2, 2, false});
        CHECK(s->as<std::uint8_t>()[1] == static_cast<std::uint8_t>((i * 4 + 1) * 7 + 3));
      }
      CHECK_FALSE(reader());
    }
    CHECK_THROWS_AS(reader.read(7), std::out_of_range);
  }

  TEST_CASE("IdxReader's samples view its data set: nothing copied, the data set kept alive, writes copy first") {
    TempDir dir;
    write_file(dir / "images", idx_images(7, 2, 3));
    write_file(dir / "labels", idx_labels(7));
    auto data = std::make_shared<const IdxDataset>(load_idx(dir / "images", dir / "labels"));
    const std::weak_ptr<const IdxDataset> alive = data;
    const auto* pixels = reinterpret_cast<const std::byte*>(data->images.pixels.data());
    Sample kept;
    {
      const IdxReader reader(std::exchange(data, nullptr));
      kept = reader.read(5);
      const Sample& s = kept;
      CHECK(s.data.is_view());
      CHECK(s.data.pool() == nullptr);
      CHECK(s.data.data() == pixels + 5 * 6);
      CHECK(s.viewed() != nullptr);
    }
    // The sample outlives its reader, which held the only other reference to the data set.
    CHECK_FALSE(alive.expired());
    CHECK(std::as_const(kept).as<std::uint8_t>()[1] == static_cast<std::uint8_t>((5 * 6 + 1) * 7 + 3));

    // Writing gives the sample a copy of its own; the data set and its other samples keep
    // their bytes.
    const IdxReader reader(alive.lock());
    Sample a = reader.read(2), b = reader.read(2);
    a.as<std::uint8_t>()[0] = 1;
    CHECK_FALSE(a.data.is_view());
    CHECK(a.viewed() == nullptr);
    CHECK(std::as_const(b).as<std::uint8_t>()[0] == static_cast<std::uint8_t>(2 * 6 * 7 + 3));
    CHECK(reader.dataset().image(2)[0] == static_cast<std::uint8_t>(2 * 6 * 7 + 3));
    CHECK(std::as_const(a).as<std::uint8_t>()[0] == 1);
    kept = Sample{};
    CHECK_FALSE(alive.expired());  // `reader` still holds it
  }

  TEST_CASE("bad input: missing IDX file") {
    TempDir dir;
    write_file(dir / "labels", idx_labels(3));
    check_data_error([&] { load_idx(dir / "nope", dir / "labels"); }, dir / "nope", "No such file");
    check_data_error([&] { fashion_mnist(dir.path()); }, dir / "train-images-idx3-ubyte.gz", "No such file");
    check_data_error([&] { load_idx(dir.path(), dir / "labels"); }, dir.path(), "not a regular file");
  }

  TEST_CASE("fashion_mnist reads its files gzip-compressed, as published, or unpacked") {
    TempDir dir;
    write_file(dir / "t10k-images-idx3-ubyte", idx_images(3, 28, 28));  // unpacked
    write_gzip(dir / "t10k-labels-idx1-ubyte.gz", idx_labels(3));
    const IdxDataset data = fashion_mnist(dir.path(), "t10k");
    CHECK(data.images.count == 3);
    CHECK(data.labels.size() == 3);
    // The labels unpacked too, but not IDX: the error names the file read.
    write_file(dir / "t10k-labels-idx1-ubyte", Bytes(5));
    std::filesystem::remove(dir / "t10k-labels-idx1-ubyte.gz");
    check_data_error([&] { fashion_mnist(dir.path(), "t10k"); }, dir / "t10k-labels-idx1-ubyte", "bad IDX magic");
  }

  TEST_CASE("bad input: truncated gzip") {
    TempDir dir;
    write_gzip(dir / "full.gz", idx_images(50, 8, 8));
    auto gz = read_bytes(dir / "full.gz");
    for (std::size_t keep : {gz.size() - 1, gz.size() - 8, gz.size() / 2, std::size_t{12}}) {
      CAPTURE(keep);
      write_file(dir / "cut.gz", Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(keep)));
      check_data_error([&] { load_idx(dir / "cut.gz", dir / "labels"); }, dir / "cut.gz", "truncated gzip");
    }
    // A flipped bit in the compressed data: zlib's CRC or decoder catches it.
    gz[gz.size() / 2] ^= std::byte{0x10};
    write_file(dir / "bad.gz", gz);
    check_data_error([&] { load_idx(dir / "bad.gz", dir / "labels"); }, dir / "bad.gz", "gzip");
  }

  TEST_CASE("bad input: wrong IDX magic") {
    TempDir dir;
    write_file(dir / "labels", idx_labels(2));
    write_file(dir / "images", idx_images(2, 2, 2, 0x12345678));
    check_data_error([&] { load_idx(dir / "images", dir / "labels"); }, dir / "images", "bad IDX magic 0x12345678");
    // Labels given as images and the other way round.
    write_file(dir / "images", idx_images(2, 2, 2));
    check_data_error([&] { load_idx(dir / "labels", dir / "images"); }, dir / "labels", "expected 0x00000803");
    check_data_error([&] { load_idx(dir / "images", dir / "images"); }, dir / "images", "expected 0x00000801");
    // Right shape, other element type (float32: 0x0D).
    write_file(dir / "float", idx_images(2, 2, 2, 0xD03));
    check_data_error([&] { load_idx(dir / "float", dir / "labels"); }, dir / "float",
                     "element type 0x0D is not supported");
  }

  TEST_CASE("bad input: IDX data shorter or longer than the header says") {
    TempDir dir;
    write_file(dir / "labels", idx_labels(3));
    auto images = idx_images(3, 4, 4);
    images.pop_back();
    write_file(dir / "short", images);
    check_data_error([&] { load_idx(dir / "short", dir / "labels"); }, dir / "short", "truncated");
    images.push_back(std::byte{0});
    images.push_back(std::byte{0});
    write_file(dir / "long", images);
    check_data_error([&] { load_idx(dir / "long", dir / "labels"); }, dir / "long", "1 unexpected bytes");
  }

  TEST_CASE("bad input: image and label counts that differ") {
    TempDir dir;
    write_file(dir / "images", idx_images(4, 2, 2));
    write_file(dir / "labels", idx_labels(3));
    check_data_error([&] { load_idx(dir / "images", dir / "labels"); }, dir / "images",
                     "holds 4 images but its labels file " + (dir / "labels").string() + " holds 3 labels");
  }

  TEST_CASE("the parsers throw DataError, and only that, for every prefix of a valid file") {
    // A small stand-in for the fuzzers, run in every (sanitizer) build.
    TempDir dir;
    const Bytes plain = idx_images(3, 2, 3);
    write_gzip(dir / "gz", plain);
    const Bytes gz = read_bytes(dir / "gz");
    for (const Bytes* file : {&plain, &gz}) {
      for (std::size_t n = 0; n < file->size(); ++n) {
        CAPTURE(n);
        std::span<const std::byte> prefix(file->data(), n);
        CHECK_THROWS_AS(parse_idx_images(prefix, "prefix"), DataError);
        CHECK_THROWS_AS(parse_idx_labels(prefix, "prefix"), DataError);
      }
      CHECK(parse_idx_images(*file, "whole").count == 3);
    }
  }
}

TEST_SUITE("npy reader") {
  TEST_CASE("uint8 2D, uint16 and float32 3D, format 1.0 and 2.0") {
    auto pool = BufferPool::create();
    const std::vector<std::uint8_t> u8 = {1, 2, 3, 4, 5, 6};
    auto a = parse_npy(npy_file(npy_dict("|u1", "(2, 3)"), u8.data(), u8.size()), "a.npy", *pool, 4, 9);
    CHECK(a.shape == Shape{1, 1, 2, 3, false});
    CHECK(a.dtype == DType::u8);
    CHECK(a.label == 4);
    CHECK(a.id == 9);
    CHECK(std::equal(u8.begin(), u8.end(), a.as<std::uint8_t>().begin()));

    std::vector<std::uint16_t> u16(2 * 3 * 4);
    std::iota(u16.begin(), u16.end(), std::uint16_t{60000});
    for (int version : {1, 2}) {
      CAPTURE(version);
      auto b = parse_npy(npy_file(npy_dict("<u2", "(2, 3, 4)"), u16.data(), u16.size() * 2, version), "b.npy", *pool);
      CHECK(b.shape == Shape{1, 2, 3, 4, true});
      CHECK(std::equal(u16.begin(), u16.end(), b.as<std::uint16_t>().begin()));
    }

    std::vector<float> f32(5 * 1 * 2);
    std::iota(f32.begin(), f32.end(), -2.5f);
    // numpy's own spelling: no trailing comma, Python 2 long literals once were possible too
    auto c = parse_npy(
        npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (5L, 1L, 2L)}", f32.data(), f32.size() * 4),
        "c.npy", *pool);
    CHECK(c.shape == Shape{1, 5, 1, 2, true});
    CHECK(std::equal(f32.begin(), f32.end(), c.as<float>().begin()));
  }

  TEST_CASE("load_npy reads a file, and NpyReader a directory with labels from a CSV") {
    TempDir dir;
    std::vector<std::uint8_t> pixels(16 * 16);
    for (int i = 0; i < 5; ++i) {
      std::fill(pixels.begin(), pixels.end(), static_cast<std::uint8_t>(i));
      const std::string name = std::string("v").append(std::to_string(i)).append(".npy");
      write_file(dir / name, npy_file(npy_dict("|u1", "(4, 8, 8)"), pixels.data(), pixels.size()));
    }
    auto pool = BufferPool::create();
    auto one = load_npy(dir / "v3.npy", *pool, 7, 3);
    CHECK(one.shape == Shape{1, 4, 8, 8, true});
    CHECK(one.as<std::uint8_t>()[100] == 3);

    std::ofstream(dir / "labels.csv") << "filename,label\n v4.npy , 40\r\nv0.npy,0\n\nv2.npy,-2\n";
    auto reader = NpyReader::from_directory(dir.path(), dir / "labels.csv");
    REQUIRE(reader.size() == 3);
    std::vector<std::pair<int, int>> seen;  // (content, label)
    while (auto s = reader()) seen.emplace_back(s->as<std::uint8_t>()[0], s->label);
    CHECK(seen == std::vector<std::pair<int, int>>{{4, 40}, {0, 0}, {2, -2}});

    // Without a CSV: every .npy file, in name order, label 0.
    std::ofstream(dir / "notes.txt") << "not a sample";
    auto all = NpyReader::from_directory(dir.path(), {}, {.shard_index = 1, .num_shards = 2});
    CHECK(all.dataset_size() == 5);
    CHECK(all_ids(all) == std::vector<std::uint64_t>{1, 3});
    CHECK(all.read(3).as<std::uint8_t>()[0] == 3);
  }

  TEST_CASE("bad input: labels CSV") {
    TempDir dir;
    std::ofstream(dir / "a.npy") << "x";
    std::ofstream(dir / "bad.csv") << "a.npy,1\na.npy,one\n";
    check_data_error([&] { read_labels_csv(dir / "bad.csv", dir.path()); }, dir / "bad.csv", "line 2: label 'one'");
    std::ofstream(dir / "nocomma.csv") << "a.npy 1\n";
    check_data_error([&] { read_labels_csv(dir / "nocomma.csv", dir.path()); }, dir / "nocomma.csv",
                     "line 1: expected");
    std::ofstream(dir / "missing.csv") << "a.npy,1\nb.npy,2\n";
    check_data_error([&] { NpyReader::from_directory(dir.path(), dir / "missing.csv"); }, dir / "b.npy",
                     "No such file");
  }

  TEST_CASE("bad input: missing .npy file") {
    TempDir dir;
    auto pool = BufferPool::create();
    check_data_error([&] { load_npy(dir / "nope.npy", *pool); }, dir / "nope.npy", "No such file");
    check_data_error([&] { NpyReader({{dir / "nope.npy", 0}}); }, dir / "nope.npy", "No such file");
  }

  TEST_CASE("bad input: unsupported dtype") {
    TempDir dir;
    auto pool = BufferPool::create();
    const double data[4] = {};
    for (const std::string descr : {"<f8", ">u2", "<i4", "|b1"}) {
      CAPTURE(descr);
      write_file(dir / "f.npy", npy_file(npy_dict(descr, "(2, 2)"), data,
                                         4 * (descr == "<f8"   ? 8
                                              : descr == "|b1" ? 1
                                              : descr == "<i4" ? 4
                                                               : 2)));
      check_data_error([&] { load_npy(dir / "f.npy", *pool); }, dir / "f.npy",
                       "unsupported .npy dtype '" + descr + "'");
    }
    write_file(dir / "s.npy",
               npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 2), }", data, 16));
    check_data_error([&] { load_npy(dir / "s.npy", *pool); }, dir / "s.npy", "structured dtypes are not supported");
  }

  TEST_CASE("bad input: Fortran order") {
    TempDir dir;
    auto pool = BufferPool::create();
    const std::uint8_t data[6] = {};
    write_file(dir / "f.npy", npy_file(npy_dict("|u1", "(2, 3)", true), data, 6));
    check_data_error([&] { load_npy(dir / "f.npy", *pool); }, dir / "f.npy", "Fortran order");
  }

  TEST_CASE("bad input: a header that lies about the size") {
    TempDir dir;
    auto pool = BufferPool::create();
    std::vector<float> data(2 * 3 * 4);
    // The header promises 2x3x5 floats (120 bytes); the file holds 96 bytes of data.
    const Bytes lying = npy_file(npy_dict("<f4", "(2, 3, 5)"), data.data(), data.size() * 4);
    write_file(dir / "short.npy", lying);
    check_data_error([&] { load_npy(dir / "short.npy", *pool); }, dir / "short.npy",
                     "the header says (2, 3, 5) float32 = 120 bytes of data after a " +
                         std::to_string(lying.size() - 96) + "-byte header, but the file has only " +
                         std::to_string(lying.size()) + " bytes");
    // More data than the header says.
    write_file(dir / "long.npy", npy_file(npy_dict("<f4", "(2, 3, 3)"), data.data(), data.size() * 4));
    check_data_error([&] { load_npy(dir / "long.npy", *pool); }, dir / "long.npy", "24 unexpected bytes");
    // A header length beyond the end of the file.
    auto file = npy_file(npy_dict("<f4", "(2, 3, 4)"), data.data(), data.size() * 4);
    file[8] = std::byte{0xFF};
    file[9] = std::byte{0x7F};
    write_file(dir / "header.npy", file);
    check_data_error([&] { load_npy(dir / "header.npy", *pool); }, dir / "header.npy", "truncated .npy header");
    // Dimensions whose product overflows.
    write_file(dir / "huge.npy", npy_file(npy_dict("<f4", "(4294967295, 4294967295, 4294967295)"), data.data(), 4));
    check_data_error([&] { load_npy(dir / "huge.npy", *pool); }, dir / "huge.npy", "overflows 64 bits");
  }

  TEST_CASE("bad input: other malformed .npy files") {
    TempDir dir;
    auto pool = BufferPool::create();
    const std::uint8_t data[8] = {};
    const std::pair<std::string, std::string> cases[] = {
        {npy_dict("|u1", "(8,)"), "only 2D (H, W) and 3D (D, H, W)"},
        {npy_dict("|u1", "(1, 2, 2, 2)"), "only 2D (H, W) and 3D (D, H, W)"},
        {npy_dict("|u1", "(0, 8)"), "every dimension must be"},
        {"{'descr': '|u1', 'shape': (2, 4), }", "are all required"},
        {"{'descr': '|u1', 'fortran_order': false, 'shape': (2, 4), }", "expected True or False"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (2, 4), 'extra': 1}", "unknown header key 'extra'"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (2, 4), } x", "unexpected text"},
        {"{'descr': '|u1, 'fortran_order': False, 'shape': (2, 4)}", "malformed .npy header"},
    };
    for (const auto& [dict, problem] : cases) {
      CAPTURE(dict);
      write_file(dir / "m.npy", npy_file(dict, data, 8));
      check_data_error([&] { load_npy(dir / "m.npy", *pool); }, dir / "m.npy", problem);
    }
    auto bad_version = npy_file(npy_dict("|u1", "(2, 4)"), data, 8);
    bad_version[6] = std::byte{4};
    write_file(dir / "v.npy", bad_version);
    check_data_error([&] { load_npy(dir / "v.npy", *pool); }, dir / "v.npy", "format version 4.0 is not supported");
    write_file(dir / "x.npy", bytes_of('P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0, 0));
    check_data_error([&] { load_npy(dir / "x.npy", *pool); }, dir / "x.npy", "not a .npy file");
  }

  TEST_CASE("parse_npy throws DataError, and only that, for every prefix of a valid file") {
    auto pool = BufferPool::create();
    const std::uint16_t data[2 * 2 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    for (int version : {1, 2}) {
      const Bytes file = npy_file(npy_dict("<u2", "(2, 2, 3)"), data, sizeof data, version);
      for (std::size_t n = 0; n < file.size(); ++n) {
        CAPTURE(n);
        CHECK_THROWS_AS(parse_npy({file.data(), n}, "prefix", *pool), DataError);
      }
      CHECK(parse_npy(file, "whole", *pool).as<std::uint16_t>()[11] == 12);
    }
  }
}

TEST_SUITE("raw volume reader") {
  TEST_CASE("a file of consecutive volumes") {
    TempDir dir;
    std::vector<std::uint16_t> values(3 * 2 * 4 * 5);
    std::iota(values.begin(), values.end(), std::uint16_t{0});
    Bytes file;
    append(file, values.data(), values.size() * 2);
    write_file(dir / "vol.raw", file);
    const Shape shape{1, 2, 4, 5, true};
    RawVolumeReader reader(dir / "vol.raw", shape, DType::u16, {}, 3);
    CHECK(reader.dataset_size() == 3);
    CHECK(reader.volume_bytes() == 80);
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (std::uint64_t i = 0; i < 3; ++i) {
        auto s = reader();
        REQUIRE(s);
        CHECK(s->id == i);
        CHECK(s->label == 3);
        CHECK(s->shape == shape);
        CHECK(s->as<std::uint16_t>()[0] == i * 40);
        CHECK(s->as<std::uint16_t>()[39] == i * 40 + 39);
      }
      CHECK_FALSE(reader());
    }
  }

  TEST_CASE("bad input: a size that is not a multiple of the volume size, a missing file") {
    TempDir dir;
    write_file(dir / "vol.raw", Bytes(1000));
    check_data_error(
        [&] {
          RawVolumeReader(dir / "vol.raw", {1, 4, 8, 8, true}, DType::u16);
        },
        dir / "vol.raw", "size 1000 bytes is not a whole number of 1x4x8x8 uint16 volumes of 512 bytes each");
    write_file(dir / "empty.raw", Bytes{});
    check_data_error(
        [&] {
          RawVolumeReader(dir / "empty.raw", {1, 1, 2, 2, false}, DType::u8);
        },
        dir / "empty.raw", "size 0 bytes");
    check_data_error(
        [&] {
          RawVolumeReader(dir / "nope.raw", {1, 1, 2, 2, false}, DType::u8);
        },
        dir / "nope.raw", "No such file");
    CHECK_THROWS_AS(RawVolumeReader(dir / "vol.raw", {1, 0, 8, 8, true}, DType::u8), std::invalid_argument);
  }
}

TEST_SUITE("synthetic source") {
  TEST_CASE("content and labels depend on (seed, id) only") {
    for (DType dtype : {DType::u8, DType::u16, DType::f32}) {
      CAPTURE(dtype_name(dtype));
      const SyntheticOptions options{
          .shape = {1, 3, 5, 7, true}, .dtype = dtype, .count = 100, .seed = 11, .num_classes = 4};
      SyntheticSource a(options), b(options, {.shard_index = 1, .num_shards = 3});
      auto other_seed = options;
      other_seed.seed = 12;
      SyntheticSource c(other_seed);
      const std::size_t bytes = 3 * 5 * 7 * dtype_size(dtype);
      std::set<std::int32_t> labels;
      for (std::uint64_t id : {0, 1, 40, 99}) {
        const Sample x = a.read(id), y = b.read(id), z = c.read(id);
        CHECK(x.shape == options.shape);
        CHECK(x.dtype == dtype);
        CHECK(x.id == id);
        CHECK(std::memcmp(x.data.data(), y.data.data(), bytes) == 0);
        CHECK(x.label == y.label);
        CHECK(std::memcmp(x.data.data(), z.data.data(), bytes) != 0);
        CHECK(std::memcmp(x.data.data(), a.read(id == 0 ? 1 : id - 1).data.data(), bytes) != 0);
      }
      for (std::uint64_t id = 0; id < 100; ++id) {
        const auto label = a.read(id).label;
        CHECK((label >= 0 && label < 4));
        labels.insert(label);
      }
      CHECK(labels.size() == 4);
      if (dtype == DType::f32) {
        for (float v : a.read(5).as<float>()) CHECK((v >= 0.0f && v < 1.0f));
      }
    }
  }

  TEST_CASE("bad options") {
    CHECK_THROWS_WITH_AS(SyntheticSource({.num_classes = 0}), doctest::Contains("num_classes"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(SyntheticSource({.shape = {1, 1, 0, 4, false}}), doctest::Contains("shape"),
                         std::invalid_argument);
  }
}

TEST_SUITE("sharding") {
  TEST_CASE("shards are disjoint and cover the data set exactly once, for any size and shard count") {
    for (std::uint64_t n : {0, 1, 2, 5, 17, 100}) {
      for (std::uint32_t k : {1u, 2u, 3u, 7u, 150u}) {
        CAPTURE(n);
        CAPTURE(k);
        std::vector<int> seen(n, 0);
        std::uint64_t total = 0;
        for (std::uint32_t s = 0; s < k; ++s) {
          SyntheticSource shard({.shape = {1, 1, 1, 1, false}, .count = n}, {.shard_index = s, .num_shards = k});
          const auto ids = all_ids(shard);
          CHECK(ids.size() == shard.size());
          // IdSource yields the same ids, epoch after epoch.
          IdSource id_source(shard);
          for (int epoch = 0; epoch < 2; ++epoch) {
            std::vector<std::uint64_t> from_source;
            while (auto id = id_source()) from_source.push_back(*id);
            CHECK(from_source == ids);
          }
          CHECK(std::is_sorted(ids.begin(), ids.end()));
          for (auto id : ids) {
            REQUIRE(id < n);
            CHECK(id % k == s);
            ++seen[id];
          }
          total += ids.size();
        }
        CHECK(total == n);
        CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      }
    }
  }

  TEST_CASE("a source sought to its end or past it ends the epoch, and the next starts at the first sample") {
    // What a resume does after a short last batch: it seeks to where the next full one would start.
    SyntheticSource reader({.shape = {1, 1, 1, 1, false}, .count = 5});
    IdSource ids(reader);
    for (const std::uint64_t k : {5, 9}) {
      CAPTURE(k);
      reader.seek(k);
      CHECK(!reader());
      CHECK(reader()->id == 0);
      reader.rewind();
      ids.seek(k);
      CHECK(!ids());
      CHECK(ids() == 0u);
    }
  }

  TEST_CASE("bad input: shard options out of range name the option") {
    const SyntheticOptions tiny{.count = 10};
    CHECK_THROWS_WITH_AS(SyntheticSource(tiny, {.shard_index = 3, .num_shards = 3}),
                         "reader option shard_index 3 is out of range: with num_shards 3 it must be in 0..2",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(SyntheticSource(tiny, {.shard_index = 0, .num_shards = 0}),
                         doctest::Contains("num_shards must be at least 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(IdxReader(IdxDataset{}, {.shard_index = 1}), doctest::Contains("shard_index"),
                         std::invalid_argument);
  }

  TEST_CASE("a reader is a pipeline source: every id once per epoch, with several epochs" * doctest::timeout(60)) {
    auto pool = BufferPool::create();
    SyntheticSource reader({.shape = {1, 1, 8, 8, false}, .count = 1000},
                           {.shard_index = 1, .num_shards = 2, .pool = pool});
    auto pipe = PipelineBuilder{}
                    .threads(2)
                    .epochs(3)
                    .source("read", reader, {.queue = 8})
                    .map("id", [](Sample s) { return s.id; }, {.threads = 2, .queue = 8})
                    .build();
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::vector<std::uint64_t> ids;
      for (auto id : pipe.epoch()) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      std::vector<std::uint64_t> expected(500);
      for (std::uint64_t i = 0; i < 500; ++i) expected[i] = 2 * i + 1;
      CHECK(ids == expected);
    }
    CHECK(pool->reuses() > 0);  // the steady state recycles sample storage
  }
}

TEST_SUITE("Fashion-MNIST") {
  TEST_CASE("the real data set, when installed: 60,000 train and 10,000 test images, 3 shards" *
            doctest::timeout(120)) {
    if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz")) {
      MESSAGE("skipped: Fashion-MNIST is not installed in " << kFashionMnistDir
                                                            << " (Debian package dataset-fashion-mnist)");
      return;
    }
    auto train = std::make_shared<const IdxDataset>(fashion_mnist());
    REQUIRE(train->size() == 60'000);
    CHECK(train->shape() == Shape{1, 1, 28, 28, false});
    std::vector<int> per_class(10, 0);
    for (auto label : train->labels) {
      REQUIRE((label >= 0 && label <= 9));
      ++per_class[static_cast<std::size_t>(label)];
    }
    CHECK(std::all_of(per_class.begin(), per_class.end(), [](int c) { return c == 6000; }));

    std::vector<int> seen(train->size(), 0);
    for (std::uint32_t s = 0; s < 3; ++s) {
      IdxReader shard(train, {.shard_index = s, .num_shards = 3});
      CHECK(shard.size() == 20'000);
      std::uint64_t n = 0, wrong_labels = 0;
      while (auto sample = shard()) {
        REQUIRE(sample->id < seen.size());
        ++seen[sample->id];
        wrong_labels += sample->label != train->labels[sample->id];
        ++n;
      }
      CHECK(n == 20'000);
      CHECK(wrong_labels == 0);
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));

    const IdxDataset test = fashion_mnist(kFashionMnistDir, "t10k");
    CHECK(test.size() == 10'000);
    CHECK_THROWS_WITH_AS(fashion_mnist(kFashionMnistDir, "validation"), doctest::Contains("split"),
                         std::invalid_argument);
  }
}
