// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/mix.h"

#include <cmath>
#include <stdexcept>

#include "stoker/core/random.h"

namespace stoker {

namespace {

constexpr std::size_t kMaxParts = 255;  // a draw's data set is a byte

const char* stop_name(MixStop s) {
  return s == MixStop::first_exhausted ? "first exhausted" : s == MixStop::all_exhausted ? "all exhausted" : "resample";
}

}  // namespace

MixedImageSource::MixedImageSource(std::vector<std::shared_ptr<const ImageDataset>> parts, MixOptions options)
    : parts_(std::move(parts)), options_(std::move(options)) {
  if (parts_.empty()) throw std::invalid_argument("MixedImageSource: no data set to mix");
  if (parts_.size() > kMaxParts)
    throw std::invalid_argument("MixedImageSource: " + std::to_string(parts_.size()) + " data sets, over the " +
                                std::to_string(kMaxParts) + " one mixture can draw from");
  if (options_.weights.size() != parts_.size())
    throw std::invalid_argument("MixedImageSource: MixOptions::weights has " + std::to_string(options_.weights.size()) +
                                " weights for " + std::to_string(parts_.size()) + " data sets: give one each");
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    if (!parts_[i]) throw std::invalid_argument("MixedImageSource: data set " + std::to_string(i) + " is null");
    if (!(options_.weights[i] > 0) || !std::isfinite(options_.weights[i]))
      throw std::invalid_argument("MixedImageSource: MixOptions::weights[" + std::to_string(i) + "] is " +
                                  std::to_string(options_.weights[i]) + ": each weight must be above 0 and finite");
  }
  options_.shard.check("MixedImageSource");
  if (!options_.pool) options_.pool = BufferPool::create();
  offsets_.push_back(0);
  for (const auto& p : parts_) offsets_.push_back(offsets_.back() + p->size());
  if (options_.stop == MixStop::resample && options_.epoch_images == 0) options_.epoch_images = offsets_.back();
  if (options_.resume_at && options_.resume_at->taken >= epoch_draws(0, options_.resume_at->epoch) &&
      options_.stop != MixStop::first_exhausted)  // first_exhausted's length depends on the seed: checked per epoch
    throw std::invalid_argument("MixedImageSource: resume_at.taken (" + std::to_string(options_.resume_at->taken) +
                                ") leaves no draw of the epoch's " +
                                std::to_string(epoch_draws(0, options_.resume_at->epoch)));
}

MixedImageSource::Plan MixedImageSource::plan(std::uint64_t seed, std::uint32_t epoch) const {
  Plan p{seed, epoch, {}, {}};
  const std::size_t n = parts_.size();
  std::vector<std::uint64_t> taken(n, 0);
  std::vector<double> weight = options_.weights;
  double total = 0;
  for (double w : weight) total += w;
  std::size_t left = n;  // data sets not used up (all_exhausted)
  const std::uint64_t expected = options_.stop == MixStop::resample ? options_.epoch_images : offsets_.back();
  p.part.reserve(expected);
  p.nth.reserve(expected);
  Rng rng(derive_seed(seed, epoch, hash_name("MixedImageSource")));
  while (true) {
    if (options_.stop == MixStop::resample && p.part.size() == options_.epoch_images) break;
    if (options_.stop == MixStop::all_exhausted && left == 0) break;
    // A weighted draw among the data sets still allowed: u uniform in [0, total).
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
    double below = 0;
    std::size_t c = n;
    for (std::size_t i = 0; i < n; ++i) {
      if (weight[i] == 0) continue;
      c = i;  // the last allowed one takes what rounding leaves past the end
      below += weight[i];
      if (u < below) break;
    }
    p.part.push_back(static_cast<std::uint8_t>(c));
    p.nth.push_back(taken[c]++);
    if (taken[c] == parts_[c]->size()) {
      if (options_.stop == MixStop::first_exhausted) break;
      if (options_.stop == MixStop::all_exhausted) {
        total -= weight[c];
        weight[c] = 0;
        --left;
      }
    }
  }
  return p;
}

