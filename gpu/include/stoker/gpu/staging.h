// SPDX-License-Identifier: Apache-2.0
// Moving batches to a device: pools of pinned and device buffers, the host-to-device stage,
// and the device batch a training loop receives.
//
//   auto device = stoker::gpu::Device::open("auto");
//   stoker::gpu::ToDevice to_device(device, {.bytes = stoker::Batch::storage_bytes(shape, f32, 255)});
//   auto pipe = stoker::PipelineBuilder{}
//       ...
//       .batch("batch", 255)
//       .map("collate", stoker::Collate{.pool = to_device.staging()}, {.queue = 2})  // into pinned memory
//       .map("h2d", to_device, {.queue = 2})  // one copy per batch; 2 queued + 1 copied + 1 held = 4 buffers
//       .build();
//   for (auto& b : pipe.epoch()) {
//     b.use_on(compute);           // the device waits for the copy; the host does not
//     train_step(b, compute);
//     b.release_after(compute);    // the buffer goes back once the step is done
//   }
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/gpu/device.h"
#include "stoker/stages/batch.h"
#include "stoker/stages/buffer_pool.h"

namespace stoker {
struct DLPackBatch;
namespace gpu {
class DeviceBatch;
}
/// Defined, and documented, in stoker/gpu/dlpack.h.
DLPackBatch to_dlpack(gpu::DeviceBatch&& batch);
}  // namespace stoker

namespace stoker::gpu {

/// How many buffers a pool of a stage's outputs needs so that the stage never waits for its own
/// outputs: those one call holds at once, those the queue after the stage holds, and those the
/// consumer holds at once (the one it works on, and any it keeps longer, such as training steps
/// queued on the device). The one rule by which stoker sizes output pools: ToDevice's and
/// GpuAugment's defaults, and stoker-train, derive their counts from it.
struct OutputSizing {
  std::size_t per_call = 1;  ///< outputs one call of the stage holds at once
  std::size_t queued = 0;    ///< outputs the queue after the stage holds (its capacity)
  std::size_t held = 1;      ///< outputs the consumer holds at once
  constexpr std::size_t buffers() const noexcept { return per_call + queued + held; }
  /// "11 per call + 4 queued + 3 held by the consumer = 18 buffers", for errors and logs.
  std::string rule() const;
};

/// What a SlotPool says when a wait for one of its buffers gives up.
struct SlotPoolOptions {
  std::string name = "slot pool";  ///< which pool, in errors
  /// How to size it, in errors: what its buffers must cover (e.g. OutputSizing::rule()).
  std::string sizing;
  /// How long acquire() waits without a buffer coming back before it throws PoolTimeout; 0
  /// waits for ever. A pool sized by its rule waits for one only while the device works.
  std::chrono::milliseconds wait_limit{60'000};
};

/// A wait for a pool's buffer that gave up: every buffer held and none coming back (the pool
/// is smaller than what holds its buffers), or the device not passing the work the buffers wait
/// for. The message names the pool and says how it must be sized.
class PoolTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A fixed number of equal buffers of pinned host memory or of device memory, all allocated
/// when the pool is made and reused. An exhausted pool makes acquire() wait (counted as the
/// calling stage's blocked time, stoker::BlockedTime): backpressure, like a full queue.
/// Thread-safe. Its buffers may outlive the pool object itself but not `device`.
///
/// memory_kind() says pinned or device on the CUDA backend, and host on the CPU backend, whose
/// pinned and device memory are ordinary host memory: what an exported tensor claims must hold
/// for any CUDA code in the process too.
class SlotPool final : public BufferPool {
 public:
  enum class Kind : std::uint8_t { pinned, device };

  /// Throws std::invalid_argument for zero slots or zero bytes.
  static std::shared_ptr<SlotPool> create(std::shared_ptr<Device> device, Kind kind, std::size_t slots,
                                          std::size_t slot_bytes, SlotPoolOptions options = {});
  ~SlotPool() override;

