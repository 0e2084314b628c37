// SPDX-License-Identifier: Apache-2.0
#include "stoker/gpu/staging.h"

#include "stoker/gpu/dlpack.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include "backends.h"
#include "stoker/core/pipeline.h"

namespace stoker::gpu {

// ---------------------------------------------------------------------------------------------
// OutputSizing

std::string OutputSizing::rule() const {
  return std::to_string(per_call) + " per call + " + std::to_string(queued) + " queued + " + std::to_string(held) +
         " held by the consumer = " + std::to_string(buffers()) + " buffers";
}

// ---------------------------------------------------------------------------------------------
// SlotPool

void SlotPool::Wakeup::notify() {
  {
    std::lock_guard lock(mutex);
    ++generation;
  }
  changed.notify_all();
}

std::shared_ptr<SlotPool> SlotPool::create(std::shared_ptr<Device> device, Kind kind, std::size_t slots,
                                           std::size_t slot_bytes, SlotPoolOptions options) {
  if (!device) throw std::invalid_argument("slot pool: no device");
  if (slots == 0) throw std::invalid_argument("slot pool: slots must be at least 1");
  if (slot_bytes == 0) throw std::invalid_argument("slot pool: slot_bytes must be at least 1");
  if (options.wait_limit.count() < 0) throw std::invalid_argument("slot pool: wait_limit must not be negative");
  return std::shared_ptr<SlotPool>(new SlotPool(std::move(device), kind, slots, slot_bytes, std::move(options)));
}

SlotPool::SlotPool(std::shared_ptr<Device> device, Kind kind, std::size_t slots, std::size_t slot_bytes,
                   SlotPoolOptions options)
    : BufferPool(0), device_(std::move(device)), kind_(kind), slot_bytes_(slot_bytes), options_(std::move(options)) {
  slots_.reserve(slots);
  pending_.reserve(slots);  // a slot is pending once at most: release() never allocates there
  for (std::size_t i = 0; i < slots; ++i) {
    Memory m = kind == Kind::pinned ? device_->allocate_pinned(slot_bytes) : device_->allocate(slot_bytes);
    slots_.push_back({std::move(m), {}, {}});
    slots_.back().events.push_back(device_->make_event());
    free_.push_back(slots - 1 - i);  // hand out slot 0 first
  }
}

// Buffers still out hold the pool alive (a Buffer keeps a shared_ptr to it), so by now
// every slot is free or pending; the device may still be reading a pending one. A wait that
// fails (a sticky CUDA error, the runtime unloading at exit) must not end the process with
// the error it would report lost: it is logged, and the memory freed all the same.
SlotPool::~SlotPool() {
  for (const Pending& p : pending_)
    for (std::size_t e = 0; e < p.events; ++e) {
      try {
        slots_[p.slot].events[e]->synchronize();
      } catch (...) {
        detail::log_teardown_failure("a slot pool's destructor");
      }
    }
}

std::size_t SlotPool::slot_of(const std::byte* data) const {
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].memory.data() == data) return i;
  throw std::invalid_argument("slot pool: this buffer is not one of the pool's");
}

std::size_t SlotPool::slot_containing(const void* data) const {
  const auto* p = static_cast<const std::byte*>(data);
  for (std::size_t i = 0; i < slots_.size(); ++i)
    if (p >= slots_[i].memory.data() && p < slots_[i].memory.data() + slot_bytes_) return i;
  throw std::invalid_argument("slot pool '" + options_.name + "': this address is in none of its buffers");
}

// A buffer given back without release_after (a batch dropped before any use, a DLPack tensor
// released) may still be written by the work that fills it, and read by the streams it was
// handed to: it waits for the slot's own event and for each of those streams, recorded now.
void SlotPool::release(std::byte* data, std::size_t) noexcept {
  const std::size_t i = slot_of(data);  // the slots never change: no lock
  try {
    give_back(i, {});
  } catch (...) {
    // Recording failed (a sticky CUDA error: the device runs no more work): the slot keeps the
    // points record_stream() recorded when its streams were named.
    detail::log_teardown_failure("a slot pool's buffer given back after its consumers' streams");
    {
      std::lock_guard lock(wake_->mutex);
      Slot& slot = slots_[i];
      pending_.push_back({i, 1 + slot.consumers.size(), false, std::move(slot.consumers)});
      slot.consumers.clear();
      ++returns_;
      ++wake_->generation;
    }
    wake_->changed.notify_all();
  }
}

