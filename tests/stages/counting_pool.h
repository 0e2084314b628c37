// SPDX-License-Identifier: Apache-2.0
// A pool for tests of exported buffers: it counts what comes back and says what memory it holds.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

#include "stoker/stages/buffer_pool.h"

namespace stoker::test {

// Counts the buffers it takes back, in a counter that may outlive it, and says it holds
// whatever memory the test asks for.
class CountingPool final : public BufferPool {
 public:
  static std::shared_ptr<CountingPool> create(std::shared_ptr<std::atomic<int>> released,
                                              MemoryKind kind = MemoryKind::host, int device = 0) {
    return std::shared_ptr<CountingPool>(new CountingPool(std::move(released), kind, device));
  }
  MemoryKind memory_kind() const noexcept override { return kind_; }
  int device_id() const noexcept override { return device_; }

 protected:
  void release(std::byte* data, std::size_t size) noexcept override {
    released_->fetch_add(1);
    BufferPool::release(data, size);
  }

 private:
  CountingPool(std::shared_ptr<std::atomic<int>> released, MemoryKind kind, int device)
      : BufferPool(std::size_t{1} << 24), released_(std::move(released)), kind_(kind), device_(device) {}
  std::shared_ptr<std::atomic<int>> released_;
  MemoryKind kind_;
  int device_;
};

}  // namespace stoker::test
