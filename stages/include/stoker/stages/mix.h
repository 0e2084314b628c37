// SPDX-License-Identifier: Apache-2.0
// Several image data sets drawn from with weights: one pipeline source for a mixture, its order
// following from the seed and the epoch alone, shared out among ranks and resumable mid-epoch at
// another number of ranks as ImageSource is.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/core/stage.h"
#include "stoker/stages/image_source.h"

namespace stoker {

/// When a mixture's epoch ends.
enum class MixStop : std::uint8_t {
  /// At the draw that takes the last image of any data set: no image twice, and the drawn
  /// proportions follow the weights to the end (tf.data's `stop_on_empty_dataset=True`).
  first_exhausted,
  /// When every data set is used up: every image once an epoch; once one is used up, the others
  /// are drawn by their weights among themselves, so the end of an epoch holds the large ones.
  all_exhausted,
  /// After MixOptions::epoch_images draws: a data set used up starts another pass of itself, in
  /// a new order, so that a small one repeats and the proportions hold throughout (Mosaic
  /// Streaming's stream proportions; tf.data's `sample_from_datasets` over repeated data sets).
  resample,
};

struct MixOptions {
  /// One per data set, each above 0; their scale does not matter (2 and 1 is 2/3 and 1/3).
  std::vector<double> weights;
  MixStop stop = MixStop::first_exhausted;
  /// MixStop::resample: draws per epoch; 0: the data sets' sizes summed.
  std::uint64_t epoch_images = 0;
  ShardOptions shard{};  ///< this rank's share: the epoch's k-th draw goes to rank k % world
  std::uint64_t max_file_bytes = kMaxImageFileBytes;
  std::shared_ptr<BufferPool> pool = nullptr;  ///< where the files' bytes go; null: a pool of its own
  /// As ImageSourceOptions::resume_at: in that epoch, only the draws after the first `taken`,
  /// dealt to the ranks as a whole epoch is.
  std::optional<EpochCut> resume_at{};
};

/// A pipeline source of one rank's images from several data sets, each draw choosing a data set
/// by the weights:
///
///   auto web = stoker::ImageDataset::open("https://host/web-{000..099}.tar");
///   auto curated = stoker::ImageDataset::open("curated/train.txt");
///   auto pipe = stoker::PipelineBuilder{}
///                   .source("read", stoker::MixedImageSource({web, curated}, {.weights = {0.7, 0.3}}))
///                   ...
///
/// An epoch is a sequence of draws made from the pipeline's seed and the epoch with a generator
/// of its own: which data set each draw takes, by the weights among those MixOptions::stop still
/// allows, and the how-many-th of that data set's images it is. Each data set's images come in a
/// new random order every epoch, and every pass of it (MixStop::resample) in another. The epoch's
/// k-th draw goes to rank k % world, as ImageSource deals images, so the same draws in the same
/// order make the epoch whatever the ranks, and `resume_at` goes on after any number of them at
/// any number of ranks. Images come out with ids `offset(part) + the id in their data set`, and
/// their data set's names. Building an epoch's draws takes O(draws) time and about 9 bytes a draw,
/// once per epoch.
class MixedImageSource {
 public:
  /// Throws std::invalid_argument naming the option for no data set, weights that are not one
  /// per data set or not above 0, impossible ranks, or a `resume_at` that leaves no draw.
  MixedImageSource(std::vector<std::shared_ptr<const ImageDataset>> parts, MixOptions options);

  /// Draws in epoch `epoch` of a pipeline seeded with `seed`, all ranks together.
  std::uint64_t epoch_draws(std::uint64_t seed, std::uint32_t epoch) const;
  /// Images this rank reads in that epoch.
  std::uint64_t size_of(std::uint64_t seed, std::uint32_t epoch) const;
  /// The data set and the id in it of this rank's k-th image of that epoch.
  std::pair<std::size_t, std::uint64_t> draw_at(std::uint64_t seed, std::uint32_t epoch, std::uint64_t k) const;
  /// How many draws of that epoch, all ranks together, take each data set.
  std::vector<std::uint64_t> counts(std::uint64_t seed, std::uint32_t epoch) const;
  /// Where data set `part`'s ids begin among the mixture's.
  std::uint64_t offset(std::size_t part) const noexcept { return offsets_[part]; }
  const MixOptions& options() const noexcept { return options_; }

  std::optional<EncodedImage> operator()(const StageContext& ctx);
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const;

 private:
  struct Plan {
    std::uint64_t seed = 0;
    std::uint32_t epoch = 0;
    std::vector<std::uint8_t> part;  // per draw: its data set
    std::vector<std::uint64_t> nth;  // per draw: the how-many-th of its data set's images (passes on)
  };
  Plan plan(std::uint64_t seed, std::uint32_t epoch) const;
  std::uint64_t rank_draws(std::uint64_t draws, std::uint32_t epoch) const noexcept;
  std::pair<std::size_t, std::uint64_t> draw_in(const Plan& p, std::uint64_t k) const;

  std::vector<std::shared_ptr<const ImageDataset>> parts_;
  MixOptions options_;
  std::vector<std::uint64_t> offsets_;
  std::optional<Plan> plan_;  // the current epoch's
};

}  // namespace stoker
