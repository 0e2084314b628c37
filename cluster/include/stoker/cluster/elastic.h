// SPDX-License-Identifier: Apache-2.0
// Elastic resume: a data-parallel job checkpointed at N ranks goes on at M, mid-epoch included,
// with every sample of the epoch that was not trained yet trained once across the M ranks.
//
// An epoch's order is a permutation of the data set drawn from the seed and the epoch
// (ShuffledShard's, the same whatever the ranks), so a sample is named by its position in it.
// What exactly-once counts is a unit: the `fanout` outputs a pipeline makes of a sample before
// the queue its free-order states trace (the batch stage's input), unit `position * fanout + j`
// for the j-th. The ranks' free-order states say which units each rank's consumer took; the
// units left are shared out again among M ranks, each resuming a pipeline that makes exactly
// its share: whole samples, and of the samples already partly trained only the units not
// trained (a free-order resume makes the items it lists, and no others).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/core/stage.h"
#include "stoker/core/state.h"
#include "stoker/stages/reader.h"
#include "stoker/stages/shard.h"

namespace stoker::cluster {

/// Sorted, disjoint, non-adjacent ranges [begin, end) of units.
using UnitRanges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;

/// The units in `ranges`.
std::uint64_t unit_count(const UnitRanges& ranges) noexcept;

/// Units per sample of the pipeline a free-order `state` is of: the product of the fanouts of its
/// flat_maps before its batch stage (or of all of them, without one). Throws StateError for a
/// deterministic state, or a flat_map without a fanout.
std::uint64_t units_per_sample(const PipelineState& state);

/// One rank's share of an epoch: the positions it reads, in order, and of the first `partial`
/// of them only the units in `make` (origins: `call * fanout + j` for the j-th unit of its
/// `call`-th sample, ascending).
struct Share {
  std::vector<std::uint64_t> positions;
  std::uint64_t partial = 0;
  std::vector<std::uint64_t> make;
};

/// How an epoch's samples are shared among the ranks of a data-parallel job.
///
/// fresh(): as ShuffledShard shares it (Remainder::drop): rank r reads the samples at positions
/// r, r + world, r + 2 world, ..., and the last `samples % world` go nowhere.
///
/// of_rest(): the units left of an epoch, in `world` shares of consecutive units (in unit
/// order) that make every rank take the same number of steps of `batch` units: when the units
/// do not divide among the ranks, the first `units % world` ranks take one more, unless that
/// would give them one more step than the others; then those few units (fewer than `world`)
/// are left out, as ShuffledShard leaves out `samples % world` samples of every epoch.
class EpochPlan {
 public:
  static EpochPlan fresh(std::uint32_t epoch, std::uint64_t samples, std::uint64_t fanout, std::uint32_t world);
  static EpochPlan of_rest(std::uint32_t epoch, std::uint64_t samples, std::uint64_t fanout, UnitRanges rest,
                           std::uint32_t world, std::uint64_t batch);

  std::uint32_t epoch() const noexcept { return epoch_; }
  std::uint64_t samples() const noexcept { return samples_; }
  std::uint64_t fanout() const noexcept { return fanout_; }
  std::uint32_t world() const noexcept { return world_; }
  bool is_fresh() const noexcept { return !rest_; }
  /// Units the plan has the ranks make: the epoch's (less the remainder), or the rest's shared.
  std::uint64_t units() const noexcept;
  /// Units the plan leaves out: the last `samples % world` samples' (fresh), or those of the
  /// rest that do not divide among the ranks (of_rest).
  std::uint64_t left_out() const noexcept;

  /// Rank `rank`'s share. Throws std::out_of_range for a rank not of the plan's world.
  Share share(std::uint32_t rank) const;
  /// The units of rank `rank`'s share. Throws std::out_of_range for a rank not of the plan's world.
  UnitRanges units_of(std::uint32_t rank) const;

  /// The units of the plan that the ranks' consumers had not taken, given every rank's
  /// free-order state of the plan's epoch, in rank order. Throws StateError naming the rank
  /// whose state is of another epoch, deterministic, or of a pipeline of another fanout.
  UnitRanges rest(const std::vector<PipelineState>& states) const;

  /// The state rank `rank` resumes its pipeline from to make its share of an of_rest() plan:
  /// `blank`, the state() of a pipeline built the same way and not resumed (before its first
  /// next()), set to the plan's epoch with the share's partly made samples listed.
  PipelineState resume_state(std::uint32_t rank, PipelineState blank) const;

  /// One line of JSON, and back; from_json throws StateError naming `origin`.
  std::string to_json() const;
  static EpochPlan from_json(std::string_view text, const std::string& origin);

  bool operator==(const EpochPlan&) const = default;

 private:
  std::uint32_t epoch_ = 0, world_ = 1;
  std::uint64_t samples_ = 0, fanout_ = 1;
  std::optional<UnitRanges> rest_;
  std::vector<std::uint64_t> bounds_;  // of_rest: rank r's units are the rest's [bounds_[r], bounds_[r + 1])
};

/// A pipeline source of one rank's samples: ShuffledShard's share (`rank` of `world`) in every
/// epoch but the first one of a resumed run, where it reads `share`, that epoch's share of an
/// EpochPlan::of_rest(). Its fingerprint is ShuffledShard's: which plan a state was taken
/// under is the caller's to keep (stoker-train's checkpoint keeps it).
///
///   auto plan = cluster::EpochPlan::of_rest(epoch, samples, 5, plan_then.rest(states), comm.size(), 51);
///   .source("read", cluster::ElasticShard(reader, {.rank = r, .world = n}, {{epoch, plan.share(r)}}))
///   ...
///   .resume_from(plan.resume_state(r, blank))
class ElasticShard {
 public:
  ElasticShard(std::shared_ptr<const Reader> reader, ShardOptions options,
               std::optional<std::pair<std::uint32_t, Share>> first = std::nullopt);

  std::optional<Sample> operator()(const StageContext& ctx) const;
  /// Nothing to do: the call's index says which sample it is.
  void seek(std::uint64_t) noexcept {}
  std::string fingerprint() const { return shard_.fingerprint(); }

 private:
  std::shared_ptr<const Reader> reader_;
  ShuffledShard shard_, order_;  // this rank's share of a fresh epoch; the epoch's whole order
  std::optional<std::pair<std::uint32_t, std::shared_ptr<const Share>>> first_;
};

}  // namespace stoker::cluster
