// SPDX-License-Identifier: Apache-2.0
#include "taken.h"

#include "stoker/core/detail/runtime.h"

#include <algorithm>
#include <bit>
#include <mutex>
#include <stdexcept>

namespace stoker::detail {

void TakenItems::batched(std::uint64_t batch, std::vector<std::uint64_t> origins) {
  std::lock_guard lock(lock_);
  batches_.insert_or_assign(batch, std::move(origins));
}

void TakenItems::took(std::uint64_t origin) {
  if (!batched_) return take(origin);
  std::vector<std::uint64_t> origins;
  {
    std::lock_guard lock(lock_);
    const auto it = batches_.find(origin);
    if (it == batches_.end()) throw std::logic_error("free-order resume: the consumer took a batch never made");
    origins = std::move(it->second);
    batches_.erase(it);
  }
  for (const auto o : origins) take(o);
}

void TakenItems::take(std::uint64_t origin) {
  const auto twice = [] { throw std::logic_error("free-order resume: the consumer took an item twice"); };
  if (origin < base_) {
    const auto it = std::lower_bound(restored_.begin(), restored_.end(), origin);
    const auto i = static_cast<std::size_t>(it - restored_.begin());
    if (it == restored_.end() || *it != origin || restored_taken_[i]) twice();
    restored_taken_[i] = true;
    return;
  }
  if (origin < low_ || taken_bit(origin)) twice();
  const auto offset = origin - low_;
  const auto word = static_cast<std::size_t>(offset / 64);
  if (word >= words_.size()) words_.resize(word + 1, 0);
  words_[word] |= std::uint64_t{1} << (offset % 64);
  below_ = std::max(below_, origin + 1);
  while (!words_.empty() && words_.front() == ~std::uint64_t{0}) {
    words_.pop_front();
    low_ += 64;
  }
}

void TakenItems::reset() {
  {
    std::lock_guard lock(lock_);
    batches_.clear();
  }
  below_ = base_ = low_ = 0;
  words_.clear();
  restored_.clear();
  restored_taken_.clear();
}

void TakenItems::restore(std::uint64_t below, std::vector<std::uint64_t> except) {
  reset();
  below_ = base_ = below;
  low_ = below / 64 * 64;
  if (low_ != below) words_.push_back((std::uint64_t{1} << (below - low_)) - 1);  // below base_: restored_'s
  restored_taken_.assign(except.size(), false);
  restored_ = std::move(except);
}

std::vector<std::uint64_t> TakenItems::except() const {
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < restored_.size(); ++i)
    if (!restored_taken_[i]) out.push_back(restored_[i]);
  for (std::size_t w = 0; w < words_.size(); ++w) {
    for (std::uint64_t missing = ~words_[w]; missing != 0; missing &= missing - 1) {
      const std::uint64_t o = low_ + 64 * w + static_cast<std::uint64_t>(std::countr_zero(missing));
      if (o >= below_) return out;
      out.push_back(o);
    }
  }
  return out;
}

void took(TakenItems& taken, std::uint64_t origin) { taken.took(origin); }

void batched(TakenItems& taken, std::uint64_t batch, std::vector<std::uint64_t> origins) {
  taken.batched(batch, std::move(origins));
}

}  // namespace stoker::detail
