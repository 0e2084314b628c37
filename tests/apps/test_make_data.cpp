// SPDX-License-Identifier: Apache-2.0
// stoker-make-data: what it writes (through the generator's own code), and its command line.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>

#include "make_data.h"
#include "stages/image_support.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;
namespace fs = std::filesystem;

namespace {

// Runs a command; returns its exit status and what it wrote on stdout and stderr.
struct Ran {
  int status = -1;
  std::string out, err;
};
Ran run(const std::string& args, const fs::path& scratch) {
  const auto out = scratch / "out.txt", err = scratch / "err.txt";
  const std::string command =
      std::string(STOKER_MAKE_DATA) + " " + args + " > '" + out.string() + "' 2> '" + err.string() + "'";
  const int raw = std::system(command.c_str());
  Ran r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  const auto text = [](const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  r.out = text(out);
  r.err = text(err);
  return r;
}

std::string last_line(const std::string& text) {
  const auto end = text.find_last_not_of('\n');
  const auto begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

bool is_progressive(std::span<const std::byte> jpeg) {  // a SOF2 marker
  for (std::size_t i = 0; i + 1 < jpeg.size(); ++i)
    if (jpeg[i] == std::byte{0xFF} && jpeg[i + 1] == std::byte{0xC2}) return true;
  return false;
}

}  // namespace

TEST_CASE("the ImageNet-like data: JPEGs of the sizes asked for, a list, a class folder and tar shards that agree" *
          doctest::timeout(120)) {
  TempDir dir("inet");
  const apps::ImageNetLikeOptions o{.images = 40,
                                    .classes = 4,
                                    .min_side = 40,
                                    .max_side = 90,
                                    .progressive = 0.3,
                                    .gray = 0.2,
                                    .tar_shards = 3,
                                    .seed = 5,
                                    .threads = 2};
  const auto made = apps::make_imagenet_like(dir.path(), o);
  CHECK(made.images == 40);
  REQUIRE(made.lists.size() == 1);
  REQUIRE(made.shards.size() == 3);
  const auto list = ImageDataset::open(made.lists[0]);
  const auto folder = ImageDataset::open(dir / "train");
  const auto tars = ImageDataset::from_tars(made.shards);
  REQUIRE(list->size() == 40);
  REQUIRE(folder->size() == 40);
  REQUIRE(tars->size() == 40);
  CHECK(folder->classes() == std::vector<std::string>{"class_000", "class_001", "class_002", "class_003"});
  auto pool = BufferPool::create();
  std::multiset<std::string> by_list, by_folder, by_tar;  // bytes and label of every image
  std::uint64_t progressive = 0, gray = 0;
  for (std::uint64_t id = 0; id < 40; ++id) {
    const EncodedImage e = list->read(id, *pool);
    CHECK(e.label == std::int32_t(id % 4));
    const ImageInfo info = read_image_info(e.bytes(), e.name);
    CHECK(info.format == ImageFormat::jpeg);
    CHECK(info.width >= 40);
    CHECK(info.width <= 90);
    CHECK(info.height >= 40);
    CHECK(info.height <= 90);
    progressive += is_progressive(e.bytes());
    gray += info.channels == 1;
    const Sample decoded = decode_image(e.bytes(), e.name, *pool);
    CHECK(decoded.shape.width == info.width);
    const auto key = [](const EncodedImage& x) {
      return std::to_string(x.label) + ":" + std::string(reinterpret_cast<const char*>(x.data.data()), x.data.size());
    };
    by_list.insert(key(e));
    by_folder.insert(key(folder->read(id, *pool)));
    by_tar.insert(key(tars->read(id, *pool)));
  }
  CHECK(by_folder == by_list);
  CHECK(by_tar == by_list);
  CHECK(progressive == made.progressive);
  CHECK(gray == made.gray);
  CHECK(progressive > 0);  // 30% of 40
  CHECK(gray > 0);
  // Every shard holds images of more than one class.
  for (std::uint32_t s = 0; s < 3; ++s) {
    std::set<std::int32_t> labels;
    for (std::uint64_t id = tars->shard_begin(s); id < tars->shard_begin(s + 1); ++id)
      labels.insert(tars->read(id, *pool).label);
    CHECK(labels.size() > 1);
  }

  SUBCASE("the same options write the same files, whatever the threads; another seed other files") {
    TempDir again("inet-again"), other("inet-other");
    auto o1 = o;
    o1.threads = 1;
    apps::make_imagenet_like(again.path(), o1);
    auto o2 = o;
    o2.seed = 6;
    apps::make_imagenet_like(other.path(), o2);
    std::size_t same = 0;
    for (const auto& entry : fs::recursive_directory_iterator(dir.path())) {
      if (!entry.is_regular_file()) continue;
      const auto relative = fs::relative(entry.path(), dir.path());
      CHECK(read_bytes(entry.path()) == read_bytes(again / relative.string()));
      if (relative.extension() == ".jpg" && fs::exists(other / relative.string()))
        same += read_bytes(entry.path()) == read_bytes(other / relative.string());
    }
    CHECK(same == 0);
  }
}

TEST_CASE("natural_image has the spectrum of a natural picture: most energy at low frequencies, but detail at all") {
  auto pool = BufferPool::create();
  const Sample image = apps::natural_image(*pool, 256, 256, 1, 3, 42);
  const auto p = pixels(image);
  // Mean absolute difference of pixels 1, 4 and 16 apart: it grows with distance (correlated
  // neighbours, as in photographs) but is not zero at 1 (fine texture, grain).
  const auto diff = [&](std::uint32_t d) {
    double sum = 0;
    for (std::uint32_t y = 0; y < 256; ++y)
      for (std::uint32_t x = 0; x + d < 256; ++x) sum += std::abs(int(p[y * 256 + x]) - int(p[y * 256 + x + d]));
    return sum / (256.0 * (256 - d));
  };
  const double d1 = diff(1), d4 = diff(4), d16 = diff(16);
  CAPTURE(d1);
  CAPTURE(d4);
  CAPTURE(d16);
  CHECK(d1 > 2);
  CHECK(d4 > d1);
  CHECK(d16 > 1.5 * d1);
}

TEST_CASE("Fashion-MNIST as PNG files: the IDX pixels and labels exactly, as a list and as class folders" *
          doctest::timeout(120)) {
  if (!fs::exists(fs::path(kFashionMnistDir) / "train-labels-idx1-ubyte.gz") &&
      !fs::exists(fs::path(kFashionMnistDir) / "train-labels-idx1-ubyte")) {
    MESSAGE("skipped: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)");
    return;
  }
  TempDir dir("fmnist");
  const auto made = apps::export_fashion_mnist(dir.path(), kFashionMnistDir, 100, 2);
  CHECK(made.images == 200);
  REQUIRE(made.lists.size() == 2);
  const IdxReader train(fashion_mnist(kFashionMnistDir, "train")), test(fashion_mnist(kFashionMnistDir, "t10k"));
  auto pool = BufferPool::create();
  for (const auto& [list, reader] : {std::pair{made.lists[0], &train}, std::pair{made.lists[1], &test}}) {
    const auto data = ImageDataset::open(list);
    REQUIRE(data->size() == 100);
    for (std::uint64_t id = 0; id < 100; ++id) {
      const EncodedImage e = data->read(id, *pool);
      const Sample want = reader->read(id);
      CHECK(e.label == want.label);
      const Sample got = decode_image(e.bytes(), e.name, *pool, {.color = ImageColor::gray});
      CHECK(got.shape == Shape{.channels = 1, .height = 28, .width = 28, .channels_last = true});
      CHECK(max_abs_diff(pixels(got), pixels(want)) == 0);
    }
  }
  // The class folders are named by label: read as ImageFolder reads them, the labels are the same.
  const auto folder = ImageDataset::open(dir / "train");
  CHECK(folder->size() == 100);
  REQUIRE(folder->classes().size() == 10);  // the first 100 images hold every class
  for (std::uint64_t id = 0; id < folder->size(); ++id) {
    const EncodedImage e = folder->read(id, *pool);
    CHECK(fs::path(e.name).parent_path().filename() == std::to_string(e.label));
  }
}

TEST_CASE("stoker-make-data's command line: --help, bad arguments, --json") {
  TempDir dir("make-data-cli");
  const auto help = run("--help", dir.path());
  CHECK(help.status == 0);
  CHECK(help.out.find("imagenet") != std::string::npos);
  const auto none = run("", dir.path());
  CHECK(none.status == 2);
  const auto bad = run("imagenet " + (dir / "x").string() + " --images 0", dir.path());
  CHECK(bad.status == 2);
  CHECK(bad.err == "stoker-make-data: --images: must be at least 1, got 0 (see stoker-make-data --help)\n");
  const auto sides = run("imagenet " + (dir / "x").string() + " --min-side 300 --max-side 200", dir.path());
  CHECK(sides.status == 2);
  CHECK(sides.err == "stoker-make-data: --min-side 300 is over --max-side 200\n");
  const auto missing =
      run("fashion-mnist " + (dir / "f").string() + " --from " + (dir / "nowhere").string(), dir.path());
  CHECK(missing.status == 1);
  CHECK(missing.err.find("stoker-make-data: error: ") == 0);
  CHECK(missing.err.find("nowhere") != std::string::npos);
  const auto ok = run(
      "imagenet " + (dir / "ok").string() + " --images 6 --classes 2 --min-side 32 --max-side 48 --json", dir.path());
  REQUIRE(ok.status == 0);
  const auto j = nlohmann::json::parse(last_line(ok.out));
  CHECK(j["kind"] == "imagenet");
  CHECK(j["images"] == 6);
  CHECK(j["lists"][0] == (dir / "ok" / "train.txt").string());
  CHECK(ImageDataset::open(dir / "ok" / "train.txt")->size() == 6);
  CHECK(ok.err.empty());  // shorter than --progress's 5 s: nothing to say
  // Progress on stderr, every --progress seconds; the last line a run of 30 can have is 30 of 30.
  const auto told =
      run("imagenet " + (dir / "told").string() + " --images 30 --min-side 64 --max-side 128 --progress 0.000001",
          dir.path());
  REQUIRE(told.status == 0);
  CHECK(told.err.find("stoker-make-data: ") == 0);
  CHECK(told.err.find(" of 30 images (") != std::string::npos);
  CHECK(run("imagenet " + (dir / "x").string() + " --progress -1", dir.path()).status == 2);
}

TEST_CASE("every file written is told to the progress callback, once, up to the total") {
  TempDir dir("progress");
  std::mutex m;
  std::map<std::string, std::vector<std::uint64_t>> told;
  apps::ImageNetLikeOptions o{
      .images = 12, .classes = 3, .min_side = 16, .max_side = 24, .tar_shards = 2, .threads = 3};
  o.progress = [&](const char* what, std::uint64_t done, std::uint64_t total) {
    const std::lock_guard lock(m);
    told[what].push_back(done);
    CHECK(total == (std::string(what) == "images" ? 12u : 2u));
  };
  apps::make_imagenet_like(dir.path(), o);
  REQUIRE(told.size() == 2);
  for (auto& [what, done] : told) {
    CAPTURE(what);
    std::sort(done.begin(), done.end());
    std::vector<std::uint64_t> want(what == "images" ? 12 : 2);
    std::iota(want.begin(), want.end(), 1);
    CHECK(done == want);
  }
}
