// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

#include "file_io.h"

namespace stoker {

namespace {

std::uint32_t load_be32(const std::byte* p) noexcept {
  return std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | std::uint32_t(p[3]);
}

std::string hex(std::uint32_t v, int digits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*X", digits, v);
  return text;
}

// Closes a zlib stream however gunzip() leaves.
struct InflateGuard {
  z_stream* zs;
  ~InflateGuard() { inflateEnd(zs); }
};

// The dimensions of an IDX file of unsigned bytes, and its data, after checking that the
// data is exactly as long as the dimensions say.
struct IdxView {
  std::array<std::uint32_t, 3> dims{};
  std::span<const std::byte> data;
};

// `kind` ("images", "labels") says in messages what the file should have held.
IdxView parse_idx(std::span<const std::byte> bytes, const std::string& name, std::size_t ndims, const char* kind) {
  constexpr std::uint32_t kUnsignedByte = 0x08;
  const std::uint32_t expected = kUnsignedByte << 8 | static_cast<std::uint32_t>(ndims);
  if (bytes.size() < 4) throw DataError(name, "too short for an IDX file (" + std::to_string(bytes.size()) + " bytes)");
  const std::uint32_t magic = load_be32(bytes.data());
  if (magic != expected) {
    std::string problem = "bad IDX magic " + hex(magic, 8) + ", expected " + hex(expected, 8) + " (unsigned bytes, " +
                          std::to_string(ndims) + " dimension" + (ndims == 1 ? "" : "s") + ") for an IDX " + kind +
                          " file";
    // The third byte is the element type: say so when that is the only thing wrong.
    if ((magic & 0xFFFF00FFu) == (expected & 0xFFFF00FFu))
      problem += "; element type " + hex((magic >> 8) & 0xFF, 2) + " is not supported, only unsigned bytes (0x08)";
    throw DataError(name, problem);
  }
  const std::size_t header = 4 + 4 * ndims;
  if (bytes.size() < header)
    throw DataError(name, "truncated IDX header: " + std::to_string(bytes.size()) + " bytes, the header needs " +
                              std::to_string(header));
  IdxView view;
  std::uint64_t total = 1;
  std::string dims_text;
  for (std::size_t d = 0; d < ndims; ++d) {
    view.dims[d] = load_be32(bytes.data() + 4 + 4 * d);
    // Three 32-bit factors may overflow 64 bits; such a file cannot be real anyway.
    if (!detail::checked_mul(total, view.dims[d], total)) throw DataError(name, "IDX dimensions overflow 64 bits");
    if (d) dims_text += 'x';
    dims_text += std::to_string(view.dims[d]);
  }
  const std::uint64_t present = bytes.size() - header;
  if (present < total)
    throw DataError(name, "truncated: the IDX header says " + dims_text + " = " + std::to_string(total) +
                              " bytes of data, only " + std::to_string(present) + " are present");
  if (present > total)
    throw DataError(name, std::to_string(present - total) + " unexpected bytes after the " + dims_text +
                              " IDX data the header describes");
  view.data = bytes.subspan(header);
  return view;
}

}  // namespace

bool is_gzip(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
}

std::vector<std::byte> gunzip(std::span<const std::byte> gz, const std::string& name) {
  // zlib counts in uInt (32 bits): feed and drain it in chunks that fit.
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  // Deflate cannot expand data more than about 1032:1. The size the gzip trailer records
  // (modulo 2^32) sizes the output in one go for real files; capping it by the ratio keeps
  // a forged trailer from allocating gigabytes up front.
  std::size_t expected = 0;
  if (gz.size() >= 4) {
    const auto* t = gz.data() + gz.size() - 4;
    expected = std::size_t(t[0]) | std::size_t(t[1]) << 8 | std::size_t(t[2]) << 16 | std::size_t(t[3]) << 24;
  }
  std::vector<std::byte> out(std::max<std::size_t>(std::min(expected, gz.size() * 1032), 1));

  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)  // 16 +: expect a gzip wrapper, check its CRC
    throw DataError(name, "zlib failed to initialise");
  InflateGuard guard{&zs};
  std::size_t consumed = 0, produced = 0;
  for (;;) {
    if (produced == out.size()) out.resize(out.size() * 2);
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(gz.data() + consumed));
    zs.avail_in = static_cast<uInt>(std::min(gz.size() - consumed, kChunk));
    zs.next_out = reinterpret_cast<Bytef*>(out.data() + produced);
    zs.avail_out = static_cast<uInt>(std::min(out.size() - produced, kChunk));
    const uInt in_before = zs.avail_in, out_before = zs.avail_out;
    const int ret = inflate(&zs, Z_NO_FLUSH);
    consumed += in_before - zs.avail_in;
    produced += out_before - zs.avail_out;

