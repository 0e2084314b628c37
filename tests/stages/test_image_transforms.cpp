// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "resized_crop_reference.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/dlpack.h"
#include "stoker/stages/image_transforms.h"

using namespace stoker;

namespace {

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};

Shape image(std::uint32_t height, std::uint32_t width, std::uint32_t channels = 3,
            Layout layout = Layout::channels_last) {
  return Shape{.channels = channels,
               .depth = 1,
               .height = height,
               .width = width,
               .volume = false,
               .channels_last = layout == Layout::channels_last};
}

std::size_t index_of(const Shape& s, std::uint32_t y, std::uint32_t x, std::uint32_t c) {
  return s.channels_last ? (std::size_t{y} * s.width + x) * s.channels + c
                         : (std::size_t{c} * s.height + y) * s.width + x;
}

template <class T>
T pixel(const Sample& s, std::uint32_t y, std::uint32_t x, std::uint32_t c) {
  return s.as<T>()[index_of(s.shape, y, x, c)];
}

// Image `id` of a made-up folder: its size follows from its id.
Shape image_shape_of(std::uint64_t id) {
  return image(static_cast<std::uint32_t>(20 + id * 7 % 50), static_cast<std::uint32_t>(30 + id * 11 % 60));
}

// What a decoder gives: uint8 pixels, here of the pattern the torch references were made of.
Sample patterned(BufferPool& pool, Shape s, std::uint64_t id = 0, std::int32_t label = 0) {
  Sample out(pool, s, DType::u8, label, id);
  for (std::uint32_t y = 0; y < s.height; ++y)
    for (std::uint32_t x = 0; x < s.width; ++x)
      for (std::uint32_t c = 0; c < s.channels; ++c)
        out.as<std::uint8_t>()[index_of(s, y, x, c)] =
            static_cast<std::uint8_t>((37 * y + 11 * x * x + 53 * c + 7 * x * y) % 256);
  return out;
}

Sample noisy(BufferPool& pool, Shape s, std::uint64_t id, std::int32_t label = 0) {
  Sample out(pool, s, DType::u8, label, id);
  Rng rng(id * 7 + 1);
  for (auto& v : out.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
  return out;
}

// The same picture in the other layout.
Sample relaid(BufferPool& pool, const Sample& in) {
  Shape s = in.shape;
  s.channels_last = !s.channels_last;
  Sample out(pool, s, in.dtype, in.label, in.id);
  for (std::uint32_t y = 0; y < s.height; ++y)
    for (std::uint32_t x = 0; x < s.width; ++x)
      for (std::uint32_t c = 0; c < s.channels; ++c)
        out.as<std::uint8_t>()[index_of(s, y, x, c)] = pixel<std::uint8_t>(in, y, x, c);
  return out;
}

// A copy, for the transforms that take their input by value.
Sample dup(const Sample& s) {
  static const auto pool = BufferPool::create();
  Sample out(*pool, s.shape, s.dtype, s.label, s.id);
  std::memcpy(out.data.data(), s.data.data(), s.data.size());
  return out;
}

bool same_bytes(const Sample& a, const Sample& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0;
}

// Two-sample chi-square of two histograms of equal totals: sum (a - b)^2 / (a + b), and its
// degrees of freedom (bins where either has counts, less one).
std::pair<double, int> chi_square(const std::vector<std::uint32_t>& a, const std::vector<std::uint32_t>& b) {
  double x = 0;
  int bins = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double n = static_cast<double>(a[i]) + b[i];
    if (n == 0) continue;
    x += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]) / n;
    ++bins;
  }
  return {x, bins - 1};
}

// The chi-square distribution's 0.999 quantile for `df` degrees of freedom (Wilson-Hilferty).
double chi_square_999(int df) {
  const double k = df, z = 3.0902;
  return k * std::pow(1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k)), 3.0);
}

int bin(double v, int bins) { return std::clamp(static_cast<int>(v * bins), 0, bins - 1); }

// A straightforward resize, in double, straight from the contract in resize.h: output pixel
// (oy, ox) of resizing the full-resolution window `w` to oh x ow, from `region` (pixels of the
// image scaled by s from (ry, rx) on): the triangle-weighted mean over the region's pixels that
// the scaled window touches.
double reference_value(const Sample& region, Region where, const Window& w, std::uint32_t oh, std::uint32_t ow,
                       bool antialias, std::uint32_t oy, std::uint32_t ox, std::uint32_t c) {
  const double s = where.scale;
  struct Axis {
    double centre, support;
    std::int64_t lo, hi;
  };
  const auto axis = [&](std::uint32_t start, std::uint32_t extent, std::uint32_t size, std::uint32_t o,
                        std::uint32_t region_start) {
    const double step = extent * s / size;
    return Axis{(start + (o + 0.5) * extent / size) * s - region_start, antialias ? std::max(1.0, step) : 1.0,
                static_cast<std::int64_t>(std::floor(start * s)) - region_start,
                static_cast<std::int64_t>(std::ceil((start + extent) * s)) - region_start};
  };
  const Axis ya = axis(w.y, w.height, oh, oy, where.y), xa = axis(w.x, w.width, ow, ox, where.x);
  // The pixels within the support (the others weigh 0).
  const auto from = [](const Axis& a) {
    return std::max(a.lo, static_cast<std::int64_t>(std::floor(a.centre - a.support)));
  };
  const auto to = [](const Axis& a) {
    return std::min(a.hi, static_cast<std::int64_t>(std::ceil(a.centre + a.support)) + 1);
  };
  double sum = 0, total = 0;
  for (std::int64_t y = from(ya); y < to(ya); ++y) {
    const double wy = std::max(0.0, 1.0 - std::abs(y + 0.5 - ya.centre) / ya.support);
    for (std::int64_t x = from(xa); x < to(xa); ++x) {
      const double wx = std::max(0.0, 1.0 - std::abs(x + 0.5 - xa.centre) / xa.support);
      const auto value = region.dtype == DType::u8
                             ? static_cast<double>(pixel<std::uint8_t>(region, static_cast<std::uint32_t>(y),
                                                                       static_cast<std::uint32_t>(x), c))
                             : static_cast<double>(pixel<float>(region, static_cast<std::uint32_t>(y),
                                                                static_cast<std::uint32_t>(x), c));
      sum += wy * wx * value;
      total += wy * wx;
    }
  }
  return sum / total;
}