  using BufferPool::acquire;
  /// A free buffer of `bytes` (at most slot_bytes()). Waits while every slot is in use; gives
  /// up by throwing PipelineStopped once `ctx.stop` is requested (its pipeline stops), and
  /// PoolTimeout once no buffer has come back for options().wait_limit, and the device's fault
  /// (DeviceError, Device::check()) within milliseconds of the fault, though no event it waits
  /// for will ever report it. Wakes as soon as a buffer is destroyed, or the device passes the
  /// events of one given back with release_after while it waits (the pool's own stream waits
  /// for them and announces it).
  /// Throws std::invalid_argument when `bytes` exceeds slot_bytes().
  Buffer acquire(std::size_t bytes, const StageContext& ctx) override;
  bool waits() const noexcept override { return true; }
  MemoryKind memory_kind() const noexcept override;
  /// The ordinal of the device its memory belongs to (Device::ordinal()).
  int device_id() const noexcept override;
  /// The same without waiting: nullopt when every slot is in use.
  std::optional<Buffer> try_acquire(std::size_t bytes);

  /// Takes `buffer` (one of this pool's) and makes its slot free again once the work issued
  /// to `stream` so far is done. Never waits for the device: acquire() checks the slot's event.
  void release_after(Buffer buffer, Stream& stream);
  /// The same once the work issued so far to every one of `streams` is done (an event recorded
  /// on each). With no stream, as a Buffer that is simply destroyed: once the point last
  /// recorded on the slot's event() has passed.
  void release_after(Buffer buffer, std::span<Stream* const> streams);
  /// The event that belongs to `buffer`'s slot, for the holder to record and share. A buffer
  /// destroyed without release_after() comes back once the point last recorded on it has
  /// passed: the work that filled it, when its filler recorded that, is never overwritten.
  Event& event(const Buffer& buffer);
  /// As torch.Tensor.record_stream: `stream` uses the held buffer that `data` points into, up
  /// to the buffer's release. When the buffer is given back (destroyed, or release_after()), an
  /// event is recorded on `stream` then, and the slot is not handed out again before the device
  /// has passed it. For a holder that hands the buffer to a consumer whose streams read it after
  /// the hand-off and who frees it without naming them (a DLPack export: the consumer's stream
  /// given to `__dlpack__`; a pinned batch a framework copies from on its own stream). The pool
  /// keeps `stream` alive until the slot is handed out again; naming one twice is once.
  /// Thread-safe, but not with the buffer's release: the caller holds the buffer, or a
  /// reference that keeps it. Throws std::invalid_argument when `data` is in none of the pool's
  /// held buffers, and what recording on `stream` throws (the stream is then not named).
  void record_stream(const void* data, std::shared_ptr<Stream> stream);
  /// The device its memory belongs to.
  const std::shared_ptr<Device>& device() const noexcept { return device_; }

  Kind kind() const noexcept { return kind_; }
  const SlotPoolOptions& options() const noexcept { return options_; }
  std::size_t slots() const noexcept { return slots_.size(); }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  /// Slots held, or waiting for their events. Throws DeviceError when an event reports a failure.
  std::size_t in_use() const;

 private:
  SlotPool(std::shared_ptr<Device> device, Kind kind, std::size_t slots, std::size_t slot_bytes,
           SlotPoolOptions options);
  void release(std::byte* data, std::size_t size) noexcept override;
  std::size_t slot_of(const std::byte* data) const;
  /// The slot whose memory holds `data`, anywhere in it.
  std::size_t slot_containing(const void* data) const;
  /// `retired`: the streams of the slots that came back, for the caller to let go of once it
  /// has let go of the lock (a stream's destructor waits for its work).
  std::optional<Buffer> take_free(std::unique_lock<std::mutex>& held, std::size_t bytes,
                                  std::vector<std::shared_ptr<Stream>>& retired);
  bool passed(std::size_t slot, std::size_t events) const;
  [[noreturn]] void time_out(std::chrono::steady_clock::duration waited) const;

