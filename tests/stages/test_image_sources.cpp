// SPDX-License-Identifier: Apache-2.0
// Image data sets (list file, class folder, tar shards), the source that reads them, sharded and
// resumed, and bad files in a running pipeline.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "stages/image_support.h"
#include "stages/source_ids.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/tar.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;
namespace fs = std::filesystem;

namespace {

std::string text_of(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

void write_text(const fs::path& path, const std::string& text) {
  write_bytes(path, std::as_bytes(std::span(text.data(), text.size())));
}

// A small image whose bytes tell it from every other: a PNG of noise drawn from `i`.
std::vector<std::byte> image_bytes(std::uint32_t i) {
  auto pool = BufferPool::create();
  return i % 2 ? encode_jpeg(noise_image(*pool, 6 + i % 5, 7, 3, i), {.quality = 80})
               : encode_png(noise_image(*pool, 5, 4 + i % 7, 3, i));
}

// A data set of `n` images in three forms: a list file, a class folder, tar shards.
struct ImageFiles {
  TempDir dir{"images"};
  std::uint32_t n, classes;
  std::vector<std::vector<std::byte>> bytes;  // by id, in the list's order
  std::vector<std::int32_t> labels;

  explicit ImageFiles(std::uint32_t count, std::uint32_t class_count = 3) : n(count), classes(class_count) {
    std::string list;
    for (std::uint32_t i = 0; i < n; ++i) {
      bytes.push_back(image_bytes(i));
      labels.push_back(static_cast<std::int32_t>(i % classes));
      // Appended piece by piece: GCC 12 warns (-Wrestrict) at "literal" + std::to_string() here.
      std::string file = "c";
      file += std::to_string(i % classes);
      file += "/img";
      file += std::to_string(1000 + i);
      file += i % 2 ? ".jpg" : ".png";
      write_bytes(dir / ("folder/" + file), bytes.back());
      list += "folder/" + file + " " + std::to_string(labels.back()) + "\n";
    }
    write_text(dir / "list.txt", list);
  }

  // Tar shards of `per_shard` samples each, in list order; every other shard gets an index.
  std::vector<fs::path> tars(std::uint32_t per_shard) {
    std::vector<fs::path> shards;
    for (std::uint32_t first = 0; first < n; first += per_shard) {
      std::string name = "shards/part-";
      name += std::to_string(shards.size());
      shards.push_back(dir / (name + ".tar"));
      fs::create_directories(shards.back().parent_path());
      TarWriter tar(shards.back());
      for (std::uint32_t i = first; i < std::min(n, first + per_shard); ++i) {
        std::string key = "s";
        key += std::to_string(1000 + i);
        tar.add(key + (i % 2 ? ".jpg" : ".png"), bytes[i]);
        tar.add(key + ".cls", std::to_string(labels[i]));
      }
      tar.finish();
      if (shards.size() % 2 == 0) write_wds_index(wds_index_path(shards.back()), tar.members());
    }
    return shards;
  }
};

// What each rank's pipeline yields, epoch by epoch: ids.
std::vector<std::vector<std::uint64_t>> rank_ids(std::shared_ptr<const ImageDataset> data, ImageSourceOptions o,
                                                 std::uint64_t seed, std::uint32_t epochs) {
  return epoch_ids(ImageSource(std::move(data), std::move(o)), seed, epochs);
}

}  // namespace

TEST_CASE("a list file: paths relative to its folder, labels, blank lines, names with spaces") {
  TempDir dir("list");
  const auto a = image_bytes(1), b = image_bytes(2), c = image_bytes(3);
  write_bytes(dir / "data/a.jpg", a);
  write_bytes(dir / "data/with space.png", b);
  write_bytes(dir / "elsewhere/c.jpg", c);
  write_text(dir / "data/train.txt",
             "a.jpg 7\n\n   \r\n  with space.png\t 0  \r\n" + (dir / "elsewhere/c.jpg").string() + " 2147483647\n");
  const auto data = ImageDataset::open(dir / "data/train.txt");
  REQUIRE(data->size() == 3);
  CHECK(data->shards() == 1);
  CHECK(data->classes().empty());
  auto pool = BufferPool::create();
  const std::vector<std::tuple<std::string, std::int32_t, std::vector<std::byte>>> want = {
      {(dir / "data/a.jpg").string(), 7, a},
      {(dir / "data/with space.png").string(), 0, b},
      {(dir / "elsewhere/c.jpg").string(), 2147483647, c}};
  for (std::uint64_t id = 0; id < 3; ++id) {
    const EncodedImage e = data->read(id, *pool);
    CHECK(e.name == std::get<0>(want[id]));
    CHECK(data->name(id) == e.name);
    CHECK(e.label == std::get<1>(want[id]));
    CHECK(e.id == id);
    CHECK(text_of(e.bytes()) == text_of(std::get<2>(want[id])));
  }
  CHECK_THROWS_AS(data->read(3, *pool), std::out_of_range);
  // A missing file is the read's error, naming it.
  write_text(dir / "data/gone.txt", "nowhere.jpg 1\n");
  CHECK_THROWS_WITH_AS(ImageDataset::from_list(dir / "data/gone.txt")->read(0, *pool),
                       doctest::Contains("nowhere.jpg: cannot open"), DataError);
  // A byte order mark, as some editors write one, is not part of the first path.
  write_text(dir / "data/bom.txt",
             "\xef\xbb\xbf"
             "a.jpg 7\n");
  CHECK(ImageDataset::from_list(dir / "data/bom.txt")->name(0) == (dir / "data/a.jpg").string());
  // An image given where a list was expected is named as what it is, not as a line without a label.
  CHECK_THROWS_WITH_AS(ImageDataset::open(dir / "data/a.jpg"), doctest::Contains("it is a JPEG image"), DataError);
  write_bytes(dir / "data/blob.txt", std::vector<std::byte>{std::byte{'x'}, std::byte{0}, std::byte{'y'}});
  CHECK_THROWS_WITH_AS(ImageDataset::open(dir / "data/blob.txt"), doctest::Contains("it is binary"), DataError);
}

TEST_CASE("a malformed list is a DataError naming the list and the line") {
  TempDir dir("badlist");
  const std::pair<std::string, std::string> cases[] = {
      {"a.jpg 1\nb.jpg\n", "line 2: 'b.jpg' has no label: expected '<path> <label>'"},
      {"\n\na.jpg cat\n", "line 3: label 'cat' is not a whole number from 0 to 2147483647"},
      {"a.jpg -1\n", "line 1: label '-1' is not a whole number"},
      {"a.jpg 2147483648\n", "line 1: label '2147483648' is not a whole number"},
      {"a.jpg 1.5\n", "line 1: label '1.5' is not a whole number"},
      {"\n  \n", "the list names no image"},
  };
  for (const auto& [text, message] : cases) {
    CAPTURE(text);
    write_text(dir / "l.txt", text);
    const std::string prefix = (dir / "l.txt").string() + ": " + message;
    CHECK_THROWS_WITH_AS(ImageDataset::from_list(dir / "l.txt"), doctest::Contains(prefix.c_str()), DataError);
  }
  CHECK_THROWS_WITH_AS(ImageDataset::open(dir / "missing.txt"), doctest::Contains("missing.txt: does not exist"),
                       DataError);
}

TEST_CASE("a class folder: classes sorted by name are labels 0..n-1, files in ImageFolder's order, others left out") {
  TempDir dir("folder");
  const auto root = dir / "train";
  // Made out of order; sorted on reading.
  write_bytes(root / "zebra/b.jpg", image_bytes(1));
  write_bytes(root / "zebra/a.PNG", image_bytes(2));
  write_bytes(root / "zebra/sub/c.jpeg", image_bytes(3));
  write_bytes(root / "zebra/z.jpg", image_bytes(4));
  write_bytes(root / "zebra/sub/x/e.png", image_bytes(6));  // folders sorted by path, as
  write_bytes(root / "zebra/sub-b/d.jpg", image_bytes(7));  // sorted(os.walk): sub, sub-b, sub/x
  write_text(root / "zebra/notes.txt", "not an image");
  write_bytes(root / "ant/x.png", image_bytes(5));
  write_text(root / "README", "a file at the top is no class");
  const auto data = ImageDataset::open(root);
  CHECK(data->classes() == std::vector<std::string>{"ant", "zebra"});
  REQUIRE(data->size() == 7);
  // What torchvision's make_dataset() lists for this folder (checked with torchvision 0.14).
  const std::vector<std::pair<std::string, std::int32_t>> want = {
      {"ant/x.png", 0},        {"zebra/a.PNG", 1},       {"zebra/b.jpg", 1},      {"zebra/z.jpg", 1},
      {"zebra/sub/c.jpeg", 1}, {"zebra/sub-b/d.jpg", 1}, {"zebra/sub/x/e.png", 1}};
  auto pool = BufferPool::create();
  for (std::uint64_t id = 0; id < want.size(); ++id) {
    const EncodedImage e = data->read(id, *pool);
    CHECK(e.name == (root / want[id].first).string());
    CHECK(e.label == want[id].second);
  }
  fs::create_directories(root / "empty");
  CHECK_THROWS_WITH_AS(ImageDataset::from_folder(root), doctest::Contains("class 'empty' has no image"), DataError);
  CHECK_THROWS_WITH_AS(ImageDataset::from_folder(root / "ant"), doctest::Contains("has no class subfolder"), DataError);
}

TEST_CASE("class folders: links are followed, a loop of them or a dangling one is a DataError naming it") {
  TempDir dir("links");
  const auto root = dir / "train";
  write_bytes(root / "c0/a.jpg", image_bytes(1));
  write_bytes(dir / "elsewhere/b.jpg", image_bytes(2));
  fs::create_directory_symlink(dir / "elsewhere", root / "c0/more");
  const auto data = ImageDataset::open(root);
  REQUIRE(data->size() == 2);
  auto pool = BufferPool::create();
  CHECK(data->read(1, *pool).name == (root / "c0/more/b.jpg").string());

  // One link to its own folder made the walk list a.jpg 41 times; two, 2^40 folders (a hang).
  for (const int links : {1, 2}) {
    CAPTURE(links);
    for (int i = 1; i <= links; ++i) fs::create_directory_symlink(".", root / ("c0/s" + std::to_string(i)));
    CHECK_THROWS_WITH_AS(ImageDataset::open(root),
                         doctest::Contains(((root / "c0/s1").string() + ": is a loop of symbolic links").c_str()),
                         DataError);
    for (int i = 1; i <= links; ++i) fs::remove(root / ("c0/s" + std::to_string(i)));
  }
  fs::create_directory_symlink("../c1", root / "c0/up");  // c1 links back to c0: a loop through two
  fs::create_directory_symlink("c0", root / "c1");
  CHECK_THROWS_WITH_AS(ImageDataset::open(root), doctest::Contains("is a loop of symbolic links"), DataError);
  fs::remove(root / "c0/up");
  fs::remove(root / "c1");

  fs::create_symlink(dir / "nothing", root / "c0/notes.txt");  // no image: left out, as ImageFolder does
  CHECK(ImageDataset::open(root)->size() == 2);
  fs::create_symlink(dir / "nothing.jpg", root / "c0/gone.jpg");
  CHECK_THROWS_WITH_AS(
      ImageDataset::open(root),
      doctest::Contains(((root / "c0/gone.jpg").string() + ": cannot tell a file from a folder").c_str()), DataError);
}

// Without O_NONBLOCK, open() of a FIFO waits for a writer that never comes (ctest's TIMEOUT).
TEST_CASE("a list entry that is a FIFO is refused as not a regular file, without waiting for a writer") {
  TempDir dir("fifo");
  REQUIRE(::mkfifo((dir / "pipe.jpg").c_str(), 0600) == 0);
  write_bytes(dir / "ok.jpg", image_bytes(1));
  write_text(dir / "list.txt", "ok.jpg 0\npipe.jpg 1\n");
  const auto data = ImageDataset::open(dir / "list.txt");
  auto pool = BufferPool::create();
  CHECK(data->read(0, *pool).label == 0);
  CHECK_THROWS_WITH_AS(data->read(1, *pool),
                       doctest::Contains(((dir / "pipe.jpg").string() + ": is not a regular file").c_str()), DataError);
}

TEST_CASE("tar shards: samples by key, labels from .cls, with or without an index, long names, GNU tar's archives") {
  ImageFiles files(9);
  const auto shards = files.tars(4);  // 4 + 4 + 1 samples; shard 1 has an index
  REQUIRE(shards.size() == 3);
  CHECK(fs::exists(wds_index_path(shards[1])));
  CHECK(!fs::exists(wds_index_path(shards[0])));
  const auto data = ImageDataset::from_tars(shards);
  REQUIRE(data->size() == 9);
  CHECK(data->shards() == 3);
  CHECK(data->shard_begin(1) == 4);
  CHECK(data->shard_begin(3) == 9);
  auto pool = BufferPool::create();
  for (std::uint64_t id = 0; id < 9; ++id) {
    const EncodedImage e = data->read(id, *pool);
    CHECK(e.label == files.labels[id]);
    CHECK(text_of(e.bytes()) == text_of(files.bytes[id]));
    CHECK(e.name == shards[id / 4].string() + ":s" + std::to_string(1000 + id) + (id % 2 ? ".jpg" : ".png"));
  }

  SUBCASE("the index is DALI's wds2idx format, read back as the archive lists it") {
    const auto members = list_tar(shards[1]);
    REQUIRE(members.size() == 8);
    const auto index = read_bytes(wds_index_path(shards[1]));
    std::string want = "v1.2 4\n";
    for (std::size_t i = 0; i < 8; i += 2) {
      const auto line = [&](const TarMember& m) {
        return std::string(split_wds_name(m.name).second) + " " + std::to_string(m.offset) + " " +
               std::to_string(m.size) + " " + m.name;
      };
      want += line(members[i]) + " " + line(members[i + 1]) + "\n";
    }
    CHECK(text_of(index) == want);
    CHECK(read_wds_index(wds_index_path(shards[1])) == members);
    CHECK(members[0].offset == 512);
  }
  SUBCASE("long member names go in pax headers") {
    const std::string key = "deep/" + std::string(150, 'k');
    const auto path = files.dir / "long.tar";
    TarWriter tar(path);
    tar.add(key + ".png", files.bytes[0]);
    tar.add(key + ".cls", "5");
    tar.finish();
    const auto long_data = ImageDataset::from_tars({path});
    REQUIRE(long_data->size() == 1);
    const EncodedImage e = long_data->read(0, *pool);
    CHECK(e.name == path.string() + ":" + key + ".png");
    CHECK(e.label == 5);
    CHECK(text_of(e.bytes()) == text_of(files.bytes[0]));
  }
  SUBCASE("an archive GNU tar made, with a name over 100 bytes") {
    if (std::system("tar --version > /dev/null 2>&1") != 0) {
      MESSAGE("skipped: no tar program on this machine");
      return;
    }
    const auto src = files.dir / "gnu";
    const std::string key = std::string(120, 'g');
    write_bytes(src / (key + ".jpg"), files.bytes[1]);
    write_text(src / (key + ".cls"), "2\n");
    write_bytes(src / "b.png", files.bytes[2]);
    write_text(src / "b.cls", "1");
    const auto archive = files.dir / "gnu.tar";
    const std::string command = "tar --format=gnu -C '" + src.string() + "' -cf '" + archive.string() + "' " + key +
                                ".cls " + key + ".jpg b.png b.cls";
    REQUIRE(std::system(command.c_str()) == 0);
    const auto gnu = ImageDataset::from_tars({archive});
    REQUIRE(gnu->size() == 2);
    const EncodedImage first = gnu->read(0, *pool);
    CHECK(first.name == archive.string() + ":" + key + ".jpg");
    CHECK(first.label == 2);
    CHECK(text_of(first.bytes()) == text_of(files.bytes[1]));
    CHECK(gnu->read(1, *pool).label == 1);
  }
  SUBCASE("an index older than its shard is not trusted") {
    const auto members = list_tar(shards[0]);
    std::vector<TarMember> wrong = members;
    for (auto& m : wrong) m.offset += 512;  // would read the wrong bytes
    write_wds_index(wds_index_path(shards[0]), wrong);
    fs::last_write_time(wds_index_path(shards[0]), fs::last_write_time(shards[0]) - std::chrono::hours(1));
    CHECK(text_of(ImageDataset::from_tars({shards[0]})->read(0, *pool).bytes()) == text_of(files.bytes[0]));
  }
  // offset + size wrapped around and passed the bounds check: the pool then rounded the size
  // up to a few bytes, and only pread's address check stopped a heap overwrite.
  SUBCASE("an index entry past any file's end is refused, and no pool hands out a wrapped size") {
    const auto index = wds_index_path(shards[0]);
    write_text(index, "v1.2 1\njpg 512 18446744073709551500 a.jpg cls 1024 1 a.cls\n");
    fs::last_write_time(index, fs::last_write_time(shards[0]) + std::chrono::hours(1));
    CHECK_THROWS_WITH_AS(ImageDataset::from_tars({shards[0]}),
                         doctest::Contains((index.string() + ": line 2: member a.jpg at offset 512 claims").c_str()),
                         DataError);
    CHECK_THROWS_AS(pool->acquire(SIZE_MAX - 100), std::length_error);
    CHECK_THROWS_AS(pool->acquire(SIZE_MAX / 2 + 1), std::length_error);
  }
  SUBCASE("bad shards are a DataError naming the shard") {
    const auto bad = files.dir / "bad.tar";
    {
      TarWriter tar(bad);
      tar.add("a.jpg", files.bytes[1]);
      tar.finish();
    }
    CHECK_THROWS_WITH_AS(ImageDataset::from_tars({bad}), (bad.string() + ": sample 'a' has no label (.cls)").c_str(),
                         DataError);
    {
      TarWriter tar(bad);
      tar.add("a.cls", "1");
      tar.finish();
    }
    CHECK_THROWS_WITH_AS(ImageDataset::from_tars({bad}), doctest::Contains("sample 'a' has no image"), DataError);
    {  // members that are no sample at all are left out
      TarWriter tar(bad);
      tar.add("__meta__.json", "{}");
      tar.add("a.jpg", files.bytes[1]);
      tar.add("a.cls", "1");
      tar.add("README", "text");
      tar.finish();
    }
    CHECK(ImageDataset::from_tars({bad})->size() == 1);
    {
      TarWriter tar(bad);
      tar.add("a.jpg", files.bytes[1]);
      tar.add("a.png", files.bytes[2]);
      tar.add("a.cls", "1");
      tar.finish();
    }
    CHECK_THROWS_WITH_AS(ImageDataset::from_tars({bad}), doctest::Contains("sample 'a' has two images"), DataError);
    {
      TarWriter tar(bad);
      tar.add("a.jpg", files.bytes[1]);
      tar.add("a.cls", "one");
      tar.finish();
    }
    CHECK_THROWS_WITH_AS(ImageDataset::from_tars({bad})->read(0, *pool),
                         doctest::Contains("a.jpg: its .cls label 'one' is not a whole number"), DataError);
    const auto second = list_tar(shards[0])[1].offset - 512;  // the second member's header
    auto damaged = read_bytes(shards[0]);
    damaged[second + 100] ^= std::byte{1};
    write_bytes(bad, damaged);
    CHECK_THROWS_WITH_AS(
        list_tar(bad),
        (bad.string() + ": bad tar header checksum at offset " + std::to_string(second) + " (the archive is damaged)")
            .c_str(),
        DataError);
    const auto whole_shard = read_bytes(shards[0]);
    write_bytes(bad, std::span(whole_shard).first(700));
    CHECK_THROWS_WITH_AS(list_tar(bad), doctest::Contains("truncated tar archive"), DataError);
    write_text(bad, std::string(2048, 'x'));
    CHECK_THROWS_WITH_AS(list_tar(bad), doctest::Contains("at offset 0 (is this a tar archive?)"), DataError);
  }
}

TEST_CASE(
    "ImageSource: over 1 to 3 ranks, in every order and every form, each image reaches exactly one rank per epoch" *
    doctest::timeout(120)) {
  ImageFiles files(23, 4);  // 23: divides by none of 2, 3
  const std::vector<std::pair<const char*, std::shared_ptr<const ImageDataset>>> forms = {
      {"list", ImageDataset::open(files.dir / "list.txt")},
      {"folder", ImageDataset::open(files.dir / "folder")},
      {"tar", ImageDataset::from_tars(files.tars(5))}};
  for (const auto& [form, data] : forms) {
    for (const auto order : {ImageOrder::shuffle, ImageOrder::shards, ImageOrder::fixed}) {
      for (const auto remainder : {Remainder::drop, Remainder::pad}) {
        for (std::uint32_t world = 1; world <= 3; ++world) {
          CAPTURE(form);
          CAPTURE(int(order));
          CAPTURE(remainder == Remainder::drop);
          CAPTURE(world);
          std::vector<std::map<std::uint64_t, int>> seen(2);
          std::vector<std::vector<std::uint64_t>> rank0;
          for (std::uint32_t rank = 0; rank < world; ++rank) {
            const ImageSourceOptions o{.shard = {.rank = rank, .world = world, .remainder = remainder}, .order = order};
            const auto run = rank_ids(data, o, 5, 2);
            REQUIRE(run.size() == 2);
            const ImageSource source(data, o);
            for (std::size_t e = 0; e < 2; ++e) {
              CHECK(run[e].size() == source.size());
              CHECK(run[e].size() == (remainder == Remainder::drop ? 23 / world : (23 + world - 1) / world));
              for (std::size_t k = 0; k < run[e].size(); ++k) {
                CHECK(run[e][k] == source.id_at(5, static_cast<std::uint32_t>(e), k));
                ++seen[e][run[e][k]];
              }
            }
            if (rank == 0) rank0 = run;
          }
          for (std::size_t e = 0; e < 2; ++e) {
            std::size_t once = 0, twice = 0;
            for (const auto& [id, times] : seen[e]) {
              REQUIRE(id < 23);
              REQUIRE(times <= 2);
              (times == 1 ? once : twice) += 1;
            }
            if (remainder == Remainder::drop) {
              CHECK(twice == 0);
              CHECK(once == 23 - 23 % world);
            } else {
              CHECK(once + twice == 23);
              CHECK(twice == (world - 23 % world) % world);
            }
          }
          if (order == ImageOrder::fixed) {
            CHECK(rank0[0] == rank0[1]);
            for (std::size_t k = 0; k < rank0[0].size(); ++k) CHECK(rank0[0][k] == (k * world) % 23);
          } else if (order == ImageOrder::shuffle || std::string(form) == "tar") {
            CHECK(rank0[0] != rank0[1]);  // a new order every epoch
          }
          if (order == ImageOrder::shards && world == 1 && std::string(form) == "tar") {
            // Each shard read front to back, one after another: 5 shards, 5 runs.
            const auto& ids = rank0[0];
            std::size_t changes = 0;
            for (std::size_t k = 1; k < ids.size(); ++k) {
              if (ids[k] / 5 == ids[k - 1] / 5)
                CHECK(ids[k] == ids[k - 1] + 1);
              else
                ++changes;
            }
            CHECK(changes == 4);
          }
        }
      }
    }
  }
  CHECK_THROWS_WITH_AS(ImageSource(forms[0].second, {.shard = {.rank = 3, .world = 3}}),
                       "ImageSource: rank 3 is out of range for world 3", std::invalid_argument);
}

TEST_CASE(
    "ImageSource resume_at with first_epoch: the rest of a cut epoch, dealt to another number of ranks, is every "
    "image the uninterrupted epoch had still to give, once; the epochs after are whole" *
    doctest::timeout(120)) {
  ImageFiles files(23, 4);
  const auto data = ImageDataset::open(files.dir / "list.txt");
  const auto whole = rank_ids(data, {}, 5, 3);  // one rank: epochs 0, 1 and 2 in their order
  for (const auto remainder : {Remainder::drop, Remainder::pad}) {
    for (const std::uint64_t taken : {std::uint64_t{0}, std::uint64_t{6}, std::uint64_t{22}}) {
      for (std::uint32_t world = 1; world <= 4; ++world) {
        CAPTURE(remainder == Remainder::drop);
        CAPTURE(taken);
        CAPTURE(world);
        std::map<std::uint64_t, int> rest;  // epoch 1 after the cut, over every rank
        for (std::uint32_t rank = 0; rank < world; ++rank) {
          const ImageSourceOptions o{.shard = {.rank = rank, .world = world, .remainder = remainder},
                                     .resume_at = EpochCut{.epoch = 1, .taken = taken}};
          const ImageSource source(data, o);
          auto pipe = PipelineBuilder{}
                          .seed(5)
                          .deterministic()
                          .first_epoch(1)
                          .epochs(3)
                          .threads(2)
                          .source("read", source)
                          .map("id", [](EncodedImage e) { return e.id; }, {.threads = 2})
                          .build();
          CHECK(pipe.current_epoch() == 1);
          std::vector<std::vector<std::uint64_t>> ids;
          for (auto epoch : pipe.epochs()) {
            ids.emplace_back();
            for (auto id : epoch) ids.back().push_back(id);
          }
          REQUIRE(ids.size() == 2);  // epochs 1 and 2
          CHECK(ids[0].size() == source.size_of(1));
          CHECK(ids[0].size() == o.shard.per_rank(23 - taken));
          for (std::size_t k = 0; k < ids[0].size(); ++k) {
            CHECK(ids[0][k] == source.id_at(5, 1, k));
            ++rest[ids[0][k]];
          }
          // The next epoch is whole, as the rank's share of an uninterrupted one.
          CHECK(ids[1] == rank_ids(data, {.shard = o.shard}, 5, 3)[2]);
        }
        // The rest: the uninterrupted epoch's order from `taken` on, each once (and for pad, a
        // few of the rest's first again), but for what does not divide (drop).
        std::map<std::uint64_t, int> expected;
        const std::uint64_t left = 23 - taken;
        const std::uint64_t used = remainder == Remainder::drop ? left - left % world : left;
        for (std::uint64_t j = taken; j < taken + used; ++j) ++expected[whole[1][j]];
        if (remainder == Remainder::pad)
          for (std::uint64_t j = 0; j < (world - left % world) % world; ++j) ++expected[whole[1][taken + j % left]];
        CHECK(rest == expected);
      }
    }
  }
  CHECK_THROWS_WITH_AS(ImageSource(data, {.resume_at = EpochCut{.epoch = 0, .taken = 23}}),
                       doctest::Contains("resume_at.taken (23) leaves nothing"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      PipelineBuilder{}.first_epoch(1).resume_from(PipelineState{}).source("read", ImageSource(data)).build(),
      doctest::Contains("first_epoch and resume_from"), std::invalid_argument);
  // Starting past the last epoch is a run already over.
  auto over = PipelineBuilder{}.first_epoch(3).epochs(3).source("read", ImageSource(data)).build();
  CHECK_FALSE(over.next().has_value());
  CHECK(over.finished());
}

TEST_CASE("ImageSource and ShuffledShard with more ranks than twice the images: every rank gets real images" *
          doctest::timeout(60)) {
  ImageFiles files(3, 1);
  const auto data = ImageDataset::open(files.dir / "list.txt");
  for (const auto order : {ImageOrder::shuffle, ImageOrder::fixed}) {
    std::map<std::uint64_t, int> seen;
    for (std::uint32_t rank = 0; rank < 7; ++rank) {
      const auto ids =
          rank_ids(data, {.shard = {.rank = rank, .world = 7, .remainder = Remainder::pad}, .order = order}, 5, 1);
      REQUIRE(ids.size() == 1);
      REQUIRE(ids[0].size() == 1);
      ++seen[ids[0][0]];
    }
    CHECK(seen.size() == 3);  // each image, some of them more than once
    CHECK(seen.rbegin()->first < 3);
  }
}

TEST_CASE("an image pipeline resumes mid-epoch: exactly in deterministic order, every image once in free order" *
          doctest::timeout(120)) {
  ImageFiles files(40);
  const auto shards = files.tars(6);
  for (const bool deterministic : {true, false}) {
    for (const auto order : {ImageOrder::shuffle, ImageOrder::shards}) {
      CAPTURE(deterministic);
      CAPTURE(int(order));
      const auto data = ImageDataset::from_tars(shards);
      using Item = std::pair<std::uint64_t, std::uint64_t>;  // id, a sum of the decoded pixels
      auto build = [&](const std::optional<PipelineState>& resume) {
        auto b = PipelineBuilder{}
                     .seed(11)
                     .deterministic(deterministic)
                     .epochs(2)
                     .threads(3)
                     .source("read", ImageSource(data, {.shard = {.rank = 1, .world = 2}, .order = order}))
                     .map("decode", ImageDecoder(), {.threads = 2})
                     .map("sum",
                          [](Sample s) {
                            std::uint64_t sum = 0;
                            for (const auto v : pixels(s)) sum += v;
                            return Item{s.id, sum};
                          })
                     .shuffle("shuffle", {.capacity = 8, .min_after_dequeue = 4});
        if (resume) b.resume_from(*resume);
        return b.batch("batch", 3).build();
      };
      auto whole = build(std::nullopt);
      std::vector<std::vector<std::vector<Item>>> all;  // per epoch
      for (auto epoch : whole.epochs()) {
        all.emplace_back();
        for (auto& batch : epoch) all.back().push_back(batch);
      }
      REQUIRE(all.size() == 2);
      auto stopped = build(std::nullopt);
      std::vector<Item> taken;
      for (int i = 0; i < 4; ++i) {  // mid-epoch 0
        const auto batch = stopped.next();
        REQUIRE(batch);
        taken.insert(taken.end(), batch->begin(), batch->end());
      }
      const PipelineState state = stopped.state();
      stopped.stop();
      auto resumed = build(state);
      std::vector<Item> rest0;
      while (auto batch = resumed.next()) rest0.insert(rest0.end(), batch->begin(), batch->end());
      std::vector<Item> everything0;
      for (const auto& b : all[0]) everything0.insert(everything0.end(), b.begin(), b.end());
      REQUIRE(everything0.size() == 20);  // rank 1 of 2, of 40 images
      if (deterministic) {
        CHECK(std::vector<Item>(everything0.begin() + 12, everything0.end()) == rest0);
      } else {  // what was taken and what the resumed run yields: every image of the epoch, once
        taken.insert(taken.end(), rest0.begin(), rest0.end());
        std::sort(taken.begin(), taken.end());
        std::sort(everything0.begin(), everything0.end());
        CHECK(taken == everything0);
      }
      // The next epoch goes on as the run that never stopped.
      std::vector<Item> epoch1, want1;
      while (auto batch = resumed.next()) epoch1.insert(epoch1.end(), batch->begin(), batch->end());
      for (const auto& b : all[1]) want1.insert(want1.end(), b.begin(), b.end());
      if (deterministic)
        CHECK(epoch1 == want1);
      else
        CHECK(std::multiset<Item>(epoch1.begin(), epoch1.end()) == std::multiset<Item>(want1.begin(), want1.end()));
    }
  }
}

TEST_CASE("bad files in a running pipeline: skipped and counted with on_error = skip, named with fail" *
          doctest::timeout(60)) {
  TempDir dir("badrun");
  std::string list;
  for (std::uint32_t i = 0; i < 12; ++i) {
    write_bytes(dir / ("ok" + std::to_string(i) + ".jpg"), image_bytes(2 * i + 1));
    list += "ok" + std::to_string(i) + ".jpg " + std::to_string(i) + "\n";
  }
  const auto jpeg = image_bytes(3);
  write_bytes(dir / "empty.jpg", {});
  write_bytes(dir / "half.jpg", std::span(jpeg).first(jpeg.size() / 2));
  write_text(dir / "text.jpg", "not an image at all");
  list += "empty.jpg 1\nhalf.jpg 2\nmissing.jpg 3\ntext.jpg 4\n";
  write_text(dir / "list.txt", list);
  const auto data = ImageDataset::open(dir / "list.txt");
  REQUIRE(data->size() == 16);

  auto skipping = PipelineBuilder{}
                      .seed(1)
                      .epochs(2)
                      .threads(2)
                      .source("read", ImageSource(data), {.on_error = OnError::skip})
                      .map("decode", ImageDecoder(), {.threads = 2, .on_error = OnError::skip})
                      .build();
  std::multiset<std::int32_t> labels;
  for (auto epoch : skipping.epochs())
    for (auto& s : epoch) {
      CHECK(s.shape.channels == 3);
      labels.insert(s.label);
    }
  CHECK(labels.size() == 24);  // 12 good images, two epochs
  for (std::int32_t i = 0; i < 12; ++i) CHECK(labels.count(i) == 2);
  const auto summary = skipping.summary();
  const auto stage = [&](const std::string& name) {
    return *std::find_if(summary.stages.begin(), summary.stages.end(),
                         [&](const StageStats& s) { return s.name == name; });
  };
  CHECK(stage("read").skipped == 2);    // the missing file, twice
  CHECK(stage("decode").skipped == 6);  // empty, truncated, not an image; twice

  auto failing =
      PipelineBuilder{}
          .seed(1)
          .source("read", ImageSource(ImageDataset::from_list(dir / "list.txt"), {.order = ImageOrder::fixed}),
                  {.on_error = OnError::skip})
          .map("decode", ImageDecoder())
          .build();
  try {
    while (failing.next()) {
    }
    FAIL("no error");
  } catch (const StageError& e) {
    CHECK(e.stage() == "decode");
    CHECK_MESSAGE(std::string(e.what()).find((dir / "empty.jpg").string() + ": empty file") != std::string::npos,
                  e.what());
  }
}

TEST_CASE("a subset of a data set: the images asked for, renumbered, read as before; its shards those it uses") {
  ImageFiles files(20);
  auto pool = BufferPool::create();
  const std::vector<std::uint64_t> ids{1, 2, 7, 12, 13, 19};
  for (const auto& data : {ImageDataset::open(files.dir / "list.txt"), ImageDataset::open(files.dir / "folder"),
                           ImageDataset::from_tars(files.tars(5))}) {
    CAPTURE(data->fingerprint());
    const auto part = data->subset(ids);
    REQUIRE(part->size() == ids.size());
    CHECK(part->classes() == data->classes());
    CHECK(part->fingerprint() != data->fingerprint());
    for (std::uint64_t k = 0; k < ids.size(); ++k) {
      CHECK(part->name(k) == data->name(ids[k]));
      const auto want = data->read(ids[k], *pool), got = part->read(k, *pool);
      CHECK(got.label == want.label);
      CHECK(got.id == k);
      CHECK(text_of(got.bytes()) == text_of(want.bytes()));
    }
    if (data->shards() > 1) {  // shards of 5: ids 1 2 | 7 | 12 13 | 19, every shard used
      REQUIRE(part->shards() == 4);
      CHECK(part->shard_begin(1) == 2);
      CHECK(part->shard_begin(2) == 3);
      CHECK(part->shard_begin(3) == 5);
      CHECK(data->subset(std::vector<std::uint64_t>{0, 16})->shards() == 2);  // the empty ones left out
    } else {
      CHECK(part->shards() == 1);
    }
    CHECK_THROWS_WITH_AS(data->subset(std::vector<std::uint64_t>{3, 3}), doctest::Contains("does not follow 3"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(data->subset(std::vector<std::uint64_t>{20}), doctest::Contains("is not below"),
                         std::invalid_argument);
    CHECK_THROWS_AS(data->subset({}), std::invalid_argument);
  }
}

TEST_CASE("a file over the size limit is a DataError naming it, refused before anything is read or allocated") {
  TempDir dir("big");
  write_bytes(dir / "ok.jpg", image_bytes(1));
  // 300 MiB, sparse: over the default limit of 256 MiB without taking the disk.
  { std::ofstream(dir / "huge.jpg"); }
  fs::resize_file(dir / "huge.jpg", std::uint64_t{300} << 20);
  write_text(dir / "list.txt", "ok.jpg 0\nhuge.jpg 1\n");
  auto pool = BufferPool::create();
  ImageSource source(ImageDataset::open(dir / "list.txt"), {.order = ImageOrder::fixed, .pool = pool});
  CHECK(source(StageContext{.index = 0}));
  const auto allocations = pool->allocations();
  CHECK_THROWS_WITH_AS(
      source(StageContext{.index = 1}),
      doctest::Contains(((dir / "huge.jpg").string() + ": holds 314572800 bytes, over the limit of 268435456 "
                                                       "(ImageSourceOptions::max_file_bytes): not read")
                            .c_str()),
      DataError);
  CHECK(pool->allocations() == allocations);
  // The limit is the caller's: at the size of ok.jpg it passes, one byte under it is refused.
  const auto size = fs::file_size(dir / "ok.jpg");
  ImageSource exact(ImageDataset::open(dir / "list.txt"), {.max_file_bytes = size, .order = ImageOrder::fixed});
  CHECK(exact(StageContext{.index = 0}));
  ImageSource under(ImageDataset::open(dir / "list.txt"), {.max_file_bytes = size - 1, .order = ImageOrder::fixed});
  CHECK_THROWS_WITH_AS(under(StageContext{.index = 0}), doctest::Contains("over the limit of"), DataError);
}

TEST_CASE("files of many sizes recycle one another's buffers, and each keeps its exact size") {
  TempDir dir("sizes");
  std::string list;
  const std::uint32_t n = 200;
  for (std::uint32_t i = 0; i < n; ++i) {  // 200 sizes, none the same
    const std::string name = std::to_string(i) + ".bin";
    write_text(dir / name, std::string(1000 + 37 * i, static_cast<char>('a' + i % 26)));
    list += name + " 0\n";
  }
  write_text(dir / "list.txt", list);
  auto pool = BufferPool::create();
  ImageSource source(ImageDataset::open(dir / "list.txt"), {.order = ImageOrder::fixed, .pool = pool});
  for (std::uint32_t i = 0; i < n; ++i) {
    const auto e = source(StageContext{.index = i});
    REQUIRE(e);
    CHECK(e->data.size() == 1000 + 37 * i);
    CHECK(text_of(e->bytes()) == std::string(1000 + 37 * i, static_cast<char>('a' + i % 26)));
  }
  // Each buffer went back before the next was read: sizes within 1/8 of each other share one.
  CHECK(pool->allocations() < n / 4);
  CHECK(pool->reuses() + pool->allocations() == n);
}
