// SPDX-License-Identifier: Apache-2.0
// stoker-train --images: the training and test sets as image files (a list file or a class
// folder), decoded to gray for the model, and the test set's centre crops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/core/stage.h"
#include "stoker/stages/image.h"
#include "stoker/stages/image_source.h"
#include "stoker/stages/transforms.h"

namespace stoker::train {

struct TrainOptions;

/// The model's classes: labels must lie in 0 .. kClasses - 1.
inline constexpr int kClasses = 10;

struct ImageSets {
  std::shared_ptr<const ImageDataset> train, test;
  std::string test_source;  ///< what the test set is, for the output
};

/// --images and --test-images (or a tenth of --images drawn at random, held out), each cut to --limit
/// images. Throws DataError for a data set that cannot be read or is too small to hold a tenth
/// out, std::invalid_argument for a class folder of more classes than the model has.
ImageSets open_image_sets(const TrainOptions& o);

/// A map stage's function: an image file decoded to one gray channel (the model's input), with
/// its label. Throws DataError naming the file for a bad image, a label outside the model's
/// classes, or an image smaller than the crops.
struct DecodeForTraining {
  ImageDecoder decoder{{.color = ImageColor::gray}};
  std::uint32_t crop_size = 0;
  Sample operator()(EncodedImage in, const StageContext& ctx) const;
};

/// The test set's centre crops (crop_size, normalized with `normalize`), decoded by a pipeline on
/// the options' threads in the data set's order, and how many bad files it skipped
/// (--on-bad-input skip; with fail the first one throws StageError naming it).
struct TestCrops {
  std::vector<Sample> crops;
  std::uint64_t skipped = 0;
};
TestCrops decode_test_crops(std::shared_ptr<const ImageDataset> test, const TrainOptions& o,
                            const Normalization& normalize);

}  // namespace stoker::train