  // The invariant: a slot is handed out again only once the device has passed its own event
  // (the work that filled it) and, on every stream that used it, the point where it was given
  // back (release_after()'s streams, and record_stream()'s, recorded at the release).
  struct Slot {
    Memory memory;
    /// [0] the slot's own event (a batch's ready()); [1..] one per stream that used it, recorded
    /// when it is given back, made as needed.
    std::vector<std::unique_ptr<Event>> events;
    /// Streams named by record_stream() since the slot was handed out; they move to its
    /// Pending entry when it is given back.
    std::vector<std::shared_ptr<Stream>> consumers;
  };
  struct Pending {
    std::size_t slot;
    std::size_t events;                          // the slot's first `events` events must all be done
    bool announced = false;                      // the pool's stream wakes the waiters once they are
    std::vector<std::shared_ptr<Stream>> named;  // kept alive until the slot is handed out
  };
  // What waiters wait on, shared with the host tasks that announce a slot's return: those
  // must not hold the pool itself, whose destructor would then run on a stream's thread.
  struct Wakeup {
    std::mutex mutex;  // also guards the pool's books
    std::condition_variable_any changed;
    std::uint64_t generation = 0;  // bumped, under `mutex`, with every notification
    void notify();
  };
  // The one way a slot comes back (release() and release_after()): see the invariant above.
  // Throws what recording throws, the slot's named streams left in place.
  void give_back(std::size_t slot, std::span<Stream* const> streams);
  void announce_after(Slot& slot, std::size_t events);
  std::shared_ptr<Device> device_;
  const Kind kind_;
  const std::size_t slot_bytes_;
  const SlotPoolOptions options_;
  std::vector<Slot> slots_;
  const std::shared_ptr<Wakeup> wake_ = std::make_shared<Wakeup>();
  std::size_t waiters_ = 0;    // threads in acquire(), under wake_->mutex
  std::uint64_t returns_ = 0;  // slots given back or freed so far, under wake_->mutex
  std::vector<std::size_t> free_;
  std::vector<Pending> pending_;  // released after events that may not be done yet
  // Waits for released slots' events and announces them with a host task; made when first
  // needed (on the CPU backend a stream is a thread). Declared after slots_: it goes first.
  std::mutex announcer_mutex_;
  std::unique_ptr<Stream> announcer_;
};

/// A batch in device memory, laid out as stoker::Batch (samples, then labels). Move-only.
///
/// Its buffer has a stream-ordered lifetime, as a tensor given to PyTorch's record_stream:
/// use_on() makes a stream wait for the batch and remembers that stream, and the buffer goes
/// back to its pool only once the work issued to every stream it was used on is done, however
/// the batch ends: release_after(), or destroyed (an early break, an exception in the training
/// step, a forgotten release). A batch destroyed before any use comes back once ready() has
/// passed. So no path hands the buffer to the next copy while queued work still reads it.
/// to_dlpack() (stoker/gpu/dlpack.h) hands the buffer to DLPack tensors instead.
class DeviceBatch {
 public:
  Shape shape;  ///< of one sample
  DType dtype = DType::f32;
  std::size_t count = 0;
  std::vector<std::int32_t> host_labels;  ///< the labels, also on the host: no copy back needed
  /// The samples' ids (Sample::id), in batch order, on the host only: which samples a step
  /// trained on (stoker-train's digest of an epoch). Empty where whoever made the batch did not
  /// give them.
  std::vector<std::uint64_t> host_ids;

  DeviceBatch() = default;
  DeviceBatch(Buffer storage, Shape shape, DType dtype, std::size_t count, std::size_t labels_offset,
              std::vector<std::int32_t> host_labels, std::vector<std::uint64_t> host_ids = {});
  DeviceBatch(DeviceBatch&& other) noexcept;
  /// Gives back the batch held before, as the destructor does.
  DeviceBatch& operator=(DeviceBatch&& other) noexcept;
  /// Gives the buffer back after the work of every stream the batch was used on. Never
  /// waits; never throws (a failure to record is logged, and the buffer kept from reuse).
  ~DeviceBatch();

