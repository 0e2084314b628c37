// SPDX-License-Identifier: Apache-2.0
// Image data sets written to disk, with nothing to download: an ImageNet-like folder of JPEGs and
// Fashion-MNIST as PNG files. Private to apps/ and their tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/sample.h"

namespace stoker::apps {

/// Told of each file written, from the writing threads (so it must be thread-safe): what is being
/// written ("images", "tar shards", "train images"), how many of them are done, and of how many.
using Progress = std::function<void(const char* what, std::uint64_t done, std::uint64_t total)>;

struct ImageNetLikeOptions {
  std::uint32_t images = 2000;
  std::uint32_t classes = 10;
  std::uint32_t min_side = 160, max_side = 512;  ///< each side drawn uniformly in between
  int min_quality = 75, max_quality = 95;        ///< JPEG quality drawn uniformly in between
  double progressive = 0.1;                      ///< share of progressive JPEGs
  double gray = 0.02;                            ///< share of grayscale JPEGs (ImageNet has a few)
  std::uint32_t tar_shards = 0;                  ///< also write the images as WebDataset shards
  std::uint64_t seed = 0;
  int threads = 0;    ///< 0: one per core; the files do not depend on it
  Progress progress;  ///< none: nothing is told
};

/// What was written.
struct MadeData {
  std::uint64_t images = 0, bytes = 0, pixels = 0;
  std::uint64_t progressive = 0, gray = 0;
  std::vector<std::filesystem::path> lists;   ///< `path label` list files, one per split
  std::vector<std::filesystem::path> shards;  ///< tar shards, each with its wds2idx index beside it
};

/// A picture with the statistics of a natural one, for `label` of a data set seeded by `seed`:
/// 1/f noise (octaves of smooth noise, each half the size and amplitude of the last) in luminance
/// and smoother chroma, a few occluding blobs with edges, film grain, and a palette and texture
/// slope of the class's own. Interleaved uint8 of `channels` (1 or 3). The same arguments give the
/// same pixels on every machine.
Sample natural_image(BufferPool& pool, std::uint32_t height, std::uint32_t width, std::uint32_t channels,
                     std::uint32_t label, std::uint64_t seed);

/// `dir/train/class_NNN/img_NNNNNN.jpg` (image i of class i % classes) and `dir/train.txt`; with
/// tar_shards, `dir/shards/train-NNNN.tar` and their indexes too, the images dealt to the shards in
/// a seeded random order. Every file follows from the options alone (threads aside).
MadeData make_imagenet_like(const std::filesystem::path& dir, const ImageNetLikeOptions& options);

/// Fashion-MNIST's train and test splits from the IDX files in `source`, as 28x28 grayscale PNGs
/// `dir/train/<label>/NNNNN.png` and `dir/test/<label>/NNNNN.png`, with `dir/train.txt` and
/// `dir/test.txt`. `limit` > 0 writes only the first `limit` images of each split.
MadeData export_fashion_mnist(const std::filesystem::path& dir, const std::filesystem::path& source,
                              std::uint32_t limit = 0, int threads = 0, const Progress& progress = {});

}  // namespace stoker::apps
