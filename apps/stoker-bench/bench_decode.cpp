// SPDX-License-Identifier: Apache-2.0
// The `decode` suite: what decoding only a crop's window, and DCT scaling, gain over decoding the
// whole JPEG and cutting the crop out of it. Each JPEG of a list gets one crop window drawn as
// RandomResizedCrop draws them (area 8% to 100%, aspect ratio 3/4 to 4/3, 10 tries, then the
// centred largest) for an output of --size pixels; on one thread, interleaved in every repeat:
//   - full_decode_crop: TurboJPEG decodes the whole image, the window is copied out (the baseline);
//   - full_decode_dct_scaled: the whole image at the smallest n/8 that keeps the window >= --size;
//   - window_decode: libjpeg decodes only the window's rows and iMCU columns, at full resolution;
//   - window_dct_scaled: the window only, at that smallest n/8.
// The files are read into memory first: this measures decoding, not reading.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_suite.h"
#include "stoker/core/random.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"

namespace stoker::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct DecodeBenchOptions {
  std::string data;
  std::uint32_t size = 224;
  std::uint64_t images = 500;  // 0: all
  std::uint64_t seed = 0;
};

struct Image {
  EncodedImage encoded;
  ImageInfo info;
  PixelRect window;
};

// torchvision's RandomResizedCrop.get_params: scale 0.08-1 of the area, log-uniform ratio 3/4-4/3,
// 10 tries, then the centred crop of the ratio clamped to the image's.
PixelRect crop_window(std::uint32_t width, std::uint32_t height, Rng& rng) {
  const auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * double(rng() >> 11) * 0x1.0p-53; };
  const double area = double(width) * height;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(0.08, 1.0);
    const double ratio = std::exp(uniform(std::log(3.0 / 4), std::log(4.0 / 3)));
    const auto w = static_cast<std::uint32_t>(std::lround(std::sqrt(target * ratio)));
    const auto h = static_cast<std::uint32_t>(std::lround(std::sqrt(target / ratio)));
    if (w > 0 && h > 0 && w <= width && h <= height)
      return {static_cast<std::uint32_t>(rng.below(width - w + 1)),
              static_cast<std::uint32_t>(rng.below(height - h + 1)), w, h};
  }
  const double in_ratio = double(width) / height;
  std::uint32_t w = width, h = height;
  if (in_ratio < 3.0 / 4)
    h = static_cast<std::uint32_t>(std::lround(width / (3.0 / 4)));
  else if (in_ratio > 4.0 / 3)
    w = static_cast<std::uint32_t>(std::lround(height * (4.0 / 3)));
  return {(width - w) / 2, (height - h) / 2, w, h};
}

struct Method {
  const char* name;
  const char* what;
};
constexpr Method kMethods[] = {
    {"full_decode_crop", "whole image (TurboJPEG), window copied out"},
    {"full_decode_dct_scaled", "whole image at the smallest n/8 that keeps the window >= size"},
    {"window_decode", "window only (libjpeg crop + skip), full resolution"},
    {"window_dct_scaled", "window only, at that smallest n/8"},
};

// Decodes every image with method `m`; returns the pixels decoded (a measure of the work).
std::uint64_t decode_all(int m, const std::vector<Image>& images, BufferPool& pool, std::uint32_t size) {
  std::uint64_t pixels = 0;
  for (const auto& im : images) {
    const PixelRect& w = im.window;
    const auto bytes = im.encoded.bytes();
    const auto& name = im.encoded.name;
    if (m == 0) {
      const Sample whole = decode_image(bytes, name, pool);
      Sample crop(pool, {.channels = 3, .height = w.height, .width = w.width, .channels_last = true}, DType::u8);
      const std::size_t row = std::size_t{w.width} * 3, stride = std::size_t{whole.shape.width} * 3;
      for (std::uint32_t y = 0; y < w.height; ++y)
        std::memcpy(crop.data.data() + y * row, whole.data.data() + (w.y + y) * stride + std::size_t{w.x} * 3, row);
      pixels += whole.shape.width * whole.shape.height;
    } else if (m == 1) {
      // The whole image, scaled so that the window's part of it stays >= size.
      const auto grow = [](std::uint32_t side, std::uint32_t part, std::uint32_t min) {
        return static_cast<std::uint32_t>((std::uint64_t{min} * side + part - 1) / part);
      };
      const DecodedWindow d =
          decode_window(bytes, name, pool,
                        {.window = {0, 0, im.info.width, im.info.height},
                         .min_width = std::min(im.info.width, grow(im.info.width, w.width, size)),
                         .min_height = std::min(im.info.height, grow(im.info.height, w.height, size))});
      pixels += d.image.shape.width * d.image.shape.height;
    } else {
      const DecodedWindow d =
          decode_window(bytes, name, pool,
                        {.window = w, .min_width = m == 2 ? w.width : size, .min_height = m == 2 ? w.height : size});
      pixels += d.image.shape.width * d.image.shape.height;
    }
  }
  return pixels;
}