  /// Device pointers (host pointers on the CPU backend).
  void* data() noexcept { return storage_.data(); }
  const void* data() const noexcept { return storage_.data(); }
  template <class T>
  T* data_as() {
    check_dtype<T>(dtype, "device batch");
    return reinterpret_cast<T*>(storage_.data());
  }
  template <class T>
  const T* data_as() const {
    check_dtype<T>(dtype, "device batch");
    return reinterpret_cast<const T*>(storage_.data());
  }
  const std::int32_t* labels() const noexcept {
    return reinterpret_cast<const std::int32_t*>(storage_.data() + labels_offset_);
  }
  std::size_t sample_elements() const noexcept { return shape.elements(); }

  /// Recorded after the work that filled the batch: make a stream wait() on it before use, or
  /// use_on() the stream.
  Event& ready() const;
  /// Makes `stream` wait for ready() (on the device; the host does not wait) and remembers it:
  /// the buffer is not reused before the work issued to `stream` up to its release is done.
  /// `stream` must outlive the batch's release. Once per stream is enough.
  void use_on(Stream& stream);
  /// Gives the buffer back once the work issued so far to `stream`, and to every stream the
  /// batch was used on, is done (use_on(stream) first if it was not); the batch is empty
  /// afterwards.
  void release_after(Stream& stream);
  bool empty() const noexcept { return storage_.empty(); }
  /// The pool its buffer belongs to. Throws std::logic_error for an empty batch.
  SlotPool& pool() const;

 private:
  friend DLPackBatch stoker::to_dlpack(DeviceBatch&& batch);
  void give_back() noexcept;
  Buffer storage_;  // from a SlotPool of device memory
  std::size_t labels_offset_ = 0;
  std::vector<Stream*> used_on_;
};

struct ToDeviceOptions {
  std::size_t bytes = 0;  ///< largest batch storage, Batch::storage_bytes(...)
  /// Pinned buffers batches are collated into: one being collated, the batches queued between
  /// the collate and h2d stages, and one being copied.
  std::size_t staging_buffers = 4;
  /// Device buffers, by OutputSizing: one being copied into, the batches queued after the h2d
  /// stage, and those the consumer holds at once. The default suits a queue of 2 after h2d
  /// and a consumer that holds one batch at a time.
  std::size_t device_buffers = OutputSizing{.per_call = 1, .queued = 2, .held = 1}.buffers();
  /// How long the stages wait for a buffer that does not come back before they fail
  /// (SlotPoolOptions::wait_limit); 0 waits for ever.
  std::chrono::milliseconds wait_limit{60'000};
};

/// The host-to-device stage (a map function, serial): one asynchronous copy per batch, of its
/// samples and labels, from a pinned staging buffer to a device buffer, on its own copy stream.
/// The staging buffer goes back to its pool once the copy is done, without the host waiting.
/// Copies are shared, so the pipeline and the caller can both hold one.
class ToDevice {
 public:
  /// Throws std::invalid_argument for zero bytes or zero buffers.
  ToDevice(std::shared_ptr<Device> device, ToDeviceOptions options);

  /// Throws std::invalid_argument if the batch's storage is not from staging().
  DeviceBatch operator()(Batch batch, const StageContext& ctx = {}) const;
  /// One batch at a time: the stage waits for device buffers its outputs would hold.
  static constexpr std::size_t max_chunk() { return 1; }

  /// Where a batch must be collated: Collate{.pool = to_device.staging()}.
  std::shared_ptr<SlotPool> staging() const noexcept { return state_->staging; }
  std::shared_ptr<SlotPool> device_pool() const noexcept { return state_->device_pool; }
  Device& device() const noexcept { return *state_->device; }
  std::shared_ptr<Device> shared_device() const noexcept { return state_->device; }

 private:
  struct State {
    std::shared_ptr<Device> device;
    std::shared_ptr<SlotPool> staging, device_pool;
    std::unique_ptr<Stream> copy_stream;
    ~State();
  };
  std::shared_ptr<State> state_;
};

}  // namespace stoker::gpu
