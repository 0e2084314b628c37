// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/buffer_pool.h"

#include <bit>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

namespace stoker {

namespace {
constexpr std::align_val_t kAlign{64};
void free_bytes(std::byte* p) noexcept { ::operator delete[](p, kAlign); }

// The memory a buffer of `bytes` gets, so that buffers of nearby sizes (images of many sizes,
// files) reuse one another: up to 1 KiB a multiple of 64 bytes, above it eight classes per
// doubling, each at most 1/8 over what is asked.
std::size_t size_class(std::size_t bytes) noexcept {
  const std::size_t step = bytes <= 1024 ? 64 : std::size_t{1} << (std::bit_width(bytes - 1) - 4);
  return (bytes + step - 1) / step * step;
}
}  // namespace

Buffer Buffer::view(std::span<const std::byte> bytes, std::shared_ptr<const void> owner) noexcept {
  Buffer b;
  if (bytes.empty()) return b;
  // Nothing writes through a view's pointer: data() copies a view before it hands it out.
  b.data_ = const_cast<std::byte*>(bytes.data());
  b.size_ = bytes.size();
  b.pool_ = std::shared_ptr<BufferPool>(std::move(owner), nullptr);
  return b;
}

void Buffer::copy_view() {
  static const std::shared_ptr<BufferPool> copies = BufferPool::create();
  Buffer own = copies->acquire(size_);
  std::memcpy(own.data_, data_, size_);
  *this = std::move(own);
}

std::shared_ptr<BufferPool> BufferPool::create(std::size_t max_cached_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_cached_bytes));
}

BufferPool::~BufferPool() {
  for (auto& [size, list] : idle_)
    for (auto* p : list) free_bytes(p);
}

Buffer BufferPool::acquire(std::size_t bytes, const StageContext&) {
  if (bytes == 0) return {};
  // size_class() rounds up by at most 1/8: below this bound it cannot wrap around.
  if (bytes > std::numeric_limits<std::size_t>::max() / 2)
    throw std::length_error("BufferPool: a buffer of " + std::to_string(bytes) +
                            " bytes is larger than any allocation");
  const std::size_t capacity = size_class(bytes);
  {
    std::lock_guard lock(mutex_);
    if (auto it = idle_.find(capacity); it != idle_.end() && !it->second.empty()) {
      auto* p = it->second.back();
      it->second.pop_back();
      cached_ -= capacity;
      reuses_.fetch_add(1, std::memory_order_relaxed);
      return wrap(p, bytes);
    }
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  auto* p = static_cast<std::byte*>(::operator new[](capacity, kAlign));
  return wrap(p, bytes);
}

void BufferPool::release(std::byte* data, std::size_t size) noexcept {
  const std::size_t capacity = size_class(size);
  {
    std::lock_guard lock(mutex_);
    if (cached_ + capacity <= max_cached_) {
      try {
        idle_[capacity].push_back(data);
        cached_ += capacity;
        return;
      } catch (...) {  // no room to remember it: free it instead
      }
    }
  }
  free_bytes(data);
}

}  // namespace stoker
