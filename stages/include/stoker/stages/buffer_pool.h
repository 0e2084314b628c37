// SPDX-License-Identifier: Apache-2.0
// Recycled byte buffers, so that a pipeline's steady state does not allocate per sample.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stoker/core/stage.h"

namespace stoker {

class BufferPool;

/// Where a pool's memory lives, for code that hands it beyond stoker (to_dlpack) and must say
/// which device may touch it.
enum class MemoryKind : std::uint8_t {
  host,    ///< ordinary host memory
  pinned,  ///< page-locked host memory, registered with the CUDA driver
  device,  ///< memory of a device, not readable by the host
};

/// A byte buffer: owned, 64-byte aligned memory from a BufferPool, which destroying the buffer
/// hands back; or a read-only view of memory that something else owns (view()), such as a
/// data set held in memory, which destroying the buffer leaves alone.
///
/// Writable access to a view (the non-const data()) first gives the buffer a copy of its own,
/// so that nothing written through a buffer ever reaches memory it shares: read a view through
/// a const buffer to read it in place.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  ~Buffer();

  /// A read-only view of `bytes`, which `owner` keeps alive for as long as the view lives.
  /// With no owner, the memory must outlive the view by other means.
  static Buffer view(std::span<const std::byte> bytes, std::shared_ptr<const void> owner = nullptr) noexcept;

  /// Writable bytes. A view first becomes a copy of its own, from a pool shared by all such
  /// copies (which may throw std::bad_alloc).
  std::byte* data() {
    if (is_view()) copy_view();
    return data_;
  }
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  /// True for a view of memory the buffer does not own (view()).
  bool is_view() const noexcept { return data_ && !pool_; }
  /// The pool the memory goes back to; null for an empty buffer and for a view.
  BufferPool* pool() const noexcept { return pool_.get(); }

 private:
  friend class BufferPool;
  Buffer(std::byte* data, std::size_t size, std::shared_ptr<BufferPool> pool) noexcept
      : data_(data), size_(size), pool_(std::move(pool)) {}
  void copy_view();  // a view becomes a copy of its own

  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  // The pool of owned memory. A view holds its owner here as a shared_ptr that points at no
  // pool (the aliasing constructor): it keeps the owner alive and a view stays 32 bytes.
  std::shared_ptr<BufferPool> pool_;
};

/// Thread-safe cache of freed buffers, by size class: a pipeline makes the same few sizes over
/// and over, and buffers of nearby sizes (decoded images, files) share a class, each at most
/// 1/8 (or 64 bytes) larger than asked. Keeps at most `max_cached_bytes` of idle memory.
///
/// Pools of other memory (the pinned staging buffers and device buffers of stoker::gpu)
/// derive from it and override acquire() and release(), so that a batch can be collated
/// straight into them.
class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  static std::shared_ptr<BufferPool> create(std::size_t max_cached_bytes = std::size_t{1} << 30);
  virtual ~BufferPool();

  /// A buffer of `bytes` bytes, reused when one of that size is idle. Contents undefined.
  Buffer acquire(std::size_t bytes) { return acquire(bytes, StageContext{}); }
  /// The same from a stage function: a pool that waits for a free buffer (waits()) counts the
  /// wait as the stage's blocked time and gives up, throwing PipelineStopped, when `ctx.stop`
  /// is requested.
  virtual Buffer acquire(std::size_t bytes, const StageContext& ctx);
  /// True for a pool whose acquire() waits for a buffer to come back (a fixed number of them).
  virtual bool waits() const noexcept { return false; }
  /// What memory the buffers are; ordinary host memory unless a derived pool says otherwise.
  virtual MemoryKind memory_kind() const noexcept { return MemoryKind::host; }
  /// The device that pinned or device memory belongs to; 0 for host memory.
  virtual int device_id() const noexcept { return 0; }

  std::uint64_t allocations() const noexcept { return allocations_.load(); }  ///< fresh allocations
  std::uint64_t reuses() const noexcept { return reuses_.load(); }            ///< buffers handed out again

 protected:
  explicit BufferPool(std::size_t max_cached_bytes) : max_cached_(max_cached_bytes) {}
  /// A Buffer of this pool over `data`.
  Buffer wrap(std::byte* data, std::size_t size) { return Buffer(data, size, shared_from_this()); }
  /// Empties `b` without giving its memory back: the pool takes it back some other way.
  static void disown(Buffer& b) noexcept {
    b.data_ = nullptr;
    b.size_ = 0;
    b.pool_.reset();
  }
  /// Takes back the memory of a destroyed Buffer.
  virtual void release(std::byte* data, std::size_t size) noexcept;

 private:
  friend class Buffer;

  const std::size_t max_cached_;
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<std::byte*>> idle_;
  std::size_t cached_ = 0;
  std::atomic<std::uint64_t> allocations_{0}, reuses_{0};
};

// Inline: a Sample is moved from queue to queue several times on its way, with its buffer.
inline Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), pool_(std::move(o.pool_)) {}

inline Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Buffer old(std::move(*this));
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    pool_ = std::move(o.pool_);
  }
  return *this;
}

inline Buffer::~Buffer() {
  if (pool_) pool_->release(data_, size_);
}

}  // namespace stoker
