// SPDX-License-Identifier: Apache-2.0
#include "stream_tools.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace stoker::test {

struct StreamGate::State {
  gpu::Memory flag;  // pinned: the CUDA gate kernel reads it
  std::mutex mutex;
  std::condition_variable opened;

  volatile unsigned* word() { return reinterpret_cast<volatile unsigned*>(flag.data()); }
  bool is_open() {
    std::lock_guard lock(mutex);
    return *word() != 0;
  }
};

StreamGate::StreamGate(gpu::Device& device) : state_(std::make_shared<State>()) {
  state_->flag = device.allocate_pinned(sizeof(unsigned));
  *state_->word() = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

StreamGate::~StreamGate() { open(); }

void StreamGate::hold(gpu::Stream& stream) {
  if (void* native = stream.native_handle()) return detail::cuda_gate(native, state_->word());
  stream.host_task([state = state_] {
    std::unique_lock lock(state->mutex);
    state->opened.wait(lock, [&] { return *state->word() != 0; });
  });
}

void StreamGate::open() {
  {
    std::lock_guard lock(state_->mutex);
    *state_->word() = 1;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  state_->opened.notify_all();
}

void delay(gpu::Stream& stream, std::chrono::microseconds duration) {
  if (void* native = stream.native_handle()) return detail::cuda_delay(native, duration);
  stream.host_task([duration] { std::this_thread::sleep_for(duration); });
}

void fault(gpu::Stream& stream) {
  void* native = stream.native_handle();
  if (!native) throw std::logic_error("fault: a CUDA stream is needed, for a kernel that traps");
  detail::cuda_fault(native);
}

}  // namespace stoker::test
