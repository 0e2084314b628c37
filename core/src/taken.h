// SPDX-License-Identifier: Apache-2.0
// Which items the consumer of a free-order pipeline has taken, for Pipeline::state(). Internal
// to the library.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "stoker/core/detail/spin_lock.h"

namespace stoker::detail {

/// In free order, which items the consumer took does not follow from how many, so it is kept:
/// by their origins (Chunk) in one queue, the one the batch stage takes from (or the last, when
/// there is none). A batch's number maps to its items' origins from when the batch stage makes
/// it until the consumer takes it.
///
/// Invariant: every origin below below() not taken is in except(). Those are all somewhere in
/// the pipeline (the source reads in order, and the item at below() - 1 was read), so their
/// number is bounded by what the pipeline holds. Kept in two parts: a bit set from low_ up,
/// which slides up as its lowest word fills (a bit an item), and, after a resume, the items the
/// state listed below its `below`, which are only ever crossed off; memory follows what is in
/// flight, never how far apart a state's numbers are.
class TakenItems {
 public:
  TakenItems(std::string queue, bool batched) : queue_(std::move(queue)), batched_(batched) {}

  const std::string& queue() const { return queue_; }

  /// The batch stage sent batch `batch` of items with `origins`. Any thread.
  void batched(std::uint64_t batch, std::vector<std::uint64_t> origins);
  /// The consumer took the item of `origin`: a batch's number when batched. The consumer's
  /// thread, as the rest below.
  void took(std::uint64_t origin);

  /// A new epoch: none taken.
  void reset();
  /// Every origin below `below` taken but `except` (ascending, each below `below`).
  void restore(std::uint64_t below, std::vector<std::uint64_t> except);

  std::uint64_t below() const { return below_; }
  /// The origins below below() not taken, ascending.
  std::vector<std::uint64_t> except() const;

 private:
  void take(std::uint64_t origin);
  bool taken_bit(std::uint64_t origin) const {
    const auto offset = origin - low_;
    const auto word = static_cast<std::size_t>(offset / 64);
    return word < words_.size() && (words_[word] >> (offset % 64) & 1);
  }

  const std::string queue_;
  const bool batched_;
  SpinLock lock_;  // for batches_
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> batches_;
  std::uint64_t below_ = 0;              // one past the highest origin taken (or restored)
  std::uint64_t base_ = 0;               // the restored `below`; the bit set holds what is above
  std::uint64_t low_ = 0;                // a multiple of 64, at most base_
  std::deque<std::uint64_t> words_;      // bit b of word w: origin low_ + 64 w + b was taken
  std::vector<std::uint64_t> restored_;  // below base_, not taken at the restore
  std::vector<bool> restored_taken_;     // ... and taken since
};

}  // namespace stoker::detail