const Normalizer kIdentity{Normalization{}};

}  // namespace

TEST_SUITE("image transforms") {
  TEST_CASE("RandomResizedCrop's windows follow torchvision's get_params: scale, ratio and position") {
    // reference::kWindows holds histograms of torchvision's own get_params, drawn offline
    // (resized_crop_reference.py); the same histograms of stoker's draws must match them.
    const RandomResizedCrop rrc({.size = {224, 224}});
    const StageContext ctx{.seed = 27, .epoch = 3};
    for (const auto& ref : reference::kWindows) {
      CAPTURE(ref.height);
      CAPTURE(ref.width);
      std::vector<std::uint32_t> scale(reference::kScaleBins), ratio(reference::kRatioBins),
          rows(reference::kPositionBins), cols(reference::kPositionBins);
      for (int i = 0; i < reference::kDraws; ++i) {
        const Window w = rrc.plan(ref.height, ref.width, static_cast<std::uint64_t>(i), ctx).window;
        REQUIRE(w.depth == 1);
        REQUIRE(w.height >= 1);
        REQUIRE(w.width >= 1);
        REQUIRE(w.y + w.height <= ref.height);  // inside the image
        REQUIRE(w.x + w.width <= ref.width);
        ++scale[static_cast<std::size_t>(
            bin(static_cast<double>(w.height) * w.width / (static_cast<double>(ref.height) * ref.width),
                reference::kScaleBins))];
        ++ratio[static_cast<std::size_t>(bin((std::log(static_cast<double>(w.width) / w.height) - reference::kRatioLo) /
                                                 (reference::kRatioHi - reference::kRatioLo),
                                             reference::kRatioBins))];
        ++rows[static_cast<std::size_t>(bin((w.y + 0.5) / (ref.height - w.height + 1), reference::kPositionBins))];
        ++cols[static_cast<std::size_t>(bin((w.x + 0.5) / (ref.width - w.width + 1), reference::kPositionBins))];
      }
      const std::pair<const char*, std::pair<std::vector<std::uint32_t>, std::vector<std::uint32_t>>> histograms[] = {
          {"scale", {scale, {ref.scale.begin(), ref.scale.end()}}},
          {"ratio", {ratio, {ref.ratio.begin(), ref.ratio.end()}}},
          {"row", {rows, {ref.rows.begin(), ref.rows.end()}}},
          {"column", {cols, {ref.cols.begin(), ref.cols.end()}}},
      };
      for (const auto& [name, h] : histograms) {
        const std::string histogram = name;
        CAPTURE(histogram);
        const auto [x, df] = chi_square(h.first, h.second);
        CAPTURE(x);
        CAPTURE(df);
        if (df < 1) {  // one bin only (a window that never moves): the counts must agree
          CHECK(h.first == h.second);
          continue;
        }
        CHECK(x < chi_square_999(df));
      }
    }
  }

  TEST_CASE("windows stay inside images of every size and option, and depend on seed, epoch and id only") {
    Rng sizes(5);
    for (int i = 0; i < 3000; ++i) {
      const auto h = static_cast<std::uint32_t>(1 + sizes.below(700)),
                 w = static_cast<std::uint32_t>(1 + sizes.below(700));
      const double s0 = 0.01 + 0.5 * static_cast<double>(sizes.below(1000)) / 1000.0;
      const double r0 = 0.2 + static_cast<double>(sizes.below(1000)) / 1000.0;
      const RandomResizedCrop rrc({.size = {8, 8}, .scale = {s0, 1.0}, .ratio = {r0, r0 * 3}});
      const StageContext ctx{.seed = 1, .epoch = static_cast<std::uint32_t>(i)};
      const Window win = rrc.plan(h, w, static_cast<std::uint64_t>(i), ctx).window;
      CAPTURE(h);
      CAPTURE(w);
      REQUIRE(win.height >= 1);
      REQUIRE(win.width >= 1);
      REQUIRE(win.y + win.height <= h);
      REQUIRE(win.x + win.width <= w);
      CHECK(rrc.plan(h, w, static_cast<std::uint64_t>(i), ctx) == rrc.plan(h, w, static_cast<std::uint64_t>(i), ctx));
    }
    const RandomResizedCrop rrc({.size = {8, 8}});
    std::set<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>> seen;
    for (std::uint64_t seed : {1, 2})
      for (std::uint32_t epoch : {0, 1})
        for (std::uint64_t id : {0, 1}) {
          const Window w = rrc.plan(400, 500, id, {.seed = seed, .epoch = epoch}).window;
          seen.insert({w.y, w.x, w.height, w.width});
        }
    CHECK(seen.size() == 8);
  }

  TEST_CASE("when no attempt fits, the window is torchvision's centred fallback") {
    Rng rng(3);
    // attempts = 0: the fallback straight away.
    const auto fallback = [&](std::uint32_t h, std::uint32_t w) {
      return random_resized_window(h, w, {0.08, 1.0}, {3.0 / 4.0, 4.0 / 3.0}, 0, rng);
    };
    CHECK(fallback(40, 300) == Window{0, 0, 123, 1, 40, 53});     // wider than 4:3: h = 40, w = round(40 * 4/3)
    CHECK(fallback(500, 160) == Window{0, 143, 0, 1, 213, 160});  // taller than 3:4: h = round(160 / 0.75)
    CHECK(fallback(100, 120) == Window{0, 0, 0, 1, 100, 120});    // within the range: the whole image
    // An image one pixel high fits none of the 10 attempts: the fallback after them.
    const RandomResizedCrop rrc({.size = {4, 4}});
    for (std::uint64_t id = 0; id < 20; ++id) CHECK(rrc.plan(1, 1000, id).window == Window{0, 0, 499, 1, 1, 1});
  }

  TEST_CASE("the resize gives what torch's interpolate gives, antialiased or not") {
    auto pool = BufferPool::create();
    for (const auto& r : reference::kResizes) {
      CAPTURE(r.out_height);
      CAPTURE(r.out_width);
      CAPTURE(r.antialias);
      for (Layout in_layout : {Layout::channels_last, Layout::planar}) {
        const Sample img = patterned(*pool, image(r.height, r.width, 3, in_layout));
        const RandomResizedCrop rrc({.size = {r.out_height, r.out_width},
                                     .antialias = r.antialias,
                                     .normalize = Normalization{},
                                     .layout = Layout::planar});
        const PlannedCrop crop{{0, r.y, r.x, 1, r.window_height, r.window_width}, {}, 0};
        const Sample out = rrc.apply(img, {}, crop);
        REQUIRE(out.shape == image(r.out_height, r.out_width, 3, Layout::planar));
        const auto got = out.as<float>();
        REQUIRE(got.size() == r.expected.size());
        double worst = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          worst = std::max(worst, std::abs(static_cast<double>(got[i]) - r.expected[i]));
        CAPTURE(worst);
        CHECK(worst < 2e-4);  // float32 sums of values up to 255
      }
    }
  }

  TEST_CASE("the resize equals a straightforward one, from whole images and from DCT-scaled regions") {
    auto pool = BufferPool::create();
    Rng rng(11);
    for (int trial = 0; trial < 150; ++trial) {
      const auto H = static_cast<std::uint32_t>(8 + rng.below(120)), W = static_cast<std::uint32_t>(8 + rng.below(120));
      const auto wh = static_cast<std::uint32_t>(1 + rng.below(H)), ww = static_cast<std::uint32_t>(1 + rng.below(W));
      const Window w{0,
                     static_cast<std::uint32_t>(rng.below(H - wh + 1)),
                     static_cast<std::uint32_t>(rng.below(W - ww + 1)),
                     1,
                     wh,
                     ww};
      const auto oh = static_cast<std::uint32_t>(1 + rng.below(40)), ow = static_cast<std::uint32_t>(1 + rng.below(40));
      const bool antialias = rng.below(2) == 1;
      // A region at scale n/8 holding the scaled window, with a margin on each side.
      const double s = static_cast<double>(1 + rng.below(8)) / 8.0;
      const auto scaled_h = static_cast<std::uint32_t>(std::ceil(H * s)),
                 scaled_w = static_cast<std::uint32_t>(std::ceil(W * s));
      const auto lo_y = static_cast<std::uint32_t>(std::floor(w.y * s)),
                 lo_x = static_cast<std::uint32_t>(std::floor(w.x * s));
      const auto hi_y = static_cast<std::uint32_t>(std::ceil((w.y + wh) * s)),
                 hi_x = static_cast<std::uint32_t>(std::ceil((w.x + ww) * s));
      const Region where{s, static_cast<std::uint32_t>(rng.below(lo_y + 1)),
                         static_cast<std::uint32_t>(rng.below(lo_x + 1))};
      const auto rh = static_cast<std::uint32_t>(hi_y - where.y + rng.below(scaled_h - hi_y + 1)),
                 rw = static_cast<std::uint32_t>(hi_x - where.x + rng.below(scaled_w - hi_x + 1));
      const Layout layout = rng.below(2) ? Layout::channels_last : Layout::planar;
      const Sample region = noisy(*pool, image(rh, rw, 3, layout), static_cast<std::uint64_t>(trial));
      CAPTURE(trial);
      const RandomResizedCrop rrc({.size = {oh, ow}, .antialias = antialias, .normalize = Normalization{}});
      const Sample out = rrc.apply(region, where, PlannedCrop{w, {}, 0});
      double worst = 0;
      for (std::uint32_t y = 0; y < oh; ++y)
        for (std::uint32_t x = 0; x < ow; ++x)
          for (std::uint32_t c = 0; c < 3; ++c)
            worst = std::max(worst, std::abs(pixel<float>(out, y, x, c) -
                                             reference_value(region, where, w, oh, ow, antialias, y, x, c)));
      CAPTURE(worst);
      REQUIRE(worst < 1e-3);
    }
  }

  TEST_CASE("every DCT scale samples the same points of the picture: a linear ramp resizes to itself") {
    // A picture that is linear in (X, Y) gives each pixel the value at its centre at any scale
    // (the mean of a linear function over a pixel), and bilinear interpolation of it is exact
    // away from the window's edges: so every output pixel there must be the ramp's value at the
    // point the contract maps it to, whatever the scale and wherever the region starts.
    auto pool = BufferPool::create();
    const auto ramp = [](double X, double Y) { return 2.0 * X + 3.0 * Y + 1.0; };
    const Window w{0, 37, 53, 1, 150, 200};
    const std::uint32_t oh = 32, ow = 48;
    for (int eighths = 1; eighths <= 8; ++eighths) {
      const double s = eighths / 8.0;
      CAPTURE(s);
      const Region where{s, static_cast<std::uint32_t>(std::floor(w.y * s)) - 1,
                         static_cast<std::uint32_t>(std::floor(w.x * s)) - 2};
      const auto rh = static_cast<std::uint32_t>(std::ceil((w.y + w.height) * s)) - where.y + 1;
      const auto rw = static_cast<std::uint32_t>(std::ceil((w.x + w.width) * s)) - where.x + 3;
      Sample region(*pool, image(rh, rw, 1), DType::f32);
      for (std::uint32_t i = 0; i < rh; ++i)
        for (std::uint32_t j = 0; j < rw; ++j)
          region.as<float>()[i * rw + j] = static_cast<float>(ramp((where.x + j + 0.5) / s, (where.y + i + 0.5) / s));
      const RandomResizedCrop rrc({.size = {oh, ow}, .antialias = false});
      const Sample out = rrc.apply(region, where, PlannedCrop{w, {}, 0});
      int checked = 0;
      for (std::uint32_t y = 0; y < oh; ++y)
        for (std::uint32_t x = 0; x < ow; ++x) {
          const double Y = w.y + (y + 0.5) * w.height / oh, X = w.x + (x + 0.5) * w.width / ow;
          // Away from the edges of the scaled window, where its taps are not cut.
          if (Y * s - 0.5 < std::floor(w.y * s) || Y * s + 0.5 > std::ceil((w.y + w.height) * s) ||
              X * s - 0.5 < std::floor(w.x * s) || X * s + 0.5 > std::ceil((w.x + w.width) * s))
            continue;
          ++checked;
          CHECK(pixel<float>(out, y, x, 0) == doctest::Approx(ramp(X, Y)).epsilon(1e-5));
        }
      CHECK(checked > oh * ow / 2);
    }
  }

  TEST_CASE("a region holding the window resizes bit for bit as the whole image does; one that does not is refused") {
    auto pool = BufferPool::create();
    const Sample img = noisy(*pool, image(90, 120), 1);
    const RandomResizedCrop rrc({.size = {24, 32}, .mirror = MirrorOptions{}, .normalize = kImageNet});
    for (std::uint64_t id = 0; id < 30; ++id) {
      const PlannedCrop p = rrc.plan(90, 120, id);
      const Sample whole = rrc.apply(img, {}, p);
      // The window's pixels, and a margin, copied out as a decoder of the window alone would.
      const std::uint32_t y0 = p.window.y / 2, x0 = p.window.x / 3;
      const Window part{0,
                        y0,
                        x0,
                        1,
                        std::min<std::uint32_t>(90 - y0, p.window.y + p.window.height + 1 - y0),
                        std::min<std::uint32_t>(120 - x0, p.window.x + p.window.width + 2 - x0)};
      const Sample region = crop_image(img, part, {}, nullptr, Layout::channels_last, *pool, img.id);
      CHECK(same_bytes(rrc.apply(region, Region{1.0, y0, x0}, p), whole));
    }
    const PlannedCrop p{{0, 10, 20, 1, 40, 50}, {}, 0};
    const Sample region = crop_image(img, {0, 10, 20, 1, 40, 49}, {}, nullptr, Layout::channels_last, *pool, 0);
    CHECK_THROWS_WITH_AS(rrc.apply(region, Region{1.0, 10, 20}, p),
                         "RandomResizedCrop: sample 40x49x3 (id 0): resample_axis: the window [20, 70) at scale 1 "
                         "reads pixels [20, 70) of the scaled image, but the region holds [20, 69)",
                         std::invalid_argument);
  }

  TEST_CASE("RandomResizedCrop's fused mirror and normalization equal RandomMirror and Normalize after it") {
    auto pool = BufferPool::create();
    const RandomResizedCrop fused({.size = {40, 30}, .mirror = MirrorOptions{}, .normalize = kImageNet});
    const RandomResizedCrop plain({.size = {40, 30}, .normalize = Normalization{}});
    const RandomMirror mirror;
    const Normalize normalize(kImageNet);
    int mirrored = 0;
    for (std::uint64_t id = 0; id < 40; ++id) {
      const StageContext ctx{.seed = 8, .epoch = 2};
      const Sample img = noisy(*pool, image(60 + static_cast<std::uint32_t>(id), 80), id, 3);
      mirrored += fused.plan(img.shape.height, img.shape.width, id, ctx).flips.width;
      const Sample a = fused(dup(img), ctx);
      const Sample b = normalize(mirror(plain(dup(img), ctx), ctx));
      CHECK(same_bytes(a, b));
      CHECK(a.label == 3);
      CHECK(a.id == id);
    }
    CHECK(mirrored > 5);
    CHECK(mirrored < 35);
  }

  TEST_CASE("in a pipeline, RandomResizedCrop crops as for the pipeline's seed and epoch, on any thread" *
            doctest::timeout(120)) {
    const RandomResizedCrop rrc({.size = {16, 12}, .mirror = MirrorOptions{}, .normalize = kImageNet});
    const auto picture = [](std::uint64_t id) {
      static const auto pool = BufferPool::create();
      return noisy(*pool, image_shape_of(id), id, static_cast<std::int32_t>(id % 5));
    };
    for (int threads : {1, 3}) {
      std::uint64_t next = 0;
      auto pipe = PipelineBuilder{}
                      .seed(21)
                      .epochs(2)
                      .source("read",
                              [&]() -> std::optional<Sample> {
                                if (next == 30) {
                                  next = 0;
                                  return std::nullopt;
                                }
                                return picture(next++);
                              })
                      .map("crop", rrc, {.threads = threads})
                      .batch("batch", 4)
                      .map("collate", Collate{})
                      .build();
      for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
        std::set<std::uint64_t> seen;
        for (auto& b : pipe.epoch()) {
          REQUIRE(b.dims() == std::vector<std::size_t>{b.count, 3, 16, 12});
          for (std::size_t i = 0; i < b.count; ++i) {
            const std::uint64_t id = b.id_values()[i];
            const Sample img = picture(id);
            const Sample want =
                rrc.apply(img, {}, rrc.plan(img.shape.height, img.shape.width, id, {.seed = 21, .epoch = epoch}));
            for (std::uint32_t c = 0; c < 3; ++c)
              for (std::uint32_t y = 0; y < 16; ++y)
                for (std::uint32_t x = 0; x < 12; ++x)
                  REQUIRE(b.sample<float>(i)[(c * 16 + y) * 12 + x] == pixel<float>(want, y, x, c));
            CHECK(b.label_values()[i] == img.label);
            seen.insert(id);
          }
        }
        CHECK(seen.size() == 30);
      }
    }
  }

  TEST_CASE("either layout in, either layout out: the same values") {
    auto pool = BufferPool::create();
    const Sample hwc = noisy(*pool, image(50, 70), 4);
    const Sample chw = relaid(*pool, hwc);
    for (const auto& normalize : {std::optional<Normalization>{}, std::optional<Normalization>{kImageNet}}) {
      const RandomResizedCrop to_hwc({.size = {20, 25},
                                      .mirror = MirrorOptions{.axis = Axis::height, .p = 0.5},
                                      .normalize = normalize,
                                      .layout = Layout::channels_last});
      const RandomResizedCrop to_chw({.size = {20, 25},
                                      .mirror = MirrorOptions{.axis = Axis::height, .p = 0.5},
                                      .normalize = normalize,
                                      .layout = Layout::planar});
      for (std::uint64_t id = 0; id < 10; ++id) {
        const PlannedCrop p = to_hwc.plan(50, 70, id);
        const Sample a = to_hwc.apply(hwc, {}, p), b = to_chw.apply(hwc, {}, p), c = to_hwc.apply(chw, {}, p);
        CHECK(same_bytes(a, c));
        REQUIRE(b.shape == image(20, 25, 3, Layout::planar));
        for (std::uint32_t y = 0; y < 20; ++y)
          for (std::uint32_t x = 0; x < 25; ++x)
            for (std::uint32_t ch = 0; ch < 3; ++ch) {
              if (normalize)
                REQUIRE(pixel<float>(a, y, x, ch) == pixel<float>(b, y, x, ch));
              else
                REQUIRE(pixel<std::uint8_t>(a, y, x, ch) == pixel<std::uint8_t>(b, y, x, ch));
            }
      }
    }
    // Without a layout option, the output keeps the input's.
    CHECK(RandomResizedCrop({.size = {4, 4}})(dup(chw), {}).shape == image(4, 4, 3, Layout::planar));
    CHECK(RandomResizedCrop({.size = {4, 4}})(dup(hwc), {}).shape == image(4, 4, 3, Layout::channels_last));
  }

  TEST_CASE("uint8 output is the float resize rounded to nearest") {
    auto pool = BufferPool::create();
    const Sample img = noisy(*pool, image(64, 48), 9);
    const RandomResizedCrop as_u8({.size = {17, 23}}), as_f32({.size = {17, 23}, .normalize = Normalization{}});
    for (std::uint64_t id = 0; id < 10; ++id) {
      const PlannedCrop p = as_u8.plan(64, 48, id);
      const Sample a = as_u8.apply(img, {}, p), b = as_f32.apply(img, {}, p);
      REQUIRE(a.dtype == DType::u8);
      for (std::size_t i = 0; i < a.shape.elements(); ++i)
        REQUIRE(a.as<std::uint8_t>()[i] ==
                static_cast<std::uint8_t>(std::clamp(b.as<float>()[i], 0.0f, 255.0f) + 0.5f));
    }
  }

  TEST_CASE("Resize: the shorter side as torchvision's, and its centre crop in one pass") {
    auto pool = BufferPool::create();
    const Resize shorter({.shorter = 256});
    CHECK(shorter.resized(375, 500) == CropSize{256, 341});  // int(256 * 500 / 375)
    CHECK(shorter.resized(500, 375) == CropSize{341, 256});
    CHECK(shorter.resized(300, 300) == CropSize{256, 256});
    const Sample img = noisy(*pool, image(75, 100), 2, 6);
    const Sample resized = Resize({.shorter = 40, .normalize = kImageNet})(dup(img));
    CHECK(resized.shape == image(40, 53));
    const Sample fused = Resize({.shorter = 40, .crop = {32, 32}, .normalize = kImageNet})(dup(img));
    CHECK(fused.shape == image(32, 32));
    CHECK(fused.label == 6);
    // Equal, bit for bit, to the resized image's centre crop.
    const Sample cropped = CenterCrop({.size = {32, 32}})(Resize({.shorter = 40, .normalize = kImageNet})(dup(img)));
    CHECK(same_bytes(fused, cropped));
    // Exact sizes, into planar float32.
    const Sample exact = Resize({.size = {20, 30}, .normalize = kImageNet, .layout = Layout::planar})(dup(img));
    CHECK(exact.shape == image(20, 30, 3, Layout::planar));
    CHECK_THROWS_WITH_AS(Resize({.shorter = 40, .crop = {50, 50}})(dup(img)),
                         "Resize: sample 75x100x3 (id 2) resized to 40x53 is smaller than the crop 50x50",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(Resize({}), "Resize: give one of the options shorter (the shorter side's length) and size",
                         std::invalid_argument);
  }

  TEST_CASE("normalization is per channel, in either layout") {
    auto pool = BufferPool::create();
    const Sample hwc = noisy(*pool, image(6, 7), 1);
    const Sample planar = Normalize(kImageNet)(relaid(*pool, hwc));
    const Sample interleaved = Normalize(kImageNet)(crop(hwc, {0, 0, 0, 1, 6, 7}, *pool));
    // float32 images are normalized in place, per channel as well: the identity resize first.
    Sample f = RandomResizedCrop(
        {.size = {6, 7}, .scale = {1, 1}, .ratio = {7.0 / 6, 7.0 / 6}, .normalize = Normalization{}})(dup(hwc), {});
    const Sample in_place = Normalize(kImageNet)(std::move(f));
    for (std::uint32_t y = 0; y < 6; ++y)
      for (std::uint32_t x = 0; x < 7; ++x)
        for (std::uint32_t c = 0; c < 3; ++c) {
          const float want =
              (static_cast<float>(pixel<std::uint8_t>(hwc, y, x, c)) / 255.0f - kImageNet.mean[c]) / kImageNet.std[c];
          CHECK(pixel<float>(planar, y, x, c) == want);
          CHECK(pixel<float>(interleaved, y, x, c) == want);
          CHECK(pixel<float>(in_place, y, x, c) == want);
        }
  }

  TEST_CASE("crops and mirrors of channels-last images move whole pixels") {
    auto pool = BufferPool::create();
    const Sample img = patterned(*pool, image(9, 11));
    const Window w{0, 2, 3, 1, 5, 6};
    const Sample cut = crop(img, w, *pool);
    REQUIRE(cut.shape == image(5, 6));
    Sample flipped = crop(img, w, *pool);
    mirror(flipped, Axis::width);
    Sample upside = crop(img, w, *pool);
    mirror(upside, Axis::height);
    for (std::uint32_t y = 0; y < 5; ++y)
      for (std::uint32_t x = 0; x < 6; ++x)
        for (std::uint32_t c = 0; c < 3; ++c) {
          CHECK(pixel<std::uint8_t>(cut, y, x, c) == pixel<std::uint8_t>(img, 2 + y, 3 + x, c));
          CHECK(pixel<std::uint8_t>(flipped, y, x, c) == pixel<std::uint8_t>(img, 2 + y, 3 + 5 - x, c));
          CHECK(pixel<std::uint8_t>(upside, y, x, c) == pixel<std::uint8_t>(img, 2 + 4 - y, 3 + x, c));
        }
    // The fused crop with flips equals crop then mirror; CenterCrop and RandomCrops take images too.
    std::vector<std::byte> out(5 * 6 * 3);
    crop_mirror_into(img, w, Flips::along(Axis::width), out);
    CHECK(std::memcmp(out.data(), flipped.data.data(), out.size()) == 0);
    CHECK(same_bytes(CenterCrop({.size = {5, 6}})(dup(img)), crop(img, {0, 2, 2, 1, 5, 6}, *pool)));
    for (const Sample& s : RandomCrops({.size = {4, 4}, .count = 3}).apply(img)) CHECK(s.shape == image(4, 4));
  }

  TEST_CASE("what cannot take a channels-last volume says so") {
    auto pool = BufferPool::create();
    Shape vol{.channels = 2, .depth = 3, .height = 4, .width = 5, .volume = true, .channels_last = true};
    const Sample v(*pool, vol, DType::u8);
    CHECK_THROWS_WITH_AS(crop(v, {0, 0, 0, 2, 2, 2}, *pool), "crop_image: sample 3x4x5x2 (id 0) is not a 2D image",
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(RandomResizedCrop({.size = {2, 2}})(dup(v), {}),
                         "RandomResizedCrop: sample 3x4x5x2 (id 0) is not a 2D image", std::invalid_argument);
    std::vector<Sample> volumes;
    volumes.emplace_back(*pool, vol, DType::u8);
    CHECK_THROWS_WITH_AS(make_batch(std::move(volumes), *pool),
                         "make_batch: a planar batch of 3x4x5x2 volumes; only 2D images change layout",
                         std::invalid_argument);
  }

  TEST_CASE("bad options are refused, naming the option") {
    const auto fails = [](RandomResizedCropOptions o, const char* what) {
      CHECK_THROWS_WITH_AS(RandomResizedCrop(std::move(o)), what, std::invalid_argument);
    };
    fails({}, "RandomResizedCrop: option size 0x0 is empty");
    fails({.size = {2, 4, 4}}, "RandomResizedCrop: option size 2x4x4 has a depth; images are 2D");
    fails({.size = {4, 4}, .scale = {0.5, 0.1}},
          "RandomResizedCrop: option scale = {0.500000, 0.100000} must be finite, ordered, not negative, and not both "
          "0");
    fails({.size = {4, 4}, .ratio = {0, 1}},
          "RandomResizedCrop: option ratio = {0.000000, 1.000000} must be finite, ordered and positive");
    fails({.size = {4, 4}, .attempts = -1}, "RandomResizedCrop: option attempts = -1 must not be negative");
    fails({.size = {4, 4}, .mirror = MirrorOptions{.axis = Axis::depth}},
          "RandomResizedCrop: option mirror.axis is depth; an image mirrors along height or width");
    fails({.size = {4, 4}, .normalize = Normalization{.std = {0}}},
          "RandomResizedCrop: normalize: std = 0.000000 must be finite and non-zero");
    auto pool = BufferPool::create();
    const Sample grey = noisy(*pool, image(10, 10, 1), 0);
    CHECK_THROWS_WITH_AS(RandomResizedCrop({.size = {4, 4}, .normalize = kImageNet})(dup(grey), {}),
                         "RandomResizedCrop: normalize has values for 3 channels, but the sample 10x10x1 has 1",
                         std::invalid_argument);
  }

  TEST_CASE("Collate lays colour images out NCHW or NHWC, uint8 or normalized float32") {
    auto pool = BufferPool::create();
    std::vector<Sample> images;
    for (std::uint64_t id = 0; id < 4; ++id) images.push_back(noisy(*pool, image(5, 7), id, static_cast<int>(id) + 1));
    const auto copies = [&] {
      std::vector<Sample> out;
      for (const Sample& s : images) out.push_back(crop(s, {0, 0, 0, 1, 5, 7}, *pool));
      return out;
    };
    const Batch nchw = Collate{}(copies());
    const Batch nhwc = Collate{.layout = Layout::channels_last}(copies());
    const Batch normalized = Collate{.normalize = Normalizer(kImageNet)}(copies());
    CHECK(nchw.dims() == std::vector<std::size_t>{4, 3, 5, 7});
    CHECK(nhwc.dims() == std::vector<std::size_t>{4, 5, 7, 3});
    CHECK(normalized.dims() == std::vector<std::size_t>{4, 3, 5, 7});
    CHECK(normalized.dtype == DType::f32);
    const Normalizer n(kImageNet);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK(nchw.label_values()[i] == static_cast<int>(i) + 1);
      CHECK(nhwc.id_values()[i] == i);
      CHECK(std::memcmp(nhwc.sample<std::uint8_t>(i).data(), images[i].data.data(), 5 * 7 * 3) == 0);
      for (std::uint32_t y = 0; y < 5; ++y)
        for (std::uint32_t x = 0; x < 7; ++x)
          for (std::uint32_t c = 0; c < 3; ++c) {
            const std::uint8_t v = pixel<std::uint8_t>(images[i], y, x, c);
            CHECK(nchw.sample<std::uint8_t>(i)[(c * 5 + y) * 7 + x] == v);
            CHECK(normalized.sample<float>(i)[(c * 5 + y) * 7 + x] == n.table(c)[v]);
          }
    }
    // Planar samples into an NHWC batch, and back.
    std::vector<Sample> planar;
    for (const Sample& s : images) planar.push_back(relaid(*pool, s));
    const Batch back = Collate{.layout = Layout::channels_last}(std::move(planar));
    CHECK(std::memcmp(back.data(), nhwc.data(), nhwc.data_bytes()) == 0);
    CHECK(std::ranges::equal(back.label_values(), nhwc.label_values()));
    // The batch's DLPack export says what it is.
    auto t = to_dlpack(Collate{.layout = Layout::channels_last}(copies()));
    CHECK(std::vector<std::int64_t>(t.samples->dl_tensor.shape, t.samples->dl_tensor.shape + 4) ==
          std::vector<std::int64_t>{4, 5, 7, 3});
    t.samples->deleter(t.samples);
    t.labels->deleter(t.labels);
  }

  // k random crops + mirrors of each colour image -> shuffle -> batches, cut in the crop stage
  // or (deferred) in collate.
  template <class Item>
  std::vector<Batch> colour_batches(const Collate& collate, std::optional<Normalization> normalize, int threads) {
    auto pool = BufferPool::create();
    int next = 0;
    auto pipe =
        PipelineBuilder{}
            .deterministic()
            .seed(99)
            .epochs(1)
            .source("read",
                    [&]() -> std::optional<Sample> {
                      if (next == 60) return std::nullopt;
                      const auto id = static_cast<std::uint64_t>(next++);
                      // Images of different sizes, as decoded.
                      return noisy(
                          *pool,
                          image(40 + static_cast<std::uint32_t>(id % 9), 50 + static_cast<std::uint32_t>(id % 5)), id,
                          static_cast<std::int32_t>(id % 7));
                    })
            .template flat_map<Item>(
                "crops", RandomCrops({.size = {32, 32}, .count = 5, .mirror = MirrorOptions{}, .normalize = normalize}),
                {.threads = threads})
            .shuffle("shuffle", {.capacity = 200, .min_after_dequeue = 50, .seed = 4})
            .batch("batch", 16)
            .map("collate", collate, {.threads = threads})
            .build();
    std::vector<Batch> out;
    for (auto& b : pipe.epoch()) out.push_back(std::move(b));
    return out;
  }

  TEST_CASE("the colour crop job: deferred crops make the same batches as crops cut by the crop stage" *
            doctest::timeout(120)) {
    for (Layout layout : {Layout::planar, Layout::channels_last}) {
      CAPTURE(layout_name(layout));
      // uint8, and normalized in collate (deferred) or in the crop stage (cut).
      const auto eager = colour_batches<Sample>(Collate{.layout = layout}, std::nullopt, 2);
      const auto eager_f32 = colour_batches<Sample>(Collate{.layout = layout}, kImageNet, 2);
      for (int threads : {1, 3}) {
        const auto deferred = colour_batches<DeferredCrop>(Collate{.layout = layout}, std::nullopt, threads);
        const auto deferred_f32 = colour_batches<DeferredCrop>(
            Collate{.normalize = Normalizer(kImageNet), .layout = layout}, std::nullopt, threads);
        REQUIRE(eager.size() == 19);  // 300 crops, batches of 16
        REQUIRE(deferred.size() == eager.size());
        REQUIRE(deferred_f32.size() == eager.size());
        for (std::size_t i = 0; i < eager.size(); ++i) {
          CHECK(eager[i].dims() == (layout == Layout::planar ? std::vector<std::size_t>{eager[i].count, 3, 32, 32}
                                                             : std::vector<std::size_t>{eager[i].count, 32, 32, 3}));
          for (const auto& [a, b] : {std::pair{&eager[i], &deferred[i]}, std::pair{&eager_f32[i], &deferred_f32[i]}}) {
            REQUIRE(a->dims() == b->dims());
            REQUIRE(a->dtype == b->dtype);
            CHECK(std::memcmp(a->data(), b->data(), a->payload_bytes()) == 0);
            CHECK(std::ranges::equal(a->id_values(), b->id_values()));
          }
        }
      }
    }
  }

  TEST_CASE("the colour crop job keeps one image's crops apart, each crop once" * doctest::timeout(120)) {
    const auto batches = colour_batches<DeferredCrop>(Collate{.normalize = Normalizer(kImageNet)}, std::nullopt, 2);
    std::set<std::uint64_t> ids;
    std::size_t together = 0, pairs = 0;
    for (const Batch& b : batches) {
      std::map<std::uint64_t, int> per_image;
      for (std::uint64_t id : b.id_values()) {
        CHECK(ids.insert(id).second);
        ++per_image[id / 5];
      }
      for (const auto& [image, n] : per_image) together += static_cast<std::size_t>(n * (n - 1) / 2);
      pairs += b.count * (b.count - 1) / 2;
    }
    CHECK(ids.size() == 300);
    // Cut in order, a batch of 16 would hold 3 images' 5 crops each: 30 of its 120 pairs from
    // one image. Shuffled through a window of 50, far fewer.
    CAPTURE(together);
    CHECK(together * 8 < pairs);
  }
}