Json run(const DecodeBenchOptions& o, const CommonOptions& common) {
  const auto data = ImageDataset::open(o.data);
  auto pool = BufferPool::create();
  std::vector<Image> images;
  std::uint64_t skipped = 0;
  for (std::uint64_t id = 0; id < data->size() && (o.images == 0 || images.size() < o.images); ++id) {
    EncodedImage e = data->read(id, *pool);
    if (image_format(e.bytes(), e.name) != ImageFormat::jpeg) {
      ++skipped;
      continue;
    }
    const ImageInfo info = read_image_info(e.bytes(), e.name);
    Rng rng(derive_seed(o.seed, id));
    images.push_back({std::move(e), info, crop_window(info.width, info.height, rng)});
  }
  if (images.empty()) throw std::runtime_error(o.data + ": no JPEG in the data set");
  std::uint64_t encoded_bytes = 0, full_pixels = 0;
  for (const auto& im : images) {
    encoded_bytes += im.encoded.data.size();
    full_pixels += std::uint64_t{im.info.width} * im.info.height;
  }
  std::cout << "decode: " << images.size() << " JPEGs of " << o.data << " (mean " << full_pixels / images.size()
            << " pixels, " << encoded_bytes / images.size() << " bytes"
            << (skipped ? ", " + std::to_string(skipped) + " PNGs left out" : "") << "), one crop window each for "
            << o.size << "x" << o.size << ", one thread\n";

  constexpr int kCount = static_cast<int>(std::size(kMethods));
  std::vector<std::vector<double>> rates(kCount), ratios(kCount);
  std::vector<std::uint64_t> pixels(kCount);
  decode_all(0, images, *pool, o.size);  // warm up: pool buffers, page faults, code
  for (int r = 0; r < common.repeats; ++r) {
    double seconds[kCount];
    for (int m = 0; m < kCount; ++m) {  // interleaved, so that the machine's load hits every method alike
      const auto t0 = Clock::now();
      pixels[m] = decode_all(m, images, *pool, o.size);
      seconds[m] = std::chrono::duration<double>(Clock::now() - t0).count();
      rates[m].push_back(images.size() / seconds[m]);
    }
    for (int m = 0; m < kCount; ++m) ratios[m].push_back(seconds[0] / seconds[m]);
  }
  Json results = Json::array();
  for (int m = 0; m < kCount; ++m) {
    const Spread s = spread(rates[m]), q = spread(ratios[m]);
    std::cout << "  " << kMethods[m].name << ": " << s.median << " images/s (min " << s.min << ", max " << s.max
              << "), " << q.median << "x the full decode; " << pixels[m] / images.size()
              << " pixels decoded per image\n";
    results.push_back({{"name", kMethods[m].name},
                       {"what", kMethods[m].what},
                       {"images_per_s_median", s.median},
                       {"images_per_s_min", s.min},
                       {"images_per_s_max", s.max},
                       {"speedup_over_full_decode_median", q.median},
                       {"speedup_over_full_decode_min", q.min},
                       {"speedup_over_full_decode_max", q.max},
                       {"pixels_decoded_per_image", pixels[m] / images.size()}});
  }
  return {{"config",
           {{"data", o.data},
            {"images", images.size()},
            {"mean_pixels", full_pixels / images.size()},
            {"mean_bytes", encoded_bytes / images.size()},
            {"size", o.size},
            {"seed", o.seed},
            {"threads", 1},
            {"repeats", common.repeats}}},
          {"results", results}};
}

}  // namespace

SuiteRun setup_decode(CLI::App& command) {
  auto o = std::make_shared<DecodeBenchOptions>();
  command.add_option("--data", o->data, "A list file, class folder or .tar of JPEGs (stoker-make-data imagenet)")
      ->required();
  command.add_option("--size", o->size, "The crop's output side: DCT scaling keeps the window at least this big")
      ->check(apps::in_range(1u, 4096u))
      ->capture_default_str();
  command.add_option("--images", o->images, "Use the first N JPEGs (0: all)")->capture_default_str();
  command.add_option("--seed", o->seed, "Seed of the crop windows")->capture_default_str();
  return [o](const CommonOptions& common) { return run(*o, common); };
}

}  // namespace stoker::bench
