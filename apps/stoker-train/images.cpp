// SPDX-License-Identifier: Apache-2.0
#include "images.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <utility>

#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/stages/reader.h"
#include "train.h"

namespace stoker::train {

namespace {

constexpr std::uint64_t kHeldOutSeed = 0x68656c646f7574;  // "heldout"

// The first `limit` images of `data` (--limit); all of them for 0.
std::shared_ptr<const ImageDataset> first(std::shared_ptr<const ImageDataset> data, std::size_t limit) {
  if (limit == 0 || limit >= data->size()) return data;
  std::vector<std::uint64_t> ids(limit);
  for (std::size_t i = 0; i < limit; ++i) ids[i] = i;
  return data->subset(ids);
}

std::shared_ptr<const ImageDataset> open(const std::string& path, const char* option, const TrainOptions& o) {
  RemoteOptions remote;
  remote.cache_dir = o.cache;
  remote.cache_bytes = o.cache_bytes;
  auto data = ImageDataset::open(path, remote);
  if (data->classes().size() > static_cast<std::size_t>(kClasses))
    throw std::invalid_argument(std::string(option) + " " + path + ": " + std::to_string(data->classes().size()) +
                                " classes, but the model has " + std::to_string(kClasses) + " outputs");
  return data;
}

}  // namespace

ImageSets open_image_sets(const TrainOptions& o) {
  ImageSets sets;
  auto all = open(o.images, "--images", o);
  if (!o.test_images.empty()) {
    sets.train = first(std::move(all), o.limit);
    sets.test = first(open(o.test_images, "--test-images", o), o.limit);
    sets.test_source = o.test_images;
    return sets;
  }
  // A tenth drawn at random, the same every run (a fixed seed, not --seed: runs of other seeds
  // test on the same images). Neither the last tenth nor every 10th image: a list in class order,
  // or one that deals the classes in turn, would leave classes out of one of the sets.
  if (all->size() < 10)
    throw DataError(o.images, "holds " + std::to_string(all->size()) +
                                  " images, too few to hold a tenth out for testing: give --test-images");
  std::vector<std::uint64_t> ids(all->size());
  std::iota(ids.begin(), ids.end(), std::uint64_t{0});
  Rng rng(kHeldOutSeed);
  const std::size_t held_out = ids.size() / 10;
  for (std::size_t i = 0; i < held_out; ++i) std::swap(ids[i], ids[i + rng.below(ids.size() - i)]);
  std::vector<std::uint64_t> test(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(held_out));
  std::vector<std::uint64_t> train(ids.begin() + static_cast<std::ptrdiff_t>(held_out), ids.end());
  std::sort(test.begin(), test.end());
  std::sort(train.begin(), train.end());
  sets.train = first(all->subset(train), o.limit);
  sets.test = first(all->subset(test), o.limit);
  sets.test_source = "a tenth of " + o.images + " drawn at random, held out";
  return sets;
}

Sample DecodeForTraining::operator()(EncodedImage in, const StageContext& ctx) const {
  if (in.label < 0 || in.label >= kClasses)
    throw DataError(in.name, "label " + std::to_string(in.label) + " is not one of the model's " +
                                 std::to_string(kClasses) + " classes (0 to " + std::to_string(kClasses - 1) + ")");
  std::string name = in.name;
  Sample image = decoder(std::move(in), ctx);
  if (image.shape.height < crop_size || image.shape.width < crop_size)
    throw DataError(name, "is " + std::to_string(image.shape.width) + "x" + std::to_string(image.shape.height) +
                              ", smaller than the " + std::to_string(crop_size) + "x" + std::to_string(crop_size) +
                              " crops (--image-size)");
  return image;
}

TestCrops decode_test_crops(std::shared_ptr<const ImageDataset> test, const TrainOptions& o,
                            const Normalization& normalize) {
  const OnError on_bad = o.on_bad_input == "skip" ? OnError::skip : OnError::fail;
  const int threads = std::max(1, o.crop_threads);
  auto pipe =
      PipelineBuilder{}
          .threads(o.threads)
          .budget(o.budget)
          .seed(o.seed)
          .epochs(1)
          .source("read_test", ImageSource(std::move(test), {.order = ImageOrder::fixed}), {.on_error = on_bad})
          .map("decode_test", DecodeForTraining{.crop_size = o.crop_size}, {.threads = threads, .on_error = on_bad})
          .map("center_crop", CenterCrop({.size = {o.crop_size, o.crop_size}, .normalize = normalize}),
               {.threads = threads})
          .build();
  TestCrops out;
  for (Sample& crop : pipe.epoch()) out.crops.push_back(std::move(crop));
  for (const StageStats& s : pipe.summary().stages) out.skipped += s.skipped;
  return out;
}

}  // namespace stoker::train
