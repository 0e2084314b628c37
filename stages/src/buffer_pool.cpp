#include "stoker/stages/buffer_pool.h"

#include <new>
#include <utility>

namespace stoker {

namespace {
constexpr std::align_val_t kAlign{64};
void free_bytes(std::byte* p) noexcept { ::operator delete[](p, kAlign); }
}  // namespace

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), pool_(std::move(o.pool_)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Buffer old(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    pool_ = std::move(o.pool_);
  }
  return *this;
}

Buffer::~Buffer() {
  if (data_) pool_->release(data_, size_);
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
  {
    std::lock_guard lock(mutex_);
    if (auto it = idle_.find(bytes); it != idle_.end() && !it->second.empty()) {
      auto* p = it->second.back();
      it->second.pop_back();
      cached_ -= bytes;
      reuses_.fetch_add(1, std::memory_order_relaxed);
      return wrap(p, bytes);
    }
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  auto* p = static_cast<std::byte*>(::operator new[](bytes, kAlign));
  return wrap(p, bytes);
}

void BufferPool::release(std::byte* data, std::size_t size) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (cached_ + size <= max_cached_) {
      try {
        idle_[size].push_back(data);
        cached_ += size;
        return;
      } catch (...) {  // no room to remember it: free it instead
      }
    }
  }
  free_bytes(data);
}

}  // namespace stoker
