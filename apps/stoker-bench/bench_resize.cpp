// SPDX-License-Identifier: Apache-2.0
// The `resize` suite: what RandomResizedCrop costs a core per crop, on images of the image
// job's sizes (160-512 pixels a side, channels-last uint8, as decoded), for the options the job
// may use, against a plain crop that writes the same output (the transform with no resampling:
// the floor any resize pays to convert and write 224 x 224 x 3 values). One thread, the
// contenders interleaved within each repeat.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "stoker/stages/image_transforms.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;

const Normalization kImageNet{.scale = 255, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};

struct ResizeOptions {
  std::size_t crops = 2000;  // per contender and repeat
  std::uint32_t size = 224;
  std::size_t images = 16;
};

struct Contender {
  const char* name;
  const char* what;
  // Crop i of `image`, into the contender's own output.
  std::function<void(const Sample& image, std::uint64_t i)> crop;
  std::vector<double> rates;
};

Json run(const ResizeOptions& o, const CommonOptions& common) {
  auto pool = BufferPool::create();
  // The job's images, and for the plain crop the same grown to the crop where smaller.
  std::vector<Sample> images, croppable;
  Rng rng(2027);
  const auto image = [&](std::uint32_t h, std::uint32_t w, std::uint64_t id) {
    Sample s(*pool, Shape{.channels = 3, .height = h, .width = w, .channels_last = true}, DType::u8, 0, id);
    for (auto& v : s.as<std::uint8_t>()) v = static_cast<std::uint8_t>(rng());
    return s;
  };
  for (std::size_t i = 0; i < o.images; ++i) {
    const auto h = static_cast<std::uint32_t>(160 + rng.below(353));
    const auto w = static_cast<std::uint32_t>(160 + rng.below(353));
    images.push_back(image(h, w, i));
    croppable.push_back(image(std::max(h, o.size), std::max(w, o.size), i));
  }
  const CropSize size{o.size, o.size};
  const auto rrc = [&](bool antialias, bool normalized) {
    return std::make_shared<RandomResizedCrop>(
        RandomResizedCropOptions{.size = size,
                                 .antialias = antialias,
                                 .mirror = MirrorOptions{},
                                 .normalize = normalized ? std::optional<Normalization>(kImageNet) : std::nullopt,
                                 .layout = normalized ? Layout::planar : Layout::channels_last});
  };
  std::vector<std::byte> out(std::size_t{3} * o.size * o.size * sizeof(float));
  const auto resized = [&](std::shared_ptr<RandomResizedCrop> t) {
    return [t, &out](const Sample& image, std::uint64_t i) {
      const PlannedCrop p = t->plan(image.shape.height, image.shape.width, i);
      t->apply_into(image, {}, p, std::span(out).first(t->output_bytes(image.shape, image.dtype)));
    };
  };
  const Normalizer normalizer(kImageNet);
  std::vector<Contender> contenders{
      {"crop_f32_nchw",
       "a plain random crop, mirrored, normalized into float32 NCHW (no resampling): the floor",
       [&](const Sample& image, std::uint64_t i) {
         const Sample& from = croppable[image.id];
         Rng r(i);
         const Window w = random_window(from.shape, size, r);
         crop_image_into(from, w, Flips::along(Axis::width), &normalizer, Layout::planar, out);
       },
       {}},
      {"rrc_f32_nchw_antialias",
       "RandomResizedCrop, mirrored, normalized into float32 NCHW, antialiased (default)",
       resized(rrc(true, true)),
       {}},
      {"rrc_f32_nchw_bilinear",
       "the same with plain 2-tap bilinear (antialias = false)",
       resized(rrc(false, true)),
       {}},
      {"rrc_u8_nhwc_antialias",
       "RandomResizedCrop into uint8 NHWC, antialiased, normalized later (in Collate)",
       resized(rrc(true, false)),
       {}},
  };
  for (int repeat = 0; repeat < common.repeats; ++repeat)
    for (Contender& c : contenders) {
      const auto t0 = Clock::now();
      for (std::size_t i = 0; i < o.crops; ++i) c.crop(images[i % images.size()], i + repeat * o.crops);
      c.rates.push_back(static_cast<double>(o.crops) / std::chrono::duration<double>(Clock::now() - t0).count());
    }
  const double floor = spread(contenders.front().rates).median;
  std::cout << "crops/s on one thread, median (min-max) of " << common.repeats << " repeats of " << o.crops
            << " crops to " << o.size << "x" << o.size << "; us per crop; time relative to the plain crop\n";
  Json results = Json::array();
  for (const Contender& c : contenders) {
    const Spread s = spread(c.rates);
    std::cout << "  " << std::left << std::setw(24) << c.name << std::right << std::fixed << std::setprecision(0)
              << std::setw(8) << s.median << " (" << s.min << "-" << s.max << ")  " << std::setprecision(1)
              << std::setw(7) << 1e6 / s.median << " us  " << std::setprecision(2) << floor / s.median << "x  "
              << c.what << "\n";
    results.push_back({{"name", c.name},
                       {"crops_per_s_median", s.median},
                       {"crops_per_s_min", s.min},
                       {"crops_per_s_max", s.max},
                       {"us_per_crop_median", 1e6 / s.median},
                       {"time_vs_plain_crop", floor / s.median},
                       {"rates", c.rates}});
  }
  return {{"config", {{"crops", o.crops}, {"size", o.size}, {"images", o.images}, {"repeats", common.repeats}}},
          {"results", results}};
}

}  // namespace

SuiteRun setup_resize(CLI::App& command) {
  auto o = std::make_shared<ResizeOptions>();
  command.add_option("--crops", o->crops, "crops per contender and repeat")->check(CLI::PositiveNumber);
  command.add_option("--size", o->size, "the crops' side")->check(CLI::Range(1u, 4096u));
  command.add_option("--images", o->images, "distinct images, 160-512 pixels a side")->check(CLI::PositiveNumber);
  return [o](const CommonOptions& common) { return run(*o, common); };
}

}  // namespace stoker::bench
