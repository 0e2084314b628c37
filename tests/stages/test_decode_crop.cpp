// SPDX-License-Identifier: Apache-2.0
// DecodeResizedCrop: decoding only a crop's window, at a DCT scale, and resizing it in one stage,
// against decoding the whole image and running RandomResizedCrop on it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stages/image_support.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/decode_crop.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/image_transforms.h"
#include "support.h"

using namespace stoker;
using namespace stoker::test;
namespace fs = std::filesystem;

namespace {

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};

// A smooth picture with texture on it: windows resize to values that tell every pixel apart, and
// a JPEG of it keeps the texture.
Sample textured_image(BufferPool& pool, std::uint32_t height, std::uint32_t width, std::uint32_t channels,
                      std::uint32_t seed) {
  Sample s = smooth_image(pool, height, width, channels, seed);
  const Sample noise = noise_image(pool, height, width, channels, seed + 7);
  auto* p = reinterpret_cast<std::uint8_t*>(s.data.data());
  const auto* n = reinterpret_cast<const std::uint8_t*>(noise.data.data());
  for (std::size_t i = 0; i < s.data.size(); ++i) p[i] = static_cast<std::uint8_t>((3 * p[i] + n[i]) / 4);
  return s;
}

struct Encoded {
  std::string kind;
  std::vector<std::byte> bytes;
};

// Every kind of file the decoders take, of `height` x `width`.
std::vector<Encoded> every_kind(BufferPool& pool, std::uint32_t height, std::uint32_t width) {
  const Sample rgb = textured_image(pool, height, width, 3, 1);
  const Sample gray = textured_image(pool, height, width, 1, 2);
  const Sample cmyk = textured_image(pool, height, width, 4, 3);
  return {
      {"JPEG 4:2:0", encode_jpeg(rgb, {.quality = 90, .subsampling = ChromaSubsampling::s420})},
      {"JPEG 4:2:2", encode_jpeg(rgb, {.quality = 85, .subsampling = ChromaSubsampling::s422})},
      {"JPEG 4:4:4", encode_jpeg(rgb, {.quality = 95, .subsampling = ChromaSubsampling::s444})},
      {"JPEG progressive", encode_jpeg(rgb, {.quality = 80, .progressive = true})},
      {"JPEG gray", encode_jpeg(gray, {.quality = 90})},
      {"JPEG CMYK", encode_jpeg(cmyk, {.quality = 90})},
      {"PNG RGB", encode_png(rgb)},
      {"PNG gray", encode_png(gray)},
  };
}

// What the two stages in a row make of `bytes`: the reference the fused stage must equal.
Sample decode_then_crop(std::span<const std::byte> bytes, const RandomResizedCrop& crop, const DecodeOptions& decode,
                        std::uint64_t id, const StageContext& ctx) {
  auto pool = BufferPool::create();
  Sample image = decode_image(bytes, "reference", *pool, decode);
  image.id = id;
  return crop(std::move(image), ctx);
}

EncodedImage encoded(std::span<const std::byte> bytes, std::uint64_t id, BufferPool& pool) {
  EncodedImage e{pool.acquire(bytes.size()), static_cast<std::int32_t>(id % 10), id, "image" + std::to_string(id)};
  std::memcpy(e.data.data(), bytes.data(), bytes.size());
  return e;
}

bool same_bytes(const Sample& a, const Sample& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

}  // namespace

