// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "stoker/core/pipeline.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/transforms.h"

using namespace stoker;

namespace {

// Every element's value says where it is: c, z, y, x in decimal digits, exact in float32. In
// uint16 the codes of channel 1 wrap around, but stay distinct from channel 0's.
std::uint32_t code(std::uint32_t c, std::uint32_t z, std::uint32_t y, std::uint32_t x) {
  return ((c * 10 + z) * 100 + y) * 100 + x;
}

template <class T>
Sample coded(BufferPool& pool, Shape s, std::uint64_t id = 0, std::int32_t label = 0) {
  Sample out(pool, s, dtype_of<T>(), label, id);
  auto v = out.as<T>();
  std::size_t i = 0;
  for (std::uint32_t c = 0; c < s.channels; ++c)
    for (std::uint32_t z = 0; z < s.depth; ++z)
      for (std::uint32_t y = 0; y < s.height; ++y)
        for (std::uint32_t x = 0; x < s.width; ++x) v[i++] = static_cast<T>(code(c, z, y, x));
  return out;
}

// Arbitrary bytes, so that a uint8 sample uses all 256 values.
Sample noise(BufferPool& pool, Shape s, DType t, std::uint64_t id, std::int32_t label = 0) {
  Sample out(pool, s, t, label, id);
  Rng rng(id + 1000);
  switch (t) {
    case DType::u8:
      for (auto& v : out.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
      break;
    case DType::u16:
      for (auto& v : out.as<std::uint16_t>()) v = static_cast<std::uint16_t>(rng());
      break;
    case DType::f32:
      for (auto& v : out.as<float>()) v = static_cast<float>(rng.below(100000)) * 0.37f - 5000.0f;
      break;
  }
  return out;
}

template <class T>
T at(const Sample& s, std::uint32_t c, std::uint32_t z, std::uint32_t y, std::uint32_t x) {
  const Shape& h = s.shape;
  return s.as<T>()[((std::size_t{c} * h.depth + z) * h.height + y) * h.width + x];
}

bool same_bytes(const Sample& a, const Sample& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.label == b.label && a.id == b.id &&
         a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

// Checks that `s` is the window of a coded sample at (z0, y0, x0), mirrored as `f` says.
template <class T>
void check_window_of_coded(const Sample& s, std::uint32_t z0, std::uint32_t y0, std::uint32_t x0, Flips f = {}) {
  const Shape& h = s.shape;
  for (std::uint32_t c = 0; c < h.channels; ++c)
    for (std::uint32_t z = 0; z < h.depth; ++z)
      for (std::uint32_t y = 0; y < h.height; ++y)
        for (std::uint32_t x = 0; x < h.width; ++x) {
          const std::uint32_t sz = f.depth ? h.depth - 1 - z : z, sy = f.height ? h.height - 1 - y : y,
                              sx = f.width ? h.width - 1 - x : x;
          REQUIRE(at<T>(s, c, z, y, x) == static_cast<T>(code(c, z0 + sz, y0 + sy, x0 + sx)));
        }
}

// Decodes a coded sample's first element into the window origin.
struct Origin {
  std::uint32_t z, y, x;
};
Origin origin_of(const Sample& s) {
  const auto v = static_cast<std::uint32_t>(s.as<float>()[0]);
  return {v / 10000 % 10, v / 100 % 100, v % 100};
}

const Normalization kFashion{255.0f, {0.2860f}, {0.3530f}};

// A source of `images` 28x28 uint8 noise images with ids 0, 1, ..., again every epoch.
auto cycling_images(std::shared_ptr<BufferPool> pool, int images) {
  return [pool = std::move(pool), images, next = 0]() mutable -> std::optional<Sample> {
    if (next == images) {
      next = 0;
      return std::nullopt;
    }
    const auto id = static_cast<std::uint64_t>(next++);
    return noise(*pool, {1, 1, 28, 28}, DType::u8, id, static_cast<std::int32_t>(id % 10));
  };
}

std::vector<Sample> run_crops_pipeline(int threads, int budget, const RandomCropOptions& options, int images) {
  auto pool = BufferPool::create();
  int next = 0;
  auto source = [&, pool]() -> std::optional<Sample> {
    if (next == images) return std::nullopt;
    const auto id = static_cast<std::uint64_t>(next++);
    return noise(*pool, {1, 1, 28, 28}, DType::u8, id, static_cast<std::int32_t>(id % 10));
  };
  auto pipe = PipelineBuilder{}
                  .threads(budget)
                  .deterministic()
                  .seed(1234)
                  .epochs(1)
                  .source("read", source, {.queue = 8})
                  .flat_map<Sample>("crops", RandomCrops(options), {.threads = threads, .queue = 16})
                  .build();
  std::vector<Sample> out;
  for (auto& s : pipe.epoch()) out.push_back(std::move(s));
  return out;
}

}  // namespace

TEST_SUITE("transforms") {
  TEST_CASE("crop copies exactly the window, every channel") {
    auto pool = BufferPool::create();
    const Sample in = coded<std::uint16_t>(*pool, {2, 1, 20, 30}, 7, 3);
    const Sample out = crop(in, {.z = 0, .y = 3, .x = 5, .depth = 1, .height = 7, .width = 11}, *pool);
    CHECK(out.shape == Shape{2, 1, 7, 11, false});
    CHECK(out.dtype == DType::u16);
    CHECK(out.label == 3);
    CHECK(out.id == 7);
    check_window_of_coded<std::uint16_t>(out, 0, 3, 5);

    // The whole sample and a corner are windows too.
    check_window_of_coded<std::uint16_t>(crop(in, {0, 0, 0, 1, 20, 30}, *pool), 0, 0, 0);
    check_window_of_coded<std::uint16_t>(crop(in, {0, 19, 29, 1, 1, 1}, *pool), 0, 19, 29);
  }

  TEST_CASE("3D crops take depth too, and random windows cover every position") {
    auto pool = BufferPool::create();
    const Sample in = coded<float>(*pool, {1, 8, 10, 12, true}, 11);
    check_window_of_coded<float>(crop(in, {2, 3, 4, 5, 6, 7}, *pool), 2, 3, 4);

    const RandomCrops crops({.size = {5, 6, 7}, .count = 400});
    const auto out = crops.apply(in, {.seed = 1, .epoch = 0});
    REQUIRE(out.size() == 400);
    std::set<std::uint32_t> zs, ys, xs;
    for (const Sample& s : out) {
      CHECK(s.shape == Shape{1, 5, 6, 7, true});
      const Origin o = origin_of(s);
      check_window_of_coded<float>(s, o.z, o.y, o.x);
      zs.insert(o.z), ys.insert(o.y), xs.insert(o.x);
    }
    // 8-5+1, 10-6+1 and 12-7+1 positions along each axis, every one of them drawn.
    CHECK(zs.size() == 4);
    CHECK(ys.size() == 5);
    CHECK(xs.size() == 6);
    CHECK(*zs.rbegin() == 3);

    // Depth 0 keeps the whole depth.
    const auto whole = RandomCrops({.size = {6, 7}}).apply(in);
    CHECK(whole.at(0).shape == Shape{1, 8, 6, 7, true});
  }

  TEST_CASE("random_window draws the same windows as RandomCrops") {
    const Shape s{1, 1, 28, 28};
    auto pool = BufferPool::create();
    const Sample in = coded<float>(*pool, s, 42);
    const StageContext ctx{.seed = 3, .epoch = 2};
    const auto out = RandomCrops({.size = {24, 24}, .count = 5}).apply(in, ctx);
    Rng rng = sample_rng(ctx, 42, kCropSalt);
    for (const Sample& c : out) {
      const Window w = random_window(s, {24, 24}, rng);
      const Origin o = origin_of(c);
      CHECK(w == Window{0, o.y, o.x, 1, 24, 24});
    }
  }

  TEST_CASE("mirror reverses one axis, in place") {
    auto pool = BufferPool::create();
    const Shape shape{2, 3, 4, 5, true};
    for (Axis axis : {Axis::depth, Axis::height, Axis::width}) {
      CAPTURE(axis_name(axis));
      Sample s = coded<std::uint16_t>(*pool, shape);
      const auto* before = s.data.data();
      mirror(s, axis);
      CHECK(s.data.data() == before);
      check_window_of_coded<std::uint16_t>(s, 0, 0, 0, Flips::along(axis));
      mirror(s, axis);
      check_window_of_coded<std::uint16_t>(s, 0, 0, 0);
    }
    // Odd and even lengths, 2D, float.
    Sample s = coded<float>(*pool, {1, 1, 2, 6});
    mirror(s, Axis::width);
    check_window_of_coded<float>(s, 0, 0, 0, Flips{.width = true});
  }

  TEST_CASE("RandomMirror mirrors with probability p, the same way for the same sample") {
    auto pool = BufferPool::create();
    const RandomMirror half({.axis = Axis::width, .p = 0.5});
    int mirrored = 0;
    for (std::uint64_t id = 0; id < 2000; ++id) {
      Sample s = coded<float>(*pool, {1, 1, 2, 3}, id);
      s = half(std::move(s), {.seed = 9});
      const bool m = at<float>(s, 0, 0, 0, 0) != 0.0f;
      CHECK(m == half.draw({.seed = 9}, id));
      mirrored += m;
    }
    CHECK(mirrored > 900);
    CHECK(mirrored < 1100);
    Sample s = coded<float>(*pool, {1, 1, 2, 3});
    s = RandomMirror({.axis = Axis::height, .p = 1.0})(std::move(s), {});
    check_window_of_coded<float>(s, 0, 0, 0, Flips{.height = true});
    s = RandomMirror({.axis = Axis::height, .p = 0.0})(std::move(s), {});
    check_window_of_coded<float>(s, 0, 0, 0, Flips{.height = true});
  }

  TEST_CASE("normalize computes (x / scale - mean) / std in float32") {
    auto pool = BufferPool::create();
    Sample in(*pool, {1, 1, 16, 16}, DType::u8, 4, 8);
    for (int i = 0; i < 256; ++i) in.as<std::uint8_t>()[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
    const Sample out = Normalize(kFashion)(std::move(in));
    CHECK(out.dtype == DType::f32);
    CHECK(out.label == 4);
    CHECK(out.id == 8);
    for (int i = 0; i < 256; ++i) {
      const double want = (i / 255.0 - 0.2860) / 0.3530;
      CHECK(out.as<float>()[static_cast<std::size_t>(i)] == doctest::Approx(want).epsilon(1e-6));
      // and exactly the float expression as written
      CHECK(out.as<float>()[static_cast<std::size_t>(i)] == (static_cast<float>(i) / 255.0f - 0.2860f) / 0.3530f);
    }
    CHECK(out.as<float>()[0] == doctest::Approx(-0.2860 / 0.3530));
    CHECK(out.as<float>()[255] == doctest::Approx(0.7140 / 0.3530));

    // uint16, per channel; float32 in place.
    Sample wide = coded<std::uint16_t>(*pool, {2, 1, 3, 4});
    const Normalizer per_channel({.scale = 2.0f, .mean = {1.0f, -1.0f}, .std = {4.0f, 0.5f}});
    const Sample w = normalize(std::move(wide), per_channel, *pool);
    CHECK(at<float>(w, 0, 0, 2, 3) == doctest::Approx((code(0, 0, 2, 3) / 2.0 - 1.0) / 4.0));
    const double wrapped = static_cast<std::uint16_t>(code(1, 0, 1, 1));
    CHECK(at<float>(w, 1, 0, 1, 1) == doctest::Approx((wrapped / 2.0 + 1.0) / 0.5));
    Sample f = coded<float>(*pool, {1, 1, 2, 2});
    const auto* storage = f.data.data();
    f = normalize(std::move(f), Normalizer({.scale = 10.0f, .mean = {1.0f}, .std = {2.0f}}), *pool);
    CHECK(f.data.data() == storage);
    CHECK(at<float>(f, 0, 0, 1, 1) == doctest::Approx((101 / 10.0 - 1.0) / 2.0));
  }

  TEST_CASE("the fused path equals crop, then mirror, then normalize, bit for bit") {
    auto pool = BufferPool::create();
    const Normalizer norm(kFashion);
    const Normalizer norm2({.scale = 3.0f, .mean = {0.1f, 0.7f}, .std = {0.3f, 1.7f}});
    for (DType t : {DType::u8, DType::u16, DType::f32}) {
      for (const Shape& shape : {Shape{1, 1, 28, 28}, Shape{2, 6, 9, 11, true}}) {
        CAPTURE(dtype_name(t));
        CAPTURE(shape.str());
        const Normalizer& n = shape.channels == 2 ? norm2 : norm;
        const Sample in = noise(*pool, shape, t, 5);
        const Window w = shape.volume ? Window{1, 2, 3, 4, 5, 6} : Window{0, 3, 2, 1, 24, 24};
        for (int mask = 0; mask < 8; ++mask) {
          const Flips f{(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0};
          Sample step = crop(in, w, *pool);
          if (f.depth) mirror(step, Axis::depth);
          if (f.height) mirror(step, Axis::height);
          if (f.width) mirror(step, Axis::width);
          step = normalize(std::move(step), n, *pool);
          const Sample fused = crop_mirror_normalize(in, w, f, n, *pool);
          CHECK(same_bytes(fused, step));
          std::vector<float> into(step.shape.elements());
          crop_mirror_normalize_into(in, w, f, n, into);
          CHECK(std::memcmp(into.data(), step.data.data(), step.data.size()) == 0);
        }
      }
    }

    // And the stage callables: fused RandomCrops against three stages one after the other.
    const RandomCrops fused({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion});
    const RandomCrops plain({.size = {24, 24}, .count = 5});
    const RandomMirror flip{};
    const Normalize normalize_stage(kFashion);
    int flipped = 0;
    for (std::uint64_t id = 0; id < 50; ++id) {
      const StageContext ctx{.seed = 77, .epoch = static_cast<std::uint32_t>(id % 3)};
      const Sample in = noise(*pool, {1, 1, 28, 28}, DType::u8, id, 3);
      const auto a = fused.apply(in, ctx);
      const auto b = plain.apply(in, ctx);
      REQUIRE(a.size() == 5);
      REQUIRE(b.size() == 5);
      for (std::size_t k = 0; k < 5; ++k) {
        CHECK(a[k].id == id * 5 + k);
        flipped += flip.draw(ctx, a[k].id);
        Sample s = crop(b[k], {0, 0, 0, 1, 24, 24}, *pool);  // a copy to consume
        s = normalize_stage(flip(std::move(s), ctx));
        CHECK(same_bytes(a[k], s));
      }
    }
    CHECK(flipped > 60);
    CHECK(flipped < 190);
  }

  TEST_CASE("random crops depend on seed, epoch and id only, not on threads" * doctest::timeout(120)) {
    auto pool = BufferPool::create();
    const RandomCrops crops({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion});
    const Sample in = noise(*pool, {1, 1, 28, 28}, DType::u8, 17);
    const auto a = crops.apply(in, {.seed = 1, .epoch = 0});
    const auto b = crops.apply(in, {.seed = 1, .epoch = 0});
    for (std::size_t k = 0; k < a.size(); ++k) CHECK(same_bytes(a[k], b[k]));
    // Another epoch or seed gives other crops (5 identical windows by chance: 25^-10).
    auto differs = [&](const std::vector<Sample>& c) {
      for (std::size_t k = 0; k < a.size(); ++k)
        if (!same_bytes(a[k], c[k])) return true;
      return false;
    };
    CHECK(differs(crops.apply(in, {.seed = 1, .epoch = 1})));
    CHECK(differs(crops.apply(in, {.seed = 2, .epoch = 0})));

    // Through a pipeline: same output with 1 and 4 threads, and the same as without one.
    RandomCropOptions options{.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion};
    const auto one = run_crops_pipeline(1, 1, options, 300);
    const auto four = run_crops_pipeline(4, 4, options, 300);
    REQUIRE(one.size() == 1500);
    REQUIRE(four.size() == 1500);
    for (std::size_t i = 0; i < one.size(); ++i) {
      CHECK(one[i].id == i);  // deterministic mode keeps the order
      CHECK(same_bytes(one[i], four[i]));
    }
  }

  TEST_CASE("in a pipeline, crops are those of the pipeline's seed and epoch" * doctest::timeout(120)) {
    RandomCropOptions options{.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion};
    const auto crops = run_crops_pipeline(2, 2, options, 200);  // seed 1234, epoch 0
    REQUIRE(crops.size() == 1000);
    auto pool = BufferPool::create();
    const auto direct =
        RandomCrops(options).apply(noise(*pool, {1, 1, 28, 28}, DType::u8, 123, 3), {.seed = 1234, .epoch = 0});
    for (std::size_t k = 0; k < 5; ++k) CHECK(same_bytes(direct[k], crops[123 * 5 + k]));
  }

  TEST_CASE("count_of chooses the number of crops per sample") {
    auto pool = BufferPool::create();
    const RandomCrops crops(
        {.size = {4, 4}, .count = 3, .count_of = [](const Sample& s, Rng&) { return static_cast<int>(s.id % 4); }});
    std::vector<std::uint64_t> ids;
    for (std::uint64_t id = 0; id < 8; ++id) {
      const auto out = crops.apply(noise(*pool, {1, 1, 8, 8}, DType::u8, id, 2));
      CHECK(out.size() == id % 4);
      for (const Sample& s : out) {
        CHECK(s.label == 2);
        ids.push_back(s.id);
      }
    }
    CHECK(ids == std::vector<std::uint64_t>{3, 6, 7, 9, 10, 11, 15, 18, 19, 21, 22, 23});

    const RandomCrops random_count({.size = {4, 4}, .count = 6, .count_of = [](const Sample&, Rng& rng) {
                                      return static_cast<int>(rng.below(7));
                                    }});
    std::set<std::size_t> sizes;
    for (std::uint64_t id = 0; id < 200; ++id)
      sizes.insert(random_count.apply(noise(*pool, {1, 1, 8, 8}, DType::u8, id)).size());
    CHECK(sizes.size() == 7);

    const RandomCrops too_many({.size = {4, 4}, .count = 3, .count_of = [](const Sample&, Rng&) { return 4; }});
    CHECK_THROWS_WITH_AS(too_many.apply(noise(*pool, {1, 1, 8, 8}, DType::u8, 0)), doctest::Contains("count_of gave 4"),
                         std::invalid_argument);
  }

  TEST_CASE("center crop takes the middle, for evaluation") {
    auto pool = BufferPool::create();
    const Sample in = coded<float>(*pool, {1, 1, 28, 28}, 5);
    const Sample out = CenterCrop({.size = {24, 24}})(crop(in, {0, 0, 0, 1, 28, 28}, *pool));
    check_window_of_coded<float>(out, 0, 2, 2);
    CHECK(out.id == 5);
    CHECK(center_window({1, 1, 28, 27}, {24, 24}) == Window{0, 2, 1, 1, 24, 24});
    CHECK(center_window({1, 9, 28, 28, true}, {4, 24, 24}) == Window{2, 2, 2, 4, 24, 24});

    const Sample img = noise(*pool, {1, 1, 28, 28}, DType::u8, 1);
    const Sample fused = CenterCrop({.size = {24, 24}, .normalize = kFashion})(crop(img, {0, 0, 0, 1, 28, 28}, *pool));
    const Sample steps = Normalize(kFashion)(crop(img, {0, 2, 2, 1, 24, 24}, *pool));
    CHECK(same_bytes(fused, steps));
  }

  TEST_CASE("bad options and samples give errors that name the option and the sizes") {
    auto pool = BufferPool::create();
    const Sample img = noise(*pool, {1, 1, 28, 28}, DType::u8, 9);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {32, 32}}).apply(img),
                         "RandomCrops: crop size 32x32 is larger than sample 1x28x28 (id 9)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {24, 29}}).apply(img), doctest::Contains("24x29 is larger"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {4, 24, 24}}).apply(img),
                         doctest::Contains("has a depth, but sample 1x28x28 (id 9) is 2D"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {0, 24}}), doctest::Contains("option size"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {24, 24}, .count = 0}), doctest::Contains("option count = 0"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {24, 24}, .mirror = MirrorOptions{.p = 1.5}}),
                         doctest::Contains("p = 1.5"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomMirror({.p = -0.1}), doctest::Contains("not in [0, 1]"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomCrops({.size = {24, 24}, .normalize = Normalization{.std = {0.0f}}}),
                         doctest::Contains("RandomCrops: normalize: std"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Normalizer({.scale = 0.0f}), doctest::Contains("scale"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Normalizer({.mean = {1, 2}, .std = {1, 2, 3}}), doctest::Contains("2 means but 3 stds"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Normalize({.mean = {1, 2}, .std = {1, 2}})(noise(*pool, {3, 1, 4, 4}, DType::u8, 0)),
                         doctest::Contains("values for 2 channels, but the sample 3x4x4 has 3"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(CenterCrop({.size = {30, 30}})(noise(*pool, {1, 1, 28, 28}, DType::u8, 4)),
                         "CenterCrop: crop size 30x30 is larger than sample 1x28x28 (id 4)", std::invalid_argument);
    CHECK_THROWS_WITH_AS(crop(img, {0, 10, 10, 1, 24, 24}, *pool),
                         "crop: window 1x24x24 at (0, 10, 10) does not fit in sample 1x28x28 (id 9)",
                         std::invalid_argument);
    Rng rng(1);
    CHECK_THROWS_WITH_AS(random_window({1, 1, 20, 20}, {24, 24}, rng), doctest::Contains("24x24 is larger"),
                         std::invalid_argument);
    std::vector<float> small(10);
    CHECK_THROWS_WITH_AS(crop_mirror_normalize_into(img, {0, 0, 0, 1, 24, 24}, {}, Normalizer(kFashion), small),
                         doctest::Contains("holds 10 floats, the crop needs 576"), std::invalid_argument);
  }

  TEST_CASE("a stage error reaches the consumer as a StageError" * doctest::timeout(60)) {
    int left = 3;
    auto pool = BufferPool::create();
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .source("read",
                            [&]() -> std::optional<Sample> {
                              if (left-- == 0) return std::nullopt;
                              return noise(*pool, {1, 1, 20, 20}, DType::u8, 0);
                            })
                    .flat_map<Sample>("crops", RandomCrops({.size = {24, 24}}))
                    .build();
    CHECK_THROWS_WITH_AS(pipe.next(), doctest::Contains("24x24 is larger than sample 1x20x20"), StageError);
  }
}

TEST_SUITE("batch") {
  TEST_CASE("make_batch lays samples out one after the other, with labels and ids") {
    auto pool = BufferPool::create();
    std::vector<Sample> samples;
    for (std::uint64_t i = 0; i < 7; ++i) {
      Sample s = coded<float>(*pool, {2, 3, 4, 5, true}, 100 + i, static_cast<std::int32_t>(i % 3));
      for (auto& v : s.as<float>()) v += static_cast<float>(i) * 1e5f;
      samples.push_back(std::move(s));
    }
    const Batch b = make_batch(std::move(samples), *pool);
    CHECK(samples.empty());
    CHECK(b.count == 7);
    CHECK(b.dtype == DType::f32);
    CHECK(b.shape == Shape{2, 3, 4, 5, true});
    CHECK(b.dims() == std::vector<std::size_t>{7, 2, 3, 4, 5});
    CHECK(b.data_bytes() == 7 * 120 * sizeof(float));
    const auto v = b.as<float>();
    for (std::size_t i = 0; i < 7; ++i) {
      CHECK(b.label_values()[i] == static_cast<std::int32_t>(i % 3));
      CHECK(b.id_values()[i] == 100 + i);
      // element (n, c, z, y, x) at ((((n * C + c) * D + z) * H + y) * W + x)
      CHECK(v[(((i * 2 + 1) * 3 + 2) * 4 + 3) * 5 + 4] == static_cast<float>(code(1, 2, 3, 4) + i * 100000));
      CHECK(b.sample<float>(i)[0] == static_cast<float>(i * 100000));
    }
    CHECK_THROWS_AS(b.as<std::uint8_t>(), std::invalid_argument);

    std::vector<Sample> images;
    images.push_back(noise(*pool, {1, 1, 28, 28}, DType::u8, 1));
    const Batch two_d = make_batch(std::move(images), *pool);
    CHECK(two_d.dims() == std::vector<std::size_t>{1, 1, 28, 28});
  }

  TEST_CASE("make_batch can normalize on the way, bit for bit as normalize() does") {
    auto pool = BufferPool::create();
    const Normalizer norm(kFashion);
    const RandomCrops crops({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}});
    const RandomCrops fused({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion});
    std::vector<Sample> raw, normalized;
    for (std::uint64_t id = 0; id < 4; ++id) {
      const Sample img = noise(*pool, {1, 1, 28, 28}, DType::u8, id, static_cast<std::int32_t>(id));
      for (Sample& s : crops.apply(img, {.seed = 2})) raw.push_back(std::move(s));
      for (Sample& s : fused.apply(img, {.seed = 2})) normalized.push_back(std::move(s));
    }
    const Batch a = Collate{.pool = pool, .normalize = norm}(std::move(raw));
    const Batch b = Collate{.pool = pool}(std::move(normalized));
    CHECK(a.dtype == DType::f32);
    CHECK(a.dims() == b.dims());
    CHECK(std::memcmp(a.data(), b.data(), b.data_bytes()) == 0);
    CHECK(std::ranges::equal(a.label_values(), b.label_values()));
    CHECK(std::ranges::equal(a.id_values(), b.id_values()));

    std::vector<Sample> rgb;
    rgb.push_back(noise(*pool, {3, 1, 4, 4}, DType::u8, 0));
    CHECK_THROWS_WITH_AS(make_batch(std::move(rgb), Normalizer({.mean = {1, 2}, .std = {1, 2}}), *pool),
                         doctest::Contains("make_batch: normalize has values for 2 channels"), std::invalid_argument);
  }

  TEST_CASE("make_batch refuses mixed shapes and dtypes, and nothing") {
    auto pool = BufferPool::create();
    std::vector<Sample> mixed;
    mixed.push_back(noise(*pool, {1, 1, 24, 24}, DType::f32, 1));
    mixed.push_back(noise(*pool, {1, 1, 28, 28}, DType::f32, 2));
    CHECK_THROWS_WITH_AS(make_batch(std::move(mixed), *pool),
                         "make_batch: sample 1 (id 2) is float32 1x28x28, but sample 0 (id 1) is float32 1x24x24; "
                         "a batch needs one shape and dtype",
                         std::invalid_argument);
    std::vector<Sample> types;
    types.push_back(noise(*pool, {1, 1, 24, 24}, DType::f32, 1));
    types.push_back(noise(*pool, {1, 1, 24, 24}, DType::u8, 2));
    CHECK_THROWS_WITH_AS(make_batch(std::move(types), *pool), doctest::Contains("is uint8 1x24x24"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_batch(std::vector<Sample>{}, *pool), "make_batch: no samples to batch",
                         std::invalid_argument);
  }

  // Runs RandomCrops(options) as flat_map<Item> -> shuffle -> batch 16 -> collate, deterministic.
  template <class Item>
  std::vector<Batch> crop_batches(const RandomCropOptions& options, const Collate& collate, Shape shape, DType dtype,
                                  int images, int threads) {
    auto pool = BufferPool::create();
    int next = 0;
    auto pipe = PipelineBuilder{}
                    .deterministic()
                    .seed(99)
                    .epochs(1)
                    .source("read",
                            [&]() -> std::optional<Sample> {
                              if (next == images) return std::nullopt;
                              const auto id = static_cast<std::uint64_t>(next++);
                              return noise(*pool, shape, dtype, id, static_cast<std::int32_t>(id % 7));
                            })
                    .template flat_map<Item>("crops", RandomCrops(options), {.threads = threads})
                    .shuffle("shuffle", {.capacity = 200, .min_after_dequeue = 50, .seed = 4})
                    .batch("batch", 16)
                    .map("collate", collate, {.threads = threads})
                    .build();
    std::vector<Batch> out;
    for (auto& b : pipe.epoch()) out.push_back(std::move(b));
    return out;
  }

  TEST_CASE("deferred crops make the same batches, bit for bit, as crops cut by the crop stage" *
            doctest::timeout(120)) {
    struct Case {
      const char* name;
      Shape shape;
      DType dtype;
      CropSize size;
      Axis axis;
      std::optional<Normalization> normalize;
    };
    const Case cases[] = {
        {"2D uint8, normalized", {1, 1, 28, 28}, DType::u8, {24, 24}, Axis::width, kFashion},
        {"2D uint8, raw", {1, 1, 28, 28}, DType::u8, {24, 24}, Axis::height, std::nullopt},
        {"3D uint16 with 2 channels, raw", {2, 6, 10, 12, true}, DType::u16, {4, 5, 6}, Axis::depth, std::nullopt},
        {"3D float32, normalized",
         {1, 5, 9, 9, true},
         DType::f32,
         {3, 4, 4},
         Axis::width,
         Normalization{.scale = 2, .mean = {10}, .std = {3}}},
    };
    for (const Case& c : cases) {
      CAPTURE(c.name);
      const RandomCropOptions cut{
          .size = c.size, .count = 3, .mirror = MirrorOptions{.axis = c.axis}, .normalize = c.normalize};
      RandomCropOptions drawn = cut;
      drawn.normalize.reset();
      Collate normalizing{};
      if (c.normalize) normalizing.normalize = Normalizer(*c.normalize);
      const auto eager = crop_batches<Sample>(cut, Collate{}, c.shape, c.dtype, 100, 2);
      for (int threads : {1, 3}) {
        const auto deferred = crop_batches<DeferredCrop>(drawn, normalizing, c.shape, c.dtype, 100, threads);
        REQUIRE(deferred.size() == eager.size());
        REQUIRE(eager.size() == 19);  // 300 crops, batches of 16
        for (std::size_t i = 0; i < eager.size(); ++i) {
          const Batch &a = eager[i], &b = deferred[i];
          REQUIRE(a.dims() == b.dims());
          REQUIRE(a.dtype == b.dtype);
          CHECK(std::memcmp(a.data(), b.data(), a.payload_bytes()) == 0);
          CHECK(std::ranges::equal(a.id_values(), b.id_values()));
        }
      }
    }
  }

  TEST_CASE("deferred crops: errors name what is wrong, and crops release their source" * doctest::timeout(60)) {
    auto pool = BufferPool::create();
    const RandomCrops normalizing({.size = {24, 24}, .normalize = kFashion});
    int left = 1;
    auto pipe = PipelineBuilder{}
                    .epochs(1)
                    .source("read",
                            [&]() -> std::optional<Sample> {
                              if (left-- == 0) return std::nullopt;
                              return noise(*pool, {1, 1, 28, 28}, DType::u8, 0);
                            })
                    .flat_map<DeferredCrop>("crops", normalizing)
                    .build();
    CHECK_THROWS_WITH_AS(pipe.next(), doctest::Contains("option normalize does not apply to deferred crops"),
                         StageError);

    auto image = std::make_shared<const Sample>(noise(*pool, {1, 1, 28, 28}, DType::u8, 5, 2));
    auto small = std::make_shared<const Sample>(noise(*pool, {1, 1, 20, 20}, DType::u8, 6));
    const PlannedCrop a{.window = {0, 1, 2, 1, 24, 24}, .flips = {}, .id = 25};
    const PlannedCrop b{.window = {0, 0, 0, 1, 20, 20}, .flips = {}, .id = 30};
    std::vector<DeferredCrop> mixed{{image, a}, {small, b}};
    CHECK_THROWS_WITH_AS(make_batch(std::move(mixed), *pool),
                         "make_batch: crop 1 (id 30) is uint8 1x20x20, but crop 0 (id 25) is uint8 1x24x24; "
                         "a batch needs one shape and dtype",
                         std::invalid_argument);
    std::vector<DeferredCrop> orphan{{image, a}, {nullptr, a}};
    CHECK_THROWS_WITH_AS(make_batch(std::move(orphan), *pool), "make_batch: crop 1 (id 25) has no source sample",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(make_batch(std::vector<DeferredCrop>{}, *pool), "make_batch: no crops to batch",
                         std::invalid_argument);
    std::vector<DeferredCrop> outside{{small, a}};
    CHECK_THROWS_WITH_AS(make_batch(std::move(outside), *pool), doctest::Contains("does not fit in sample 1x20x20"),
                         std::invalid_argument);
    std::vector<std::byte> too_small(10);
    CHECK_THROWS_WITH_AS(crop_mirror_into(*image, a.window, {}, too_small),
                         "crop_mirror_into: output holds 10 bytes, the crop needs 576", std::invalid_argument);

    // A batch holds no reference to its crops' sources: they go back to their pool.
    std::vector<DeferredCrop> two{{image, a}, {image, a}};
    CHECK(image.use_count() == 3);
    const Batch batch = make_batch(std::move(two), *pool);
    CHECK(image.use_count() == 1);
    CHECK(batch.label_values()[1] == 2);
    CHECK(batch.id_values()[1] == 25);
  }

  TEST_CASE("deferred crops of an IdxReader's samples point at its data set: nothing shared per crop") {
    IdxDataset data;
    data.images = {.count = 20, .height = 28, .width = 28, .pixels = std::vector<std::uint8_t>(20 * 28 * 28)};
    Rng rng(77);
    for (auto& p : data.images.pixels) p = static_cast<std::uint8_t>(rng());
    for (std::int32_t i = 0; i < 20; ++i) data.labels.push_back(i % 10);
    const std::vector<std::uint8_t> original = data.images.pixels;
    const IdxReader reader(std::move(data));
    const RandomCrops crops({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}});
    const Normalizer normalizer(kFashion);
    auto pool = BufferPool::create();
    const StageContext ctx{.seed = 9, .epoch = 2};

    std::vector<DeferredCrop> deferred;
    std::vector<Sample> cut;
    Emitter<DeferredCrop> emit(deferred);
    for (std::uint64_t id = 0; id < 20; ++id) {
      crops(reader.read(id), emit, ctx);
      for (Sample& c : crops.apply(reader.read(id), ctx)) cut.push_back(std::move(c));
    }
    REQUIRE(deferred.size() == 100);
    for (const DeferredCrop& c : deferred) {
      CHECK(c.source.use_count() == 0);  // no owner: nothing counted per crop
      CHECK(c.source->data.data() == reinterpret_cast<const std::byte*>(reader.dataset().image(c.source->id).data()));
    }
    const Batch a = make_batch(std::move(deferred), normalizer, *pool);
    const Batch b = make_batch(std::move(cut), normalizer, *pool);
    REQUIRE(a.storage.size() == b.storage.size());
    CHECK(std::memcmp(a.data(), b.data(), a.storage.size()) == 0);

    // A sample that no longer equals the data set's entry, relabelled or mirrored (which
    // copies it), gives crops of itself, which share it.
    Sample relabelled = reader.read(3);
    relabelled.label = 7;
    const RandomMirror flip({.p = 1.0});
    std::vector<DeferredCrop> own;
    Emitter<DeferredCrop> emit_own(own);
    crops(std::move(relabelled), emit_own, ctx);
    crops(flip(reader.read(4), ctx), emit_own, ctx);
    REQUIRE(own.size() == 10);
    for (const DeferredCrop& c : own) CHECK(c.source.use_count() > 0);
    const Batch c = make_batch(std::move(own), *pool);
    for (std::size_t i = 0; i < 5; ++i) CHECK(c.label_values()[i] == 7);
    std::vector<Sample> flipped_cut = crops.apply(flip(reader.read(4), ctx), ctx);
    for (std::size_t i = 0; i < 5; ++i)
      CHECK(std::memcmp(c.sample<std::uint8_t>(5 + i).data(), flipped_cut[i].data.data(), 24 * 24) == 0);
    CHECK(reader.dataset().images.pixels == original);  // mirrored copies, not the data set
  }

  TEST_CASE("crop and batch buffers are reused: allocations stop growing") {
    auto images = BufferPool::create();
    auto crops_pool = BufferPool::create();
    const RandomCrops crops(
        {.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}, .normalize = kFashion, .pool = crops_pool});
    const Collate collate{};
    std::vector<Sample> inputs;
    for (std::uint64_t id = 0; id < 51; ++id) inputs.push_back(noise(*images, {1, 1, 28, 28}, DType::u8, id));
    std::uint64_t after_first = 0, batch_after_first = 0;
    for (std::uint32_t epoch = 0; epoch < 5; ++epoch) {
      std::vector<Sample> pending;
      for (const Sample& in : inputs)
        for (Sample& c : crops.apply(in, {.seed = 1, .epoch = epoch})) {
          pending.push_back(std::move(c));
          if (pending.size() == 15) {
            const Batch b = collate(std::exchange(pending, {}));
            CHECK(b.count == 15);
          }
        }
      if (epoch == 0) after_first = crops_pool->allocations(), batch_after_first = collate.pool->allocations();
    }
    CHECK(after_first <= 20);
    CHECK(crops_pool->allocations() == after_first);
    CHECK(collate.pool->allocations() == batch_after_first);
    CHECK(crops_pool->reuses() >= 4 * 255);
  }

  TEST_CASE("in a pipeline, crops and batches come from bounded pools" * doctest::timeout(120)) {
    auto images = BufferPool::create();
    auto crops_pool = BufferPool::create();
    const Collate collate{};
    constexpr int kImages = 2000;
    auto pipe = PipelineBuilder{}
                    .seed(5)
                    .epochs(4)
                    .source("read", cycling_images(images, kImages), {.queue = 16})
                    .flat_map<Sample>("crops",
                                      RandomCrops({.size = {24, 24},
                                                   .count = 5,
                                                   .mirror = MirrorOptions{},
                                                   .normalize = kFashion,
                                                   .pool = crops_pool}),
                                      {.threads = 2, .queue = 64})
                    .shuffle("shuffle", {.capacity = 1000, .min_after_dequeue = 200, .seed = 3})
                    .batch("batch", 100, {.queue = 4})
                    .map("collate", collate, {.queue = 4})
                    .build();
    std::vector<std::uint64_t> allocations;
    for (int epoch = 0; epoch < 4; ++epoch) {
      std::int64_t labels = 0;
      std::set<std::uint64_t> ids;
      for (auto& b : pipe.epoch()) {
        CHECK(b.dims() == std::vector<std::size_t>{100, 1, 24, 24});
        for (auto l : b.label_values()) labels += l;
        for (auto id : b.id_values()) ids.insert(id);
      }
      CHECK(ids.size() == kImages * 5);
      CHECK(labels == 5 * (kImages / 10) * 45);
      allocations.push_back(crops_pool->allocations());
    }
    // Live crops are bounded by the queues and the shuffle buffer (about 1,300), far fewer
    // than the 40,000 made; later epochs find their buffers in the pool.
    CHECK(allocations.back() < 2000);
    CHECK(crops_pool->reuses() >= 4 * kImages * 5 - allocations.back());
    CHECK(collate.pool->allocations() < 3 * 20);
  }

  TEST_CASE("in a pipeline, deferred crops keep a bounded number of images alive" * doctest::timeout(120)) {
    auto images = BufferPool::create();
    constexpr int kImages = 2000;
    auto pipe =
        PipelineBuilder{}
            .seed(5)
            .epochs(4)
            .source("read", cycling_images(images, kImages), {.queue = 16})
            .flat_map<DeferredCrop>("crops", RandomCrops({.size = {24, 24}, .count = 5, .mirror = MirrorOptions{}}),
                                    {.threads = 2, .queue = 64})
            .shuffle("shuffle", {.capacity = 1000, .min_after_dequeue = 200, .seed = 3})
            .batch("batch", 100, {.queue = 4})
            .map("collate", Collate{.normalize = Normalizer(kFashion)}, {.queue = 4})
            .build();
    for (int epoch = 0; epoch < 4; ++epoch) {
      std::set<std::uint64_t> ids;
      for (auto& b : pipe.epoch()) {
        CHECK(b.dims() == std::vector<std::size_t>{100, 1, 24, 24});
        CHECK(b.dtype == DType::f32);
        for (auto id : b.id_values()) ids.insert(id);
      }
      CHECK(ids.size() == kImages * 5);
    }
    // An image lives until its last crop is collated: at most one per crop in the queues and
    // the shuffle buffer (about 1,300), plus those read ahead, of the 8,000 read.
    CHECK(images->allocations() < 1500);
    CHECK(images->reuses() >= 4 * kImages - images->allocations());
  }
}