bool SlotPool::passed(std::size_t slot, std::size_t events) const {
  for (std::size_t e = 0; e < events; ++e)
    if (!slots_[slot].events[e]->done()) return false;
  return true;
}

std::optional<Buffer> SlotPool::take_free(std::unique_lock<std::mutex>&, std::size_t bytes,
                                          std::vector<std::shared_ptr<Stream>>& retired) {
  if (free_.empty())  // slots whose events the device has passed come back now
    std::erase_if(pending_, [&](Pending& p) {
      if (!passed(p.slot, p.events)) return false;
      free_.push_back(p.slot);
      ++returns_;
      for (auto& stream : p.named) retired.push_back(std::move(stream));
      return true;
    });
  if (free_.empty()) return std::nullopt;
  const std::size_t i = free_.back();
  free_.pop_back();
  return wrap(slots_[i].memory.data(), bytes);
}

std::optional<Buffer> SlotPool::try_acquire(std::size_t bytes) {
  if (bytes > slot_bytes_)
    throw std::invalid_argument("slot pool: " + std::to_string(bytes) + " bytes asked for, but its buffers hold " +
                                std::to_string(slot_bytes_));
  std::vector<std::shared_ptr<Stream>> retired;  // let go after the lock
  std::unique_lock lock(wake_->mutex);
  return take_free(lock, bytes, retired);
}

Buffer SlotPool::acquire(std::size_t bytes, const StageContext& ctx) {
  using namespace std::chrono_literals;
  using Clock = std::chrono::steady_clock;
  if (bytes > slot_bytes_) (void)try_acquire(bytes);  // throws the size error
  std::vector<std::shared_ptr<Stream>> retired;       // let go after the lock
  // Ends after the lock: under a ThreadBudget its end takes a turn again, which may wait for a
  // body that needs this lock to give a buffer back.
  std::optional<BlockedTime> blocked;
  std::unique_lock lock(wake_->mutex);
  if (auto b = take_free(lock, bytes, retired)) return std::move(*b);
  // Exhausted: the stage calling waits for its consumer, as with a full output queue.
  blocked.emplace(ctx);
  ++waiters_;
  struct Leave {  // the lock is held whenever this runs: on return, and on every throw below
    std::size_t& waiters;
    ~Leave() { --waiters; }
  } leave{waiters_};
  const auto limit = options_.wait_limit;
  auto since = Clock::now();  // the last time a buffer came back, or the start of the wait
  std::uint64_t returns = returns_;
  auto next_check = since;  // of the device: a fault that no event here will ever report
  for (;;) {
    // Read before anything below lets go of the lock: a buffer given back while it is let go
    // (around help_downstream()) changes the generation from this, so the wait at the end
    // returns at once instead of sleeping through the notification it missed. (No test reaches
    // that window through the public interface since a context's pipeline link is opaque: one
    // that gave buffers back at random points of 200,000 waits passed with and without this.)
    const std::uint64_t seen = wake_->generation;
    if (auto b = take_free(lock, bytes, retired)) return std::move(*b);
    if (ctx.stop.stop_requested()) throw PipelineStopped();
    // The stage that gives buffers back may need this very thread: run it here meanwhile.
    lock.unlock();
    bool helped = false;
    try {
      if (const auto now = Clock::now(); now >= next_check) {
        device_->check();  // at most once a millisecond: it queries each of the device's streams
        next_check = now + 1ms;
      }
      helped = ctx.help_downstream();
    } catch (...) {
      lock.lock();
      throw;
    }
    lock.lock();
    if (helped) continue;
    const auto now = Clock::now();
    if (returns_ != returns) since = now, returns = returns_;
    if (limit.count() > 0 && now - since >= limit) time_out(now - since);
    // A buffer comes back when a Buffer is destroyed or given back, which notifies, or when the
    // device passes its events. That is announced by a host task when a waiter was there at
    // release_after; otherwise nobody announces it, and it is polled for. A pipeline's stage
    // also wakes every 2 ms to help the stages after it: their work arrives unannounced. Any
    // other waiter wakes every 50 ms at least, to check the device (a CUDA fault may leave
    // the events here "not ready" for ever, and announces nothing).
    const bool unannounced =
        std::any_of(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.announced; });
    Clock::duration wait = std::min<Clock::duration>(limit.count() > 0 ? since + limit - now : 1h, 50ms);
    if (unannounced) wait = std::min<Clock::duration>(wait, 20us);
    if (ctx.in_pipeline()) wait = std::min<Clock::duration>(wait, 2ms);
    wake_->changed.wait_for(lock, ctx.stop, wait, [&] { return wake_->generation != seen; });
  }
}