TEST_CASE("DecodeResizedCrop equals decode_image then RandomResizedCrop bit for bit when the window is not scaled") {
  auto pool = BufferPool::create();
  // 96 x 128 pictures and 48 x 40 crops: no window is 8/3 of the output on both sides, so every
  // window is decoded at full resolution.
  const auto files = every_kind(*pool, 96, 128);
  struct Case {
    const char* what;
    RandomResizedCropOptions crop;
    DecodeOptions decode;
  };
  const Case cases[] = {
      {"float32 planar, normalized, mirrored",
       {.size = {48, 40}, .mirror = MirrorOptions{}, .normalize = kImageNet, .layout = Layout::planar},
       {}},
      {"uint8 channels-last, not antialiased",
       {.size = {48, 40}, .antialias = false, .mirror = MirrorOptions{.axis = Axis::height, .p = 0.3}},
       {}},
      {"gray, normalized",
       {.size = {40, 40}, .normalize = Normalization{255, {0.5f}, {0.25f}}},
       {.color = ImageColor::gray}},
      {"larger than the image: enlarged", {.size = {200, 150}, .scale = {0.5, 1.0}, .mirror = MirrorOptions{}}, {}},
  };
  for (const Case& c : cases) {
    const DecodeResizedCrop fused({.crop = c.crop, .decode = c.decode});
    const RandomResizedCrop crop(c.crop);
    for (const Encoded& file : files)
      for (std::uint32_t epoch = 0; epoch < 2; ++epoch)
        for (std::uint64_t id = 0; id < 12; ++id) {
          const StageContext ctx{.seed = 42, .epoch = epoch};
          CAPTURE(c.what);
          CAPTURE(file.kind);
          CAPTURE(id);
          const Sample want = decode_then_crop(file.bytes, crop, c.decode, id, ctx);
          const Sample got = fused(encoded(file.bytes, id, *pool), ctx);
          CHECK(got.shape == fused.output_shape());
          CHECK(got.label == static_cast<std::int32_t>(id % 10));
          CHECK(got.id == id);
          REQUIRE(same_bytes(got, want));
        }
  }
}

TEST_CASE("DecodeResizedCrop with DCT scaling: equal without it, close with it, and the scale is used") {
  auto pool = BufferPool::create();
  const Sample picture = textured_image(*pool, 480, 640, 3, 5);
  const auto jpeg = encode_jpeg(picture, {.quality = 92});
  const RandomResizedCropOptions options{.size = {64, 64}, .mirror = MirrorOptions{}};
  const RandomResizedCrop crop(options);
  const DecodeResizedCrop scaled({.crop = options});
  const DecodeResizedCrop unscaled({.crop = options, .dct_scaling = false});
  int windows_scaled = 0;
  double worst_mean = 0;
  std::vector<int> diffs;
  for (std::uint64_t id = 0; id < 60; ++id) {
    const StageContext ctx{.seed = 3};
    CAPTURE(id);
    const Sample want = decode_then_crop(jpeg, crop, {}, id, ctx);
    REQUIRE(same_bytes(unscaled(encoded(jpeg, id, *pool), ctx), want));
    const Sample got = scaled(encoded(jpeg, id, *pool), ctx);
    const Window w = crop.plan(480, 640, id, ctx).window;
    if (jpeg_scale_eighths(w.width, w.height, 64, 64) == 8) {
      CHECK(same_bytes(got, want));
      continue;
    }
    ++windows_scaled;
    const auto a = pixels(got), b = pixels(want);
    worst_mean = std::max(worst_mean, mean_abs_diff(a, b));
    for (std::size_t i = 0; i < a.size(); ++i) diffs.push_back(std::abs(int(a[i]) - int(b[i])));
  }
  REQUIRE(windows_scaled >= 20);  // windows of 171 pixels and more a side: most of them
  std::sort(diffs.begin(), diffs.end());
  const int p99 = diffs[diffs.size() * 99 / 100];
  MESSAGE("DCT-scaled windows: " << windows_scaled << " of 60; worst mean difference " << worst_mean
                                 << " grey levels, 99th percentile " << p99 << ", most " << diffs.back());
  CHECK(worst_mean <= 2.0);
  CHECK(p99 <= 6);
}

