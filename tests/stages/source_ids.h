// SPDX-License-Identifier: Apache-2.0
// What a source yields, epoch by epoch, run in a pipeline: the ids of its items.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "stoker/core/pipeline.h"

namespace stoker::test {

/// The ids (`item.id`) of what `source` yields in each of `epochs` epochs of a deterministic
/// pipeline seeded with `seed`, read through a map on two threads.
template <class Source>
std::vector<std::vector<std::uint64_t>> epoch_ids(Source source, std::uint64_t seed, std::uint32_t epochs) {
  auto pipe = PipelineBuilder{}
                  .seed(seed)
                  .deterministic()
                  .epochs(epochs)
                  .threads(2)
                  .source("read", std::move(source))
                  .map("id", [](auto item) { return item.id; }, {.threads = 2})
                  .build();
  std::vector<std::vector<std::uint64_t>> ids;
  for (auto epoch : pipe.epochs()) {
    ids.emplace_back();
    for (auto id : epoch) ids.back().push_back(id);
  }
  return ids;
}

}  // namespace stoker::test