void SlotPool::time_out(std::chrono::steady_clock::duration waited) const {
  // A failure that kept a stream from announcing its events (its host tasks no longer run)
  // is the error to report, not the wait.
  for (const Pending& p : pending_) (void)passed(p.slot, p.events);
  device_->check();
  const auto seconds = std::chrono::duration<double>(waited).count();
  std::string what = "slot pool '" + options_.name + "': no buffer came back in " + std::to_string(seconds) +
                     " s of waiting, with all " + std::to_string(slots_.size()) + " of its buffers ";
  if (pending_.empty()) {
    what +=
        "held and none on its way back, so this wait would never end: whatever holds them (the queue after the "
        "stage, the consumer) holds more than the pool was sized for. Sizing: " +
        (options_.sizing.empty() ? std::string("give it at least the buffers one call holds + those queued after "
                                               "the stage + those the consumer holds at once")
                                 : options_.sizing);
  } else {
    what += "in use, " + std::to_string(pending_.size()) +
            " of them waiting for device work that has not finished (a hung device, or a stream held by work that "
            "never ends)";
  }
  throw PoolTimeout(what + " (wait_limit " + std::to_string(options_.wait_limit.count()) + " ms)");
}

void SlotPool::release_after(Buffer buffer, Stream& stream) {
  Stream* const streams[] = {&stream};
  release_after(std::move(buffer), streams);
}

void SlotPool::release_after(Buffer buffer, std::span<Stream* const> streams) {
  if (buffer.pool() != this) throw std::invalid_argument("slot pool: release_after got a buffer of another pool");
  if (streams.empty()) return;                 // `buffer` comes back through release(), after the slot's event
  const auto keep_alive = shared_from_this();  // `buffer` may hold the last reference
  give_back(slot_of(buffer.data()), streams);  // if it throws, `buffer` comes back through release()
  disown(buffer);                              // the slot comes back through its events, in take_free()
}

void SlotPool::give_back(std::size_t i, std::span<Stream* const> streams) {
  Slot& slot = slots_[i];  // the holder's alone until it is pending: its events need no lock
  std::vector<std::shared_ptr<Stream>> named;
  bool waiting = false;
  {
    std::lock_guard lock(wake_->mutex);
    named = std::move(slot.consumers);
    slot.consumers.clear();
    waiting = waiters_ > 0;
  }
  std::vector<Stream*> all(streams.begin(), streams.end());
  for (const auto& c : named)
    if (std::find(all.begin(), all.end(), c.get()) == all.end()) all.push_back(c.get());
  // The points to pass: its own event ([0]), then each stream's present end. Recorded outside
  // the pool's lock.
  try {
    while (slot.events.size() < 1 + all.size()) slot.events.push_back(device_->make_event());
    for (std::size_t k = 0; k < all.size(); ++k) all[k]->record(*slot.events[1 + k]);
  } catch (...) {
    std::lock_guard lock(wake_->mutex);
    slot.consumers = std::move(named);  // for the release that follows
    throw;
  }
  const std::size_t events = 1 + all.size();
  // A stage waiting in acquire() now would otherwise only find out by polling: the pool's own
  // stream waits for the slot's events and then tells it. Not the streams that used the buffer:
  // those are the caller's (a training step's), and a host task there would put a trip to the
  // host between their kernels. Without a waiter, the trip would be for nothing.
  bool announced = false;
  if (waiting) {
    try {
      announce_after(slot, events);
      announced = true;
    } catch (...) {  // then it is polled for
    }
  }
  {
    std::lock_guard lock(wake_->mutex);
    // A waiter that came since finds the slot unannounced, and polls for it.
    pending_.push_back({i, events, announced, std::move(named)});
    ++returns_;
    ++wake_->generation;
  }
  wake_->changed.notify_all();
}

void SlotPool::announce_after(Slot& slot, std::size_t events) {
  std::lock_guard lock(announcer_mutex_);  // one slot's waits and task at a time
  if (!announcer_) announcer_ = device_->make_stream();
  for (std::size_t e = 0; e < events; ++e) announcer_->wait(*slot.events[e]);
  announcer_->host_task([wake = wake_] { wake->notify(); });
}

Event& SlotPool::event(const Buffer& buffer) { return *slots_[slot_of(buffer.data())].events.front(); }

