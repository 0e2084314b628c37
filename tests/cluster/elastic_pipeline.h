// SPDX-License-Identifier: Apache-2.0
// The data-parallel pipeline of the elastic resume tests (test_cluster in one process, mpi_ranks
// over ranks): 1,003 samples, 3 units of each (a flat_map of fanout 3, as crops), a shuffle that
// mixes the units of many samples, batches of `batch`. Each item is a batch's units, named by
// sample id and output: id * 3 + j.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stoker/cluster/elastic.h"
#include "stoker/core/pipeline.h"
#include "stoker/stages/synthetic.h"

namespace elastic_test {

using Units = std::vector<std::uint64_t>;
constexpr std::uint64_t kSamples = 1003, kFanout = 3, kSeed = 21;
constexpr std::uint32_t kEpochs = 2;

inline std::shared_ptr<const stoker::Reader> reader() {
  return std::make_shared<stoker::SyntheticSource>(
      stoker::SyntheticOptions{.shape = {1, 1, 2, 2, false}, .count = kSamples});
}

// Rank `rank` of `world`: ShuffledShard's share, but for `first` (an epoch and its share of a
// rest); resumed from `state` when given.
inline stoker::Pipeline<Units> pipeline(std::uint32_t rank, std::uint32_t world, std::size_t batch,
                                        std::optional<std::pair<std::uint32_t, stoker::cluster::Share>> first = {},
                                        std::optional<stoker::PipelineState> state = {}) {
  stoker::PipelineBuilder b;
  b.seed(kSeed).epochs(kEpochs).threads(2);
  if (state) b.resume_from(std::move(*state));
  return std::move(b)
      .source("read", stoker::cluster::ElasticShard(reader(), {.rank = rank, .world = world}, std::move(first)))
      .flat_map<std::uint64_t>("units",
                               [](stoker::Sample s, stoker::Emitter<std::uint64_t>& emit, const stoker::StageContext&) {
                                 for (std::uint64_t j = 0; j < kFanout; ++j) emit(s.id * kFanout + j);
                               },
                               {.threads = 2, .fanout = kFanout})
      .shuffle("shuffle", {.capacity = 64, .min_after_dequeue = 40})
      .batch("batch", batch)
      .map("ids", [](Units u) { return u; })
      .build();
}

// The state a pipeline of rank `rank` of `world` resumes from to make its share of `plan`.
inline stoker::PipelineState resume_state(const stoker::cluster::EpochPlan& plan, std::uint32_t rank,
                                          std::size_t batch) {
  // A pipeline built the same way, not resumed, describes itself before its first item.
  const auto blank = pipeline(rank, plan.world(), batch, std::pair{plan.epoch(), plan.share(rank)}).state();
  return plan.resume_state(rank, blank);
}

}  // namespace elastic_test