TEST_CASE("decode_crop stages on 1 and 3 threads make what decode and crop stages make, every epoch" *
          doctest::timeout(60)) {
  TempDir dir("decode_crop");
  auto pool = BufferPool::create();
  std::string list;
  const auto files = every_kind(*pool, 72, 90);
  for (std::size_t i = 0; i < 24; ++i) {
    const Encoded& f = files[i % files.size()];
    const std::string name = "img" + std::to_string(i) + (f.kind.starts_with("PNG") ? ".png" : ".jpg");
    write_bytes(dir / name, f.bytes);
    list += name + " " + std::to_string(i % 5) + "\n";
  }
  write_bytes(dir / "list.txt", std::as_bytes(std::span(list.data(), list.size())));
  const auto data = ImageDataset::open(dir / "list.txt");
  const RandomResizedCropOptions crop{
      .size = {32, 32}, .mirror = MirrorOptions{}, .normalize = kImageNet, .layout = Layout::planar};

  using Outputs = std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<std::byte>>;  // (epoch, id)
  const auto collect = [](auto& pipe) {
    Outputs out;
    for (auto epoch : pipe.epochs())
      for (Sample& s : epoch) {
        const auto key = std::make_pair(pipe.current_epoch(), s.id);
        CHECK(out.count(key) == 0);
        out[key].assign(s.data.data(), s.data.data() + s.data.size());
      }
    return out;
  };
  auto two_stages = PipelineBuilder{}
                        .seed(9)
                        .epochs(2)
                        .source("read", ImageSource(data))
                        .map("decode", ImageDecoder())
                        .map("crop", RandomResizedCrop(crop))
                        .build();
  const Outputs want = collect(two_stages);
  REQUIRE(want.size() == 48);
  for (int threads : {1, 3}) {
    CAPTURE(threads);
    auto fused = PipelineBuilder{}
                     .seed(9)
                     .epochs(2)
                     .threads(threads)
                     .source("read", ImageSource(data))
                     .map("decode_crop", DecodeResizedCrop({.crop = crop}), {.threads = threads})
                     .build();
    CHECK(collect(fused) == want);
    // Resized by Collate, a batch's crops in parallel on the pipeline's idle threads.
    auto at_collate = PipelineBuilder{}
                          .seed(9)
                          .epochs(2)
                          .threads(threads)
                          .source("read", ImageSource(data))
                          .map("decode_crop", DecodeCropWindow({.crop = crop}), {.threads = threads})
                          .batch("batch", 5)
                          .map("collate", Collate{}, {.threads = threads})
                          .build();
    Outputs got;
    for (auto epoch : at_collate.epochs())
      for (Batch& b : epoch)
        for (std::size_t i = 0; i < b.count; ++i) {
          const auto key = std::make_pair(at_collate.current_epoch(), b.id_values()[i]);
          CHECK(got.count(key) == 0);
          const auto* p = b.data() + i * b.sample_bytes();
          got[key].assign(p, p + b.sample_bytes());
        }
    CHECK(got == want);
  }
}

TEST_CASE("DecodeResizedCrop: bad files are a DataError naming the file; outputs come from recycled buffers") {
  auto pool = BufferPool::create();
  const auto jpeg = encode_jpeg(textured_image(*pool, 64, 64, 3, 1));
  const auto out_pool = BufferPool::create();
  const auto scratch = BufferPool::create();
  const DecodeResizedCrop fused(
      {.crop = {.size = {24, 24}, .normalize = kImageNet, .pool = out_pool}, .scratch = scratch});
  EncodedImage half = encoded(std::span(jpeg).first(jpeg.size() / 2), 1, *pool);
  half.name = "half.jpg";
  CHECK_THROWS_WITH_AS(fused(std::move(half)), "half.jpg: damaged or truncated JPEG: Premature end of JPEG file",
                       DataError);
  EncodedImage text = encoded(std::as_bytes(std::span("GIF89a....")), 2, *pool);
  text.name = "a.gif";
  CHECK_THROWS_WITH_AS(fused(std::move(text)), doctest::Contains("a.gif: not a JPEG or PNG image but a GIF image"),
                       DataError);

  const auto allocations = out_pool->allocations();
  for (std::uint64_t id = 0; id < 50; ++id) fused(encoded(jpeg, id, *pool), StageContext{.seed = 1});
  CHECK(out_pool->allocations() - allocations <= 1);  // one output at a time: one buffer
  CHECK(scratch->allocations() < 50);                 // windows of one size class share a buffer
  CHECK(scratch->reuses() > 0);

  CHECK_THROWS_WITH_AS(
      DecodeResizedCrop({.crop = {.size = {8, 8}, .normalize = kImageNet}, .decode = {.color = ImageColor::gray}}),
      doctest::Contains("DecodeResizedCrop"), std::invalid_argument);
  CHECK_THROWS_AS(DecodeResizedCrop({.crop = {.size = {0, 8}}}), std::invalid_argument);
}

