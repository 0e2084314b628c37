// SPDX-License-Identifier: Apache-2.0
// CPU transforms of Samples: random and center crops (2D and 3D), mirrors, and the cast to
// float32 with normalization, separately and fused into one pass.
//
// Each transform is a small callable usable directly as a pipeline stage function:
//
//   const stoker::Normalization fashion{.scale = 255, .mean = {0.2860f}, .std = {0.3530f}};
//   .flat_map<stoker::Sample>("crops",
//                             stoker::RandomCrops({.size = {24, 24}, .count = 5,
//                                                  .mirror = stoker::MirrorOptions{}, .normalize = fashion}),
//                             {.threads = 2})
//
// and each step is also a plain function for use without a pipeline.
//
// Randomness: a transform draws from `sample_rng(ctx, sample.id, salt)`, a generator derived
// from the pipeline's seed, the epoch and the sample's id, so that what a sample becomes does
// not depend on which thread ran it, nor on the order samples arrive in.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/core/pipeline.h"
#include "stoker/core/random.h"
#include "stoker/stages/buffer_pool.h"
#include "stoker/stages/sample.h"

namespace stoker {

// ---------------------------------------------------------------------------------------------
// Geometry

/// The size of a crop. Depth 0 keeps a volume's whole depth; a 2D sample takes depth 0 or 1.
struct CropSize {
  std::uint32_t depth = 0, height = 0, width = 0;

  constexpr CropSize() = default;
  constexpr CropSize(std::uint32_t h, std::uint32_t w) : height(h), width(w) {}
  constexpr CropSize(std::uint32_t d, std::uint32_t h, std::uint32_t w) : depth(d), height(h), width(w) {}
  bool operator==(const CropSize&) const = default;
  std::string str() const;  ///< "24x24" or "16x32x32"
};

/// Where a crop lies in its sample: the offset of its first element along depth, height and
/// width, and its extent along each. A 2D window has z = 0 and depth = 1. Channels are kept.
struct Window {
  std::uint32_t z = 0, y = 0, x = 0;
  std::uint32_t depth = 1, height = 1, width = 1;
  bool operator==(const Window&) const = default;
};

/// A spatial axis of a sample.
enum class Axis : std::uint8_t { depth, height, width };
const char* axis_name(Axis a) noexcept;

/// Which axes a fused crop reverses.
struct Flips {
  bool depth = false, height = false, width = false;
  static constexpr Flips along(Axis a) noexcept { return {a == Axis::depth, a == Axis::height, a == Axis::width}; }
  bool operator==(const Flips&) const = default;
};

/// A random window of `size` inside a sample of shape `s`, every position equally likely.
/// Draws, in order, the depth offset (volumes only), the row and the column from `rng`.
/// Throws std::invalid_argument when the crop does not fit.
Window random_window(const Shape& s, CropSize size, Rng& rng);

/// The window of `size` in the middle of `s` (rounded towards the origin).
Window center_window(const Shape& s, CropSize size);

// ---------------------------------------------------------------------------------------------
// Normalization

/// y = (x / scale - mean[c]) / std[c], computed in float32 exactly as written, for the
/// sample's channel c. `mean` and `std` hold one value for every channel or one per channel.
/// The reference job's uint8 images: {.scale = 255, .mean = {0.2860f}, .std = {0.3530f}}.
struct Normalization {
  float scale = 1.0f;
  std::vector<float> mean{0.0f};
  std::vector<float> std{1.0f};
};

/// A validated Normalization with what it needs precomputed: a lookup table for uint8 inputs,
/// whose entries are computed with the same float expression, so both paths agree bit for bit.
/// Immutable after construction: safe to share between threads. Wherever one is taken, a
/// Normalization converts to it (`Collate{.normalize = fashion}`), so that a user writes only
/// Normalizations.
class Normalizer {
 public:
  /// Throws std::invalid_argument for a zero or non-finite scale or std, or mean and std of
  /// different lengths (other than one of them having a single value), or none at all.
  Normalizer(Normalization n);  // NOLINT(google-explicit-constructor): the one type users write

  /// (x / scale - mean[c]) / std[c].
  float operator()(float x, std::size_t channel) const noexcept {
    const std::size_t c = per_channel_ ? channel : 0;
    return (x / scale_ - mean_[c]) / std_[c];
  }
  /// The 256 outputs for uint8 inputs of `channel`.
  const float* table(std::size_t channel) const noexcept { return lut_.data() + 256 * (per_channel_ ? channel : 0); }