void SlotPool::record_stream(const void* data, std::shared_ptr<Stream> stream) {
  if (!stream) throw std::invalid_argument("slot pool '" + options_.name + "': record_stream got no stream");
  const std::size_t i = slot_containing(data);
  Event* point = nullptr;
  {
    std::lock_guard lock(wake_->mutex);
    const bool given_back =
        std::find(free_.begin(), free_.end(), i) != free_.end() ||
        std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.slot == i; });
    if (given_back)
      throw std::invalid_argument("slot pool '" + options_.name + "': record_stream on a buffer already given back");
    Slot& slot = slots_[i];
    for (const auto& c : slot.consumers)
      if (c == stream) return;
    if (slot.events.size() < 2 + slot.consumers.size()) slot.events.push_back(device_->make_event());
    slot.consumers.push_back(stream);
    point = slot.events[slot.consumers.size()].get();
  }
  // Marked now as well: a stream that cannot be recorded on fails here, in the caller's hands
  // (and is not named), and should the record at the release fail, this point still holds.
  try {
    stream->record(*point);
  } catch (...) {
    std::lock_guard lock(wake_->mutex);
    auto& consumers = slots_[i].consumers;
    consumers.erase(std::find(consumers.begin(), consumers.end(), stream));
    throw;
  }
}

MemoryKind SlotPool::memory_kind() const noexcept {
  if (device_->backend() != Backend::cuda) return MemoryKind::host;
  return kind_ == Kind::pinned ? MemoryKind::pinned : MemoryKind::device;
}

int SlotPool::device_id() const noexcept { return device_->ordinal(); }

std::size_t SlotPool::in_use() const {
  std::lock_guard lock(wake_->mutex);
  const auto waiting =
      std::count_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return !passed(p.slot, p.events); });
  return slots_.size() - free_.size() - pending_.size() + static_cast<std::size_t>(waiting);
}

// ---------------------------------------------------------------------------------------------
// DeviceBatch

DeviceBatch::DeviceBatch(Buffer storage, Shape shape_, DType dtype_, std::size_t count_, std::size_t labels_offset,
                         std::vector<std::int32_t> labels, std::vector<std::uint64_t> ids)
    : shape(shape_),
      dtype(dtype_),
      count(count_),
      host_labels(std::move(labels)),
      host_ids(std::move(ids)),
      storage_(std::move(storage)),
      labels_offset_(labels_offset) {}

DeviceBatch::DeviceBatch(DeviceBatch&& o) noexcept
    : shape(o.shape),
      dtype(o.dtype),
      count(o.count),
      host_labels(std::move(o.host_labels)),
      host_ids(std::move(o.host_ids)),
      storage_(std::move(o.storage_)),
      labels_offset_(o.labels_offset_),
      used_on_(std::move(o.used_on_)) {
  o.used_on_.clear();
}

DeviceBatch& DeviceBatch::operator=(DeviceBatch&& o) noexcept {
  if (this == &o) return *this;
  give_back();
  shape = o.shape;
  dtype = o.dtype;
  count = o.count;
  host_labels = std::move(o.host_labels);
  host_ids = std::move(o.host_ids);
  storage_ = std::move(o.storage_);
  labels_offset_ = o.labels_offset_;
  used_on_ = std::move(o.used_on_);
  o.used_on_.clear();
  return *this;
}

DeviceBatch::~DeviceBatch() { give_back(); }

namespace {
SlotPool& slot_pool_of(const Buffer& storage) {
  auto* pool = dynamic_cast<SlotPool*>(storage.pool());
  if (!pool) throw std::logic_error("device batch: empty, or not from a slot pool");
  return *pool;
}
}  // namespace

// A batch that ends without release_after: its buffer goes back after the streams it was used
// on, or, used on none, after ready() (through the Buffer's own release).
void DeviceBatch::give_back() noexcept {
  if (storage_.empty()) return;
  try {
    slot_pool_of(storage_).release_after(std::move(storage_), used_on_);
  } catch (...) {
    // Recording failed, after a sticky CUDA error: the device runs no more work, and the
    // buffer came back through its Buffer, after ready().
    detail::log_teardown_failure("a device batch given back");
  }
  used_on_.clear();
}

Event& DeviceBatch::ready() const { return slot_pool_of(storage_).event(storage_); }

SlotPool& DeviceBatch::pool() const { return slot_pool_of(storage_); }

void DeviceBatch::use_on(Stream& stream) {
  Event& filled = ready();
  if (std::find(used_on_.begin(), used_on_.end(), &stream) != used_on_.end()) return;
  used_on_.reserve(used_on_.size() + 1);  // before the wait: nothing to undo if it throws
  stream.wait(filled);
  used_on_.push_back(&stream);
}

