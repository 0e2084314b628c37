// SPDX-License-Identifier: Apache-2.0
// The queues between stages: what does not depend on the item type.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "stoker/core/detail/edges.h"

namespace stoker::detail {

EdgeBase::EdgeBase(std::string name, std::size_t capacity, std::string producer, std::string consumer)
    : QueueMeter(std::move(name), capacity),
      floor_(0),
      producer_(std::move(producer)),
      consumer_(std::move(consumer)) {}

EdgeBase::EdgeBase(std::string name, ShuffleOptions shuffle, std::string producer, std::string consumer)
    : QueueMeter(std::move(name), shuffle.capacity),
      floor_(shuffle.min_after_dequeue),
      shuffle_options_(shuffle),
      producer_(std::move(producer)),
      consumer_(std::move(consumer)) {}

EdgeBase::~EdgeBase() = default;

void EdgeBase::configure(bool deterministic, std::uint64_t seed) {
  deterministic_ = deterministic;
  seed_ = derive_seed(seed, hash_name(name()));
  if (!shuffle_options_) return;
  const auto& o = *shuffle_options_;
  seed_ = o.seed.value_or(seed_);
  window_ = deterministic ? o.min_after_dequeue + 1 : o.capacity;
}

std::string EdgeBase::describe() const {
  if (!shuffle_options_) return {};
  if (!deterministic_) return "shuffle";
  return "shuffle window " + std::to_string(window_) + " seed " + std::to_string(seed_);
}

EdgeBase::ResumePlan EdgeBase::plan_resume(std::uint64_t taken, const PipelineState& state) const {
  ResumePlan plan;
  plan.next = taken;
  if (state.taken && state.taken->queue == name()) {
    plan.next = state.taken->below;
    plan.origins = state.taken->except;
  } else if (shuffle_options_ && deterministic_) {
    const auto total = state.inputs.find(name());
    const std::uint64_t end = total == state.inputs.end() ? UINT64_MAX : total->second;
    auto& draws = plan.draws.emplace(window_, epoch_seed_);
    plan.next = 0;
    for (std::uint64_t i = 0; i < taken; ++i) {
      while (plan.next < end && draws.size() < window_) draws.push(plan.next++);
      if (draws.size() == 0) break;  // the consumer took the whole epoch
      draws.take();
    }
    plan.origins.reserve(draws.size());
    draws.for_each([&](std::uint64_t p) { plan.origins.push_back(p); });
    std::sort(plan.origins.begin(), plan.origins.end());
  }
  return plan;
}

std::vector<std::size_t> EdgeBase::put_back_order(std::size_t n, std::uint64_t taken) const {
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (put_back_shuffled_) {
    Rng rng(derive_seed(epoch_seed_, taken));
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  return order;
}

}  // namespace stoker::detail