std::uint64_t MixedImageSource::epoch_draws(std::uint64_t seed, std::uint32_t epoch) const {
  switch (options_.stop) {
    case MixStop::all_exhausted:
      return offsets_.back();
    case MixStop::resample:
      return options_.epoch_images;
    case MixStop::first_exhausted:
      break;
  }
  if (plan_ && plan_->seed == seed && plan_->epoch == epoch) return plan_->part.size();
  return plan(seed, epoch).part.size();
}

std::uint64_t MixedImageSource::rank_draws(std::uint64_t draws, std::uint32_t epoch) const noexcept {
  const auto& cut = options_.resume_at;
  if (cut && cut->epoch == epoch) return cut->taken < draws ? options_.shard.per_rank(draws - cut->taken) : 0;
  return options_.shard.per_rank(draws);
}

std::uint64_t MixedImageSource::size_of(std::uint64_t seed, std::uint32_t epoch) const {
  return rank_draws(epoch_draws(seed, epoch), epoch);
}

std::pair<std::size_t, std::uint64_t> MixedImageSource::draw_in(const Plan& p, std::uint64_t k) const {
  const std::uint64_t draws = p.part.size();
  const auto& cut = options_.resume_at;
  const std::uint64_t j = cut && cut->epoch == p.epoch ? cut->taken + options_.shard.place(draws - cut->taken, k)
                                                       : options_.shard.place(draws, k);
  const std::size_t c = p.part[j];
  const std::uint64_t size = parts_[c]->size(), pass = p.nth[j] / size;
  // Each pass of each data set in an order of its own.
  const Permutation order(size, derive_seed(p.seed, p.epoch, derive_seed(hash_name("MixedImageSource part"), c, pass)));
  return {c, order(p.nth[j] % size)};
}

std::pair<std::size_t, std::uint64_t> MixedImageSource::draw_at(std::uint64_t seed, std::uint32_t epoch,
                                                                std::uint64_t k) const {
  if (plan_ && plan_->seed == seed && plan_->epoch == epoch) return draw_in(*plan_, k);
  return draw_in(plan(seed, epoch), k);
}

std::vector<std::uint64_t> MixedImageSource::counts(std::uint64_t seed, std::uint32_t epoch) const {
  std::vector<std::uint64_t> out(parts_.size(), 0);
  for (const std::uint8_t c : plan(seed, epoch).part) ++out[c];
  return out;
}

std::optional<EncodedImage> MixedImageSource::operator()(const StageContext& ctx) {
  if (!plan_ || plan_->seed != ctx.seed || plan_->epoch != ctx.epoch) {
    plan_ = plan(ctx.seed, ctx.epoch);
    const auto& cut = options_.resume_at;
    if (cut && cut->epoch == ctx.epoch && cut->taken >= plan_->part.size())
      throw std::invalid_argument("MixedImageSource: resume_at.taken (" + std::to_string(cut->taken) +
                                  ") leaves no draw of epoch " + std::to_string(ctx.epoch) + "'s " +
                                  std::to_string(plan_->part.size()));
  }
  if (ctx.index >= rank_draws(plan_->part.size(), ctx.epoch)) return std::nullopt;
  const auto [c, id] = draw_in(*plan_, ctx.index);
  EncodedImage image = parts_[c]->read(id, *options_.pool, ctx, options_.max_file_bytes);
  image.id = offsets_[c] + id;
  return image;
}

std::string MixedImageSource::fingerprint() const {
  std::string out = "mixture (" + std::string(stop_name(options_.stop));
  if (options_.stop == MixStop::resample) out += ", " + std::to_string(options_.epoch_images) + " draws an epoch";
  out += ") of";
  for (std::size_t i = 0; i < parts_.size(); ++i)
    out += (i ? "; " : " ") + std::string("weight ") + std::to_string(options_.weights[i]) + ": " +
           parts_[i]->fingerprint();
  out += ", rank " + std::to_string(options_.shard.rank) + " of " + std::to_string(options_.shard.world) +
         (options_.shard.remainder == Remainder::drop ? ", remainder dropped" : ", padded");
  if (options_.resume_at)
    out += ", epoch " + std::to_string(options_.resume_at->epoch) + " from position " +
           std::to_string(options_.resume_at->taken);
  return out;
}

}  // namespace stoker