void DeviceBatch::release_after(Stream& stream) {
  use_on(stream);
  slot_pool_of(storage_).release_after(std::move(storage_), used_on_);
  used_on_.clear();
}

// ---------------------------------------------------------------------------------------------
// ToDevice

ToDevice::ToDevice(std::shared_ptr<Device> device, ToDeviceOptions options) : state_(std::make_shared<State>()) {
  if (!device) throw std::invalid_argument("to_device: no device");
  if (options.bytes == 0) throw std::invalid_argument("to_device: bytes (the largest batch) must be at least 1");
  if (options.wait_limit.count() < 0) throw std::invalid_argument("to_device: wait_limit must not be negative");
  const auto pool = [&](SlotPool::Kind kind, std::size_t buffers, const char* name, const char* option,
                        const char* what) {
    return SlotPool::create(device, kind, buffers, options.bytes,
                            {.name = name,
                             .sizing = std::string(option) + " (" + std::to_string(buffers) + ") must cover " + what,
                             .wait_limit = options.wait_limit});
  };
  state_->staging = pool(SlotPool::Kind::pinned, options.staging_buffers, "ToDevice staging", "staging_buffers",
                         "1 batch being collated + the batches queued between the collate and h2d stages + 1 being "
                         "copied");
  state_->device_pool =
      pool(SlotPool::Kind::device, options.device_buffers, "ToDevice device buffers", "device_buffers",
           "1 batch being copied + the batches queued after the h2d stage + those the consumer holds "
           "at once (OutputSizing)");
  state_->copy_stream = device->make_stream();
  state_->device = std::move(device);
}

// The copy stream finishes before the pools' memory goes.
ToDevice::State::~State() {
  try {
    if (copy_stream) copy_stream->synchronize();
  } catch (...) {
    detail::log_teardown_failure("ToDevice's destructor");
  }
}

DeviceBatch ToDevice::operator()(Batch batch, const StageContext& ctx) const {
  auto& s = *state_;
  s.copy_stream->check();  // a copy of an earlier batch that failed fails this stage
  if (batch.storage.pool() != s.staging.get())
    throw std::invalid_argument(
        "to_device: the batch was not collated into the staging pool (use Collate{.pool = to_device.staging()})");
  Buffer target = s.device_pool->acquire(batch.storage.size(), ctx);
  // Whatever may throw comes before the copy: once it is queued, each buffer goes back only
  // after the copy stream (the target through its event, the staging through release_after).
  std::vector<std::int32_t> labels(batch.label_values().begin(), batch.label_values().end());
  std::vector<std::uint64_t> ids(batch.id_values().begin(), batch.id_values().end());
  const detail::TraceRange range("h2d copy");
  const std::size_t bytes = batch.payload_bytes();
  s.copy_stream->copy_to_device(target.data(), batch.data(), bytes);
  s.copy_stream->record(s.device_pool->event(target));
  DeviceBatch out(std::move(target), batch.shape, batch.dtype, batch.count, batch.labels_offset(), std::move(labels),
                  std::move(ids));
  s.staging->release_after(std::move(batch.storage), *s.copy_stream);
  return out;
}

}  // namespace stoker::gpu

// ---------------------------------------------------------------------------------------------
// DLPack

namespace stoker {

// The device buffer has a Batch's layout, so the host batch's export serves: it names the
// device from the buffer's pool.
DLPackBatch to_dlpack(gpu::DeviceBatch&& batch) {
  if (batch.empty()) throw std::invalid_argument("to_dlpack: the device batch is empty");
  // The tensors' owner gives the buffer back without naming streams: it must still wait for the
  // work issued to every stream the batch was used on up to then. Those streams outlive the
  // release (DeviceBatch::use_on), so they are named without being owned.
  for (gpu::Stream* s : batch.used_on_)
    gpu::slot_pool_of(batch.storage_)
        .record_stream(batch.storage_.data(), std::shared_ptr<gpu::Stream>(std::shared_ptr<gpu::Stream>(), s));
  batch.used_on_.clear();
  Batch carrier{.storage = std::move(batch.storage_), .shape = batch.shape, .dtype = batch.dtype, .count = batch.count};
  try {
    if (carrier.labels_offset() != batch.labels_offset_)
      throw std::logic_error("to_dlpack: the device batch is not laid out as a stoker::Batch");
    return to_dlpack(std::move(carrier));
  } catch (...) {
    batch.storage_ = std::move(carrier.storage);
    throw;
  }
}

}  // namespace stoker