  /// Throws std::invalid_argument unless this normalization applies to a sample of `s`:
  /// per-channel values must match its channel count. `who` names the caller in the message.
  void check(const Shape& s, const char* who) const;
  const Normalization& options() const noexcept { return options_; }

 private:
  Normalization options_;
  float scale_;
  std::vector<float> mean_, std_;  // both of length 1, or both one per channel
  bool per_channel_;
  std::vector<float> lut_;  // 256 per channel (or one block for all)
};

// ---------------------------------------------------------------------------------------------
// Plain functions. None of them touch randomness; the callables below decide what to apply.
// Each keeps the input's label and id and throws std::invalid_argument on a bad window.

/// A copy of `window` of `in`, same dtype.
Sample crop(const Sample& in, const Window& window, BufferPool& pool);

/// Reverses `s` along `axis`, in place (a view, as a copy of its own: Buffer::data).
void mirror(Sample& s, Axis axis);

/// `in` cast to float32 and normalized. A float32 input that owns its elements is normalized in
/// place and returned.
Sample normalize(Sample in, const Normalizer& n, BufferPool& pool);

/// crop, then mirror along every axis set in `flips`, then normalize, in one pass that
/// writes each output element once. Equal, bit for bit, to doing the three in turn.
Sample crop_mirror_normalize(const Sample& in, const Window& window, Flips flips, const Normalizer& n,
                             BufferPool& pool);

/// The same into `out`, which must hold channels x window elements (e.g. a slot of a batch).
void crop_mirror_normalize_into(const Sample& in, const Window& window, Flips flips, const Normalizer& n,
                                std::span<float> out);

/// crop, then mirror along every axis set in `flips`, into `out` (the crop's bytes, same
/// dtype as `in`), in one pass.
void crop_mirror_into(const Sample& in, const Window& window, Flips flips, std::span<std::byte> out);

// ---------------------------------------------------------------------------------------------
// Randomness

/// Salts that keep the draws of different transforms of one sample independent.
inline constexpr std::uint64_t kCropSalt = 0x63726f70;        // "crop"
inline constexpr std::uint64_t kMirrorSalt = 0x6d6972726f72;  // "mirror"

/// The generator a transform with `salt` uses for the sample `id` in the call `ctx`.
inline Rng sample_rng(const StageContext& ctx, std::uint64_t id, std::uint64_t salt) noexcept {
  return Rng(derive_seed(ctx.seed ^ mix64(salt), ctx.epoch, id));
}

// ---------------------------------------------------------------------------------------------
// Stage callables. Each is immutable once built, so one object may run on many threads at once.

/// Mirror along `axis` with probability `p`, drawn per sample from sample_rng(ctx, id, salt).
struct MirrorOptions {
  Axis axis = Axis::width;
  double p = 0.5;
  std::uint64_t salt = kMirrorSalt;
};

/// How many crops to take of a sample, in [0, RandomCropOptions::count]. Called from several
/// threads at once; `rng` is the sample's own crop generator, drawn from before the windows.
using CropCount = std::function<int(const Sample&, Rng&)>;

struct RandomCropOptions {
  CropSize size{};
  /// Crops per sample; with `count_of`, the most it may return. Crop k of sample `id` gets the
  /// id `id * count + k`, so that ids stay unique and later transforms stay reproducible.
  int count = 1;
  CropCount count_of{};                      ///< optional: the number of crops, per sample
  std::optional<MirrorOptions> mirror{};     ///< fused: mirror each crop as RandomMirror would
  std::optional<Normalization> normalize{};  ///< fused: output float32 as Normalize would
  std::shared_ptr<BufferPool> pool{};        ///< where crops come from; null: a pool of its own
  std::uint64_t salt = kCropSalt;
};

/// One crop that RandomCrops takes of a sample: where it lies, the axes it reverses, its id.
struct PlannedCrop {
  Window window;
  Flips flips;
  std::uint64_t id = 0;
  bool operator==(const PlannedCrop&) const = default;
};

/// A crop that RandomCrops has drawn but not cut: the sample it comes from and where it lies.
/// A shuffle buffer then moves 56 bytes per crop rather than the crop, and Collate cuts each
/// crop straight into its batch, writing every output element once.
///
/// `source` is shared by the crops of one sample, which is freed when its last crop is
/// collated, so a queue of capacity n keeps at most n samples alive. The crops of a view of a
/// data set held in memory (Sample::viewed(): an IdxReader's samples) point at the data set's
/// own entry instead, without owning it: no reference count per crop and no allocation. Such a
/// crop is valid as long as the data set, which the reader keeps alive, and a pipeline its
/// reader, for as long as any of its items is in the pipeline; a crop kept after both are gone
/// dangles.
struct DeferredCrop {
  std::shared_ptr<const Sample> source;
  PlannedCrop crop;
};

/// 1 -> k random crops of a sample (a flat_map function). With `mirror` or `normalize` set
/// it is the fused path: each crop is written once, already mirrored and normalized, and
/// equals bit for bit what RandomCrops, RandomMirror and Normalize give one after the other.
///
/// As `flat_map<DeferredCrop>` it draws the same crops without cutting them, and Collate
/// (with `normalize`, if any) cuts them into the batch: the same batches, bit for bit, with
/// each crop written once instead of twice. Then `normalize` belongs to Collate, not here.
class RandomCrops {
 public:
  /// Throws std::invalid_argument for an empty size, a count below 1, p outside [0, 1] or a
  /// bad normalization, naming the option. Crops that do not fit a sample throw when it comes.
  explicit RandomCrops(RandomCropOptions options);