TEST_CASE(
    "DecodeCropWindow + Collate makes the batches of DecodeResizedCrop + Collate, bit for bit, in either layout") {
  auto pool = BufferPool::create();
  const auto files = every_kind(*pool, 120, 160);
  const auto batch_pool = BufferPool::create();
  // The crop resized in the map stage and copied into the batch, against the crop's window
  // resized into the batch; Collate's normalization is the float resize's, as the crop's is.
  struct Case {
    const char* what;
    RandomResizedCropOptions in_map, at_collate;
    Collate collate;
  };
  const MirrorOptions mirror{};
  const Case cases[] = {
      {"normalized by the crop, planar",
       {.size = {36, 44}, .mirror = mirror, .normalize = kImageNet},
       {.size = {36, 44}, .mirror = mirror, .normalize = kImageNet},
       {}},
      {"normalized by Collate, channels-last",
       {.size = {36, 44}, .mirror = mirror, .normalize = kImageNet, .layout = Layout::channels_last},
       {.size = {36, 44}, .mirror = mirror},
       {.normalize = Normalizer(kImageNet), .layout = Layout::channels_last}},
      {"uint8, planar", {.size = {50, 50}, .antialias = false}, {.size = {50, 50}, .antialias = false}, {}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const DecodeResizedCrop in_map({.crop = c.in_map});
    const DecodeCropWindow at_collate({.crop = c.at_collate});
    const StageContext ctx{.seed = 5, .epoch = 1};
    std::vector<Sample> crops;
    std::vector<DeferredResize> deferred;
    for (std::uint64_t id = 0; id < 24; ++id) {
      const auto& bytes = files[id % files.size()].bytes;
      crops.push_back(in_map(encoded(bytes, id, *pool), ctx));
      deferred.push_back(at_collate(encoded(bytes, id, *pool), ctx));
    }
    const Collate copy{.pool = batch_pool, .layout = c.collate.layout};
    Collate resize = c.collate;
    resize.pool = batch_pool;
    const Batch want = copy(std::move(crops), ctx);
    const Batch got = resize(std::move(deferred), ctx);
    CHECK(got.shape == want.shape);
    CHECK(got.dtype == want.dtype);
    REQUIRE(got.count == 24);
    CHECK(got.dims() == want.dims());
    CHECK(std::memcmp(got.data(), want.data(), got.data_bytes()) == 0);
    CHECK(std::ranges::equal(got.label_values(), want.label_values()));
    CHECK(std::ranges::equal(got.id_values(), want.id_values()));
  }

  const DecodeCropWindow normalized({.crop = {.size = {8, 8}, .normalize = kImageNet}});
  const DecodeCropWindow planar({.crop = {.size = {8, 8}, .layout = Layout::planar}});
  const auto one = [&](const DecodeCropWindow& f) {
    std::vector<DeferredResize> v;
    v.push_back(f(encoded(files[0].bytes, 0, *pool)));
    return v;
  };
  CHECK_THROWS_WITH_AS(Collate{.normalize = Normalizer(kImageNet)}(one(normalized)), doctest::Contains("twice"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Collate{.layout = Layout::channels_last}(one(planar)),
                       doctest::Contains("the crops are laid out planar, the batch channels_last"),
                       std::invalid_argument);
  std::vector<DeferredResize> mixed = one(normalized);
  auto other = one(planar);
  mixed.push_back(std::move(other.front()));
  CHECK_THROWS_WITH_AS(Collate{}(std::move(mixed)), doctest::Contains("crop 1 is"), std::invalid_argument);
  CHECK_THROWS_AS(Collate{}(std::vector<DeferredResize>{}), std::invalid_argument);
}