    if (ret == Z_STREAM_END) {
      if (consumed == gz.size()) break;
      // gzip files may be several members back to back (as `cat a.gz b.gz` makes).
      if (!is_gzip(gz.subspan(consumed)))
        throw DataError(name, std::to_string(gz.size() - consumed) + " bytes of garbage after the gzip data");
      inflateReset(&zs);
      continue;
    }
    if (ret == Z_MEM_ERROR) throw std::bad_alloc();
    if (ret != Z_OK && ret != Z_BUF_ERROR)
      throw DataError(name, std::string("corrupt gzip data: ") + (zs.msg ? zs.msg : "inflate failed"));
    // With all the input taken and room left for output, inflate is waiting for input
    // that is not there: the stream stops before its end marker.
    if (consumed == gz.size() && produced < out.size())
      throw DataError(name, "truncated gzip data: it ends after " + std::to_string(gz.size()) +
                                " bytes, before the end of the compressed stream");
  }
  out.resize(produced);
  return out;
}

IdxImages parse_idx_images(std::span<const std::byte> file, const std::string& name) {
  std::vector<std::byte> inflated;
  if (is_gzip(file)) file = inflated = gunzip(file, name);
  const IdxView view = parse_idx(file, name, 3, "images");
  if (view.dims[1] == 0 || view.dims[2] == 0)
    throw DataError(
        name, "images of " + std::to_string(view.dims[1]) + "x" + std::to_string(view.dims[2]) + " pixels are empty");
  IdxImages images{view.dims[0], view.dims[1], view.dims[2], {}};
  images.pixels.resize(view.data.size());
  if (!view.data.empty()) std::memcpy(images.pixels.data(), view.data.data(), view.data.size());
  return images;
}

std::vector<std::int32_t> parse_idx_labels(std::span<const std::byte> file, const std::string& name) {
  std::vector<std::byte> inflated;
  if (is_gzip(file)) file = inflated = gunzip(file, name);
  const IdxView view = parse_idx(file, name, 1, "labels");
  std::vector<std::int32_t> labels(view.data.size());
  std::transform(view.data.begin(), view.data.end(), labels.begin(), [](std::byte b) { return std::int32_t(b); });
  return labels;
}

IdxDataset load_idx(const std::filesystem::path& images, const std::filesystem::path& labels) {
  IdxDataset data;
  data.images = parse_idx_images(detail::read_file(images), images.string());
  data.labels = parse_idx_labels(detail::read_file(labels), labels.string());
  if (data.labels.size() != data.images.count)
    throw DataError(images.string(), "holds " + std::to_string(data.images.count) + " images but its labels file " +
                                         labels.string() + " holds " + std::to_string(data.labels.size()) + " labels");
  return data;
}

IdxDataset fashion_mnist(const std::filesystem::path& dir, std::string_view split) {
  if (split != "train" && split != "t10k")
    throw std::invalid_argument("fashion_mnist: split must be \"train\" or \"t10k\", got \"" + std::string(split) +
                                "\"");
  // The files as published (gzip), or unpacked: the gzip name when neither is there, so that
  // the error names the file the data set ships.
  const auto file = [&](const std::string& name) {
    const auto plain = dir / name, gzip = dir / (name + ".gz");
    return !std::filesystem::exists(gzip) && std::filesystem::exists(plain) ? plain : gzip;
  };
  const std::string s(split);
  return load_idx(file(s + "-images-idx3-ubyte"), file(s + "-labels-idx1-ubyte"));
}

IdxReader::IdxReader(IdxDataset data, ReaderOptions options)
    : IdxReader(std::make_shared<const IdxDataset>(std::move(data)), std::move(options)) {}

IdxReader::IdxReader(std::shared_ptr<const IdxDataset> data, ReaderOptions options) : Reader(std::move(options)) {
  if (!data) throw std::invalid_argument("IdxReader: no data set");
  // A hand-made IdxDataset may be inconsistent; read() must not view outside it.
  const auto& images = data->images;
  if (data->labels.size() != images.count ||
      images.pixels.size() != std::size_t{images.count} * images.height * images.width)
    throw std::invalid_argument("IdxReader: inconsistent data set: " + std::to_string(images.count) + " images of " +
                                std::to_string(images.height) + "x" + std::to_string(images.width) + " in " +
                                std::to_string(images.pixels.size()) + " bytes, with " +
                                std::to_string(data->labels.size()) + " labels");
  auto resident = std::make_shared<Resident>();
  resident->entries.resize(data->size());
  for (std::size_t i = 0; i < data->size(); ++i) {
    Sample& e = resident->entries[i];
    e.data = Buffer::view(std::as_bytes(data->image(i)));  // Resident keeps the data set alive
    e.shape = data->shape();
    e.dtype = DType::u8;
    e.label = data->labels[i];
    e.id = i;
  }
  resident->data = std::move(data);
  resident_ = std::move(resident);
}

Sample IdxReader::read(std::uint64_t id) const {
  check_id(id);
  return Sample::view(resident_->entries[id], resident_);
}

}  // namespace stoker