  void operator()(Sample in, Emitter<Sample>& emit, const StageContext& ctx) const;
  /// The crops of `in`, drawn but not cut. Throws std::invalid_argument if the option
  /// `normalize` is set: deferred crops are normalized by Collate.
  void operator()(Sample in, Emitter<DeferredCrop>& emit, const StageContext& ctx) const;
  /// The crops of `in`, without a pipeline.
  std::vector<Sample> apply(const Sample& in, const StageContext& ctx = {}) const;

  /// Appends to `out` the crops that operator() takes of `in` in the call `ctx`, in the
  /// order it emits them, without cutting them: every random draw RandomCrops makes, for
  /// whoever cuts the crops elsewhere (a device). Reads only the shape, label and id of
  /// `in`, unless `count_of` looks at its data. Throws as operator() does for a sample
  /// that the crops do not fit.
  void plan(const Sample& in, const StageContext& ctx, std::vector<PlannedCrop>& out) const;
  std::vector<PlannedCrop> plan(const Sample& in, const StageContext& ctx = {}) const;

  const RandomCropOptions& options() const noexcept { return options_; }
  /// The validated `normalize` option; null when there is none.
  const Normalizer* normalizer() const noexcept { return normalizer_ ? &*normalizer_ : nullptr; }
  BufferPool& pool() const noexcept { return *options_.pool; }

 private:
  // Calls f(crop) for each crop it takes of `in` in the call `ctx`, in order, as drawn.
  template <class F>
  void draw(const Sample& in, const StageContext& ctx, F&& f) const;
  // Cuts each crop and calls emit(crop).
  template <class Emit>
  void cut(const Sample& in, const StageContext& ctx, Emit&& emit) const;

  RandomCropOptions options_;
  std::optional<Normalizer> normalizer_;
};

struct CenterCropOptions {
  CropSize size{};
  std::optional<Normalization> normalize{};  ///< fused: output float32 as Normalize would
  std::shared_ptr<BufferPool> pool{};        ///< null: a pool of its own
};

/// The crop in the middle of each sample, for evaluation (a map function). Keeps the id.
class CenterCrop {
 public:
  explicit CenterCrop(CenterCropOptions options);
  Sample operator()(Sample in) const;
  BufferPool& pool() const noexcept { return *options_.pool; }
  const CenterCropOptions& options() const noexcept { return options_; }

 private:
  CenterCropOptions options_;
  std::optional<Normalizer> normalizer_;
};

/// Mirrors a sample in place with probability p (a map function). Allocates nothing, but
/// for a view (an IdxReader's sample), which it mirrors as a copy of its own (Buffer::data).
class RandomMirror {
 public:
  explicit RandomMirror(MirrorOptions options = {});
  Sample operator()(Sample in, const StageContext& ctx) const;
  /// Whether the sample `id` is mirrored in the call `ctx`.
  bool draw(const StageContext& ctx, std::uint64_t id) const noexcept {
    Rng rng = sample_rng(ctx, id, options_.salt);
    return rng.bernoulli(options_.p);
  }
  const MirrorOptions& options() const noexcept { return options_; }

 private:
  MirrorOptions options_;
};

/// Cast to float32 and normalize (a map function). Float32 inputs are normalized in place.
class Normalize {
 public:
  explicit Normalize(Normalization n, std::shared_ptr<BufferPool> pool = nullptr);
  Sample operator()(Sample in) const;
  BufferPool& pool() const noexcept { return *pool_; }
  const Normalizer& normalizer() const noexcept { return normalizer_; }

 private:
  Normalizer normalizer_;
  std::shared_ptr<BufferPool> pool_;
};

}  // namespace stoker
