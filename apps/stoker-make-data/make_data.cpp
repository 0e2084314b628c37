// SPDX-License-Identifier: Apache-2.0
#include "make_data.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "stoker/core/random.h"
#include "stoker/stages/idx.h"
#include "stoker/stages/image_encode.h"
#include "stoker/stages/shard.h"
#include "stoker/stages/tar.h"

namespace stoker::apps {

namespace fs = std::filesystem;

namespace {

double uniform(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }
double uniform(Rng& rng, double lo, double hi) { return lo + (hi - lo) * uniform(rng); }

// Octaves of smooth value noise, from a grid spacing of half the image down to `finest`, each
// octave's amplitude 2^-slope times the last: slope 1 gives the 1/f amplitude spectrum of natural
// images. Scaled to unit variance.
std::vector<float> fractal(std::uint32_t h, std::uint32_t w, Rng& rng, double slope, std::uint32_t finest) {
  std::vector<float> field(std::size_t{h} * w, 0.0f);
  std::vector<std::uint32_t> cell(w);
  std::vector<float> weight(w);
  double amplitude = 1.0;
  for (std::uint32_t spacing = std::max(1u, std::bit_ceil(std::max(h, w)) / 2); spacing >= finest;
       spacing /= 2, amplitude *= std::pow(2.0, -slope)) {
    const std::uint32_t gw = w / spacing + 2, gh = h / spacing + 2;
    std::vector<float> grid(std::size_t{gw} * gh);
    for (auto& g : grid) g = static_cast<float>(amplitude * uniform(rng, -1, 1));
    const auto smooth = [](double t) { return static_cast<float>(t * t * (3 - 2 * t)); };
    for (std::uint32_t x = 0; x < w; ++x) {
      cell[x] = x / spacing;
      weight[x] = smooth(double(x % spacing) / spacing);
    }
    for (std::uint32_t y = 0; y < h; ++y) {
      const float ty = smooth(double(y % spacing) / spacing);
      const float* row0 = grid.data() + std::size_t{y / spacing} * gw;
      const float* row1 = row0 + gw;
      float* out = field.data() + std::size_t{y} * w;
      for (std::uint32_t x = 0; x < w; ++x) {
        const std::uint32_t c = cell[x];
        const float tx = weight[x];
        const float top = row0[c] + tx * (row0[c + 1] - row0[c]);
        const float bottom = row1[c] + tx * (row1[c + 1] - row1[c]);
        out[x] += top + ty * (bottom - top);
      }
    }
    if (spacing == 1) break;
  }
  double sum = 0, squares = 0;
  for (const float v : field) sum += v, squares += double(v) * v;
  const double mean = sum / field.size(), sd = std::sqrt(std::max(1e-12, squares / field.size() - mean * mean));
  for (auto& v : field) v = static_cast<float>((v - mean) / sd);
  return field;
}

// Runs `body(i)` for i in [0, n) on `threads` threads (0: one per core), telling `progress` of
// each `what` done; rethrows the first error.
void parallel_for(std::uint64_t n, int threads, const char* what, const Progress& progress,
                  const std::function<void(std::uint64_t)>& body) {
  const int count = threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<std::uint64_t> next{0}, done{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  {
    std::vector<std::jthread> workers;
    for (int t = 0; t < count; ++t)
      workers.emplace_back([&] {
        for (std::uint64_t i; (i = next.fetch_add(1)) < n;) {
          try {
            body(i);
            const std::uint64_t d = done.fetch_add(1) + 1;
            if (progress) progress(what, d, n);
          } catch (...) {
            std::lock_guard lock(error_mutex);
            if (!error) error = std::current_exception();
            next = n;
          }
        }
      });
  }
  if (error) std::rethrow_exception(error);
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::byte> bytes(fs::file_size(path));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return bytes;
}

std::string numbered(const char* format, std::uint64_t n) {
  char text[64];
  std::snprintf(text, sizeof text, format, static_cast<unsigned long long>(n));
  return text;
}

}  // namespace

Sample natural_image(BufferPool& pool, std::uint32_t height, std::uint32_t width, std::uint32_t channels,
                     std::uint32_t label, std::uint64_t seed) {
  if (channels != 1 && channels != 3) throw std::invalid_argument("natural_image: 1 or 3 channels");
  // What the class gives every one of its images: a palette and a texture slope.
  Rng klass(derive_seed(0x5eed, label, hash_name("class")));
  const double base[3] = {uniform(klass, 60, 190), uniform(klass, 60, 190), uniform(klass, 60, 190)};
  const double class_slope = uniform(klass, 0.45, 0.75);
  Rng rng(seed);
  const double slope = class_slope + uniform(rng, -0.1, 0.1);
  const double contrast = uniform(rng, 22, 40), chroma = uniform(rng, 8, 22), grain = uniform(rng, 4, 11);
  // Luminance: 1/f noise, and a ridged copy (its absolute value) whose creases look like the
  // texture of rock, bark or foliage rather than clouds.
  auto luminance = fractal(height, width, rng, slope, 1);
  const auto ridges = fractal(height, width, rng, slope, 1);
  const double ridged = uniform(rng, 0.3, 1.0);
  for (std::size_t i = 0; i < luminance.size(); ++i)
    luminance[i] += static_cast<float>(ridged * (1.6 * std::abs(ridges[i]) - 1.3));
  std::vector<float> c1, c2;
  if (channels == 3) {  // chroma varies more slowly than luminance in natural images
    c1 = fractal(height, width, rng, slope + 0.3, 4);
    c2 = fractal(height, width, rng, slope + 0.3, 4);
  }
  // Occluding shapes, ellipses and boxes of their own tone: the edges of objects.
  struct Blob {
    double cx, cy, rx, ry, shift[3];
    bool box;
  };
  std::vector<Blob> blobs(2 + rng.below(10));
  for (auto& b : blobs) {
    b = {uniform(rng) * width,
         uniform(rng) * height,
         uniform(rng, 0.03, 0.3) * width,
         uniform(rng, 0.03, 0.3) * height,
         {},
         uniform(rng) < 0.3};
    const double tone = uniform(rng, -50, 50);
    for (auto& s : b.shift) s = tone + uniform(rng, -25, 25);
  }
  Sample image(pool, {.channels = channels, .height = height, .width = width, .channels_last = true}, DType::u8);
  auto* out = reinterpret_cast<std::uint8_t*>(image.data.data());
  const double gray_base = (base[0] + base[1] + base[2]) / 3;
  for (std::uint32_t y = 0; y < height; ++y)
    for (std::uint32_t x = 0; x < width; ++x) {
      const std::size_t i = std::size_t{y} * width + x;
      double shift[3] = {0, 0, 0};
      for (const auto& b : blobs) {
        const double dx = (x - b.cx) / b.rx, dy = (y - b.cy) / b.ry;
        if (b.box ? std::abs(dx) < 1 && std::abs(dy) < 1 : dx * dx + dy * dy < 1)
          for (int c = 0; c < 3; ++c) shift[c] = b.shift[c];
      }
      const double lum = contrast * luminance[i];
      const double noise = grain * (uniform(rng) + uniform(rng) + uniform(rng) - 1.5) * 2;
      const auto put = [&](double v) { *out++ = static_cast<std::uint8_t>(std::clamp(std::lround(v), 0L, 255L)); };
      if (channels == 1) {
        put(gray_base + lum + (shift[0] + shift[1] + shift[2]) / 3 + noise);
      } else {
        put(base[0] + lum + shift[0] + chroma * 0.8 * c1[i] + noise);
        put(base[1] + lum + shift[1] + chroma * (-0.4 * c1[i] + 0.6 * c2[i]) + noise);
        put(base[2] + lum + shift[2] + chroma * (-0.4 * c1[i] - 0.6 * c2[i]) + noise);
      }
    }
  return image;
}

MadeData make_imagenet_like(const fs::path& dir, const ImageNetLikeOptions& o) {
  if (o.images == 0 || o.classes == 0) throw std::invalid_argument("images and classes must be at least 1");
  if (o.min_side < 8 || o.min_side > o.max_side) throw std::invalid_argument("need 8 <= min_side <= max_side");
  if (o.min_quality < 1 || o.min_quality > o.max_quality || o.max_quality > 100)
    throw std::invalid_argument("need 1 <= min_quality <= max_quality <= 100");
  const auto image_path = [&](std::uint64_t i) {
    return fs::path("train") / numbered("class_%03llu", i % o.classes) / numbered("img_%06llu.jpg", i);
  };
  for (std::uint32_t c = 0; c < o.classes; ++c) fs::create_directories(dir / "train" / numbered("class_%03llu", c));
  std::atomic<std::uint64_t> bytes{0}, pixels{0}, progressive{0}, gray{0};
  parallel_for(o.images, o.threads, "images", o.progress, [&](std::uint64_t i) {
    Rng rng(derive_seed(o.seed, i, hash_name("image")));
    const auto side = [&] { return o.min_side + static_cast<std::uint32_t>(rng.below(o.max_side - o.min_side + 1)); };
    const std::uint32_t width = side(), height = side();
    JpegEncodeOptions jpeg{.quality = o.min_quality + static_cast<int>(rng.below(o.max_quality - o.min_quality + 1))};
    const double s = uniform(rng);
    jpeg.subsampling = s < 0.9 ? ChromaSubsampling::s420 : s < 0.95 ? ChromaSubsampling::s422 : ChromaSubsampling::s444;
    jpeg.progressive = uniform(rng) < o.progressive;
    const bool is_gray = uniform(rng) < o.gray;
    auto pool = BufferPool::create(0);
    const Sample image = natural_image(*pool, height, width, is_gray ? 1 : 3, static_cast<std::uint32_t>(i % o.classes),
                                       derive_seed(o.seed, i));
    const auto encoded = encode_jpeg(image, jpeg);
    write_file(dir / image_path(i), encoded);
    bytes += encoded.size();
    pixels += std::uint64_t{width} * height;
    progressive += jpeg.progressive;
    gray += is_gray;
  });
  MadeData made{o.images, bytes, pixels, progressive, gray, {dir / "train.txt"}, {}};
  {
    std::ofstream list(made.lists[0], std::ios::trunc);
    for (std::uint64_t i = 0; i < o.images; ++i) list << image_path(i).generic_string() << ' ' << i % o.classes << '\n';
    if (!list) throw std::runtime_error("cannot write " + made.lists[0].string());
  }
  if (o.tar_shards > 0) {
    // Every shard a mix of classes: the images in a seeded random order, dealt in turn.
    fs::create_directories(dir / "shards");
    const Permutation order(o.images, derive_seed(o.seed, hash_name("shards")));
    for (std::uint32_t s = 0; s < o.tar_shards; ++s)
      made.shards.push_back(dir / "shards" / numbered("train-%04llu.tar", s));
    parallel_for(o.tar_shards, o.threads, "tar shards", o.progress, [&](std::uint64_t s) {
      TarWriter tar(made.shards[s]);
      for (std::uint64_t k = s; k < o.images; k += o.tar_shards) {
        const std::uint64_t i = order(k);
        const std::string key = numbered("img_%06llu", i);
        tar.add(key + ".jpg", read_file(dir / image_path(i)));
        tar.add(key + ".cls", std::to_string(i % o.classes));
      }
      tar.finish();
      write_wds_index(wds_index_path(made.shards[s]), tar.members());
    });
  }
  return made;
}

MadeData export_fashion_mnist(const fs::path& dir, const fs::path& source, std::uint32_t limit, int threads,
                              const Progress& progress) {
  MadeData made;
  for (const auto& [split, idx_split] : {std::pair{"train", "train"}, std::pair{"test", "t10k"}}) {
    const IdxReader reader(fashion_mnist(source, idx_split));
    const std::uint64_t n = limit > 0 ? std::min<std::uint64_t>(limit, reader.size()) : reader.size();
    const auto image_path = [&](std::uint64_t i, std::int32_t label) {
      return fs::path(split) / std::to_string(label) / numbered("%05llu.png", i);
    };
    // A folder per label that occurs (with a limit, some may not): ImageFolder refuses empty ones.
    std::vector<std::int32_t> labels(reader.dataset().labels.begin(), reader.dataset().labels.begin() + n);
    for (const auto label : std::set<std::int32_t>(labels.begin(), labels.end()))
      fs::create_directories(dir / split / std::to_string(label));
    std::atomic<std::uint64_t> bytes{0};
    const char* what = split == std::string("train") ? "train images" : "test images";
    parallel_for(n, threads, what, progress, [&](std::uint64_t i) {
      const Sample image = reader.read(i);
      const auto png = encode_png(image);
      write_file(dir / image_path(i, image.label), png);
      bytes += png.size();
    });
    made.lists.push_back(dir / (std::string(split) + ".txt"));
    std::ofstream list(made.lists.back(), std::ios::trunc);
    for (std::uint64_t i = 0; i < n; ++i) list << image_path(i, labels[i]).generic_string() << ' ' << labels[i] << '\n';
    if (!list) throw std::runtime_error("cannot write " + made.lists.back().string());
    made.images += n;
    made.bytes += bytes;
    made.pixels += n * 28 * 28;
    made.gray += n;
  }
  return made;
}

}  // namespace stoker::apps
