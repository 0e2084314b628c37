// SPDX-License-Identifier: Apache-2.0
#include "stoker/gpu/device.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends.h"
#include "stoker_log.h"

namespace stoker::gpu {

const char* backend_name(Backend b) noexcept { return b == Backend::cuda ? "cuda" : "cpu"; }

namespace {

// N of "cuda:N", or nullopt for "cuda" alone: the caller's current device.
std::optional<int> cuda_ordinal(std::string_view spec) {
  if (spec == "cuda") return std::nullopt;
  const std::string_view digits = spec.substr(5);
  int ordinal = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
  if (digits.empty() || digits.front() == '-' || digits.front() == '+' || error != std::errc{} ||
      end != digits.data() + digits.size())
    throw std::invalid_argument("device '" + std::string(spec) +
                                "': expected cuda:N with N the number of a CUDA device (0, 1, ...)");
  return ordinal;
}

}  // namespace

std::shared_ptr<Device> Device::open(std::string_view backend) {
  if (backend == "cpu") return detail::open_cpu_device(false);
  if (backend == "cpu:sticky") return detail::open_cpu_device(true);
  if (backend == "auto") {
    if (cuda_device_count() > 0) return detail::open_cuda_device(detail::current_cuda_device());
    if (const std::string problem = cuda_problem(); !problem.empty())
      log::warn("stoker::gpu: device 'auto': CUDA cannot start ({}); using the CPU backend", problem);
    return detail::open_cpu_device(false);
  }
  if (backend == "cuda" || backend.starts_with("cuda:")) {
    const std::string option = "device '" + std::string(backend) + "'";
    const std::optional<int> ordinal = cuda_ordinal(backend);
    if (!built_with_cuda())
      throw std::runtime_error(option + ": this build of stoker has no CUDA backend (configure with STOKER_CUDA=ON)");
    const int count = cuda_device_count();
    if (count == 0) {
      const std::string problem = cuda_problem();
      throw std::runtime_error(option + (problem.empty()
                                             ? ": no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
                                             : ": CUDA cannot start: " + problem));
    }
    if (ordinal && *ordinal >= count)
      throw std::runtime_error(option + ": there is no CUDA device " + std::to_string(*ordinal) + ", only " +
                               std::to_string(count) + " visible (cuda:0 to cuda:" + std::to_string(count - 1) +
                               "; check CUDA_VISIBLE_DEVICES)");
    return detail::open_cuda_device(ordinal.value_or(detail::current_cuda_device()));
  }
  throw std::invalid_argument("device '" + std::string(backend) + "': expected auto, cpu, cpu:sticky, cuda or cuda:N");
}

CounterSource transfer_counters(std::shared_ptr<const Device> device) {
  return [device = std::move(device)] {
    const auto t = device->transfers();
    return std::vector<Counter>{{"h2d_copies", t.h2d_copies},
                                {"h2d_bytes", t.h2d_bytes},
                                {"d2h_copies", t.d2h_copies},
                                {"d2h_bytes", t.d2h_bytes}};
  };
}

namespace {

// A device's timeline as a pipeline's trace takes it.
class DeviceTimeline final : public TimelineSource {
 public:
  explicit DeviceTimeline(std::shared_ptr<Device> device) : device_(std::move(device)) {
    if (!device_) throw std::invalid_argument("device_timeline: no device (a null pointer)");
  }
  void start() override {
    if (started_) throw std::logic_error("device_timeline: started twice");
    base().start_timeline();
    started_ = true;
  }
  void take(std::vector<TimedSpan>& out) override {
    if (started_) base().take_timeline(out);
  }
  // Only the timeline that started stops the device's: one refused leaves the other listening.
  void stop() noexcept override {
    if (std::exchange(started_, false)) base().stop_timeline();
  }

 private:
  // Every device is a backend's: Device::open() makes them all.
  detail::DeviceBase& base() { return static_cast<detail::DeviceBase&>(*device_); }
  std::shared_ptr<Device> device_;
  bool started_ = false;
};

}  // namespace

void timed_work(Stream& stream, const char* name, const std::function<void()>& work) {
  if (auto* timed = dynamic_cast<detail::StreamBase*>(&stream))
    timed->timed(name, 0, work);
  else
    work();
}

Replay::Replay(Stream& stream, const std::function<void()>& issue)
    : stream_(stream),
      captured_(stream.native_handle() ? detail::capture_graph(stream, issue)
                                       : detail::capture_cpu_work(stream, issue)) {}

Replay::~Replay() = default;

void Replay::run() {
  if (stream_.native_handle())
    detail::launch_graph(stream_, captured_.get());
  else
    detail::launch_cpu_work(stream_, captured_.get());
}

std::shared_ptr<TimelineSource> device_timeline(std::shared_ptr<Device> device) {
  return std::make_shared<DeviceTimeline>(std::move(device));
}

TransferCounts Device::transfers() const noexcept {
  return {h2d_copies_.load(), h2d_bytes_.load(), d2h_copies_.load(), d2h_bytes_.load()};
}

void Device::count_h2d(std::size_t bytes) noexcept {
  h2d_copies_.fetch_add(1, std::memory_order_relaxed);
  h2d_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void Device::count_d2h(std::size_t bytes) noexcept {
  d2h_copies_.fetch_add(1, std::memory_order_relaxed);
  d2h_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

namespace detail {

std::shared_ptr<StreamSpans> DeviceBase::add_stream(const std::string& short_name) {
  std::lock_guard lock(streams_mutex_);
  prune_streams();  // so that a device whose timeline nobody takes keeps only its live streams
  auto spans = std::make_shared<StreamSpans>(short_name + " stream " + std::to_string(streams_made_++));
  streams_.push_back(spans);
  return spans;
}

void DeviceBase::check() {
  {
    std::lock_guard lock(fault_mutex_);
    if (fault_) std::rethrow_exception(fault_);
  }
  try {
    find_fault();
  } catch (...) {
    std::lock_guard lock(fault_mutex_);
    if (!fault_) fault_ = std::current_exception();
    std::rethrow_exception(fault_);
  }
}

void DeviceBase::find_fault() {
  std::vector<std::shared_ptr<StreamSpans>> streams;
  {
    std::lock_guard lock(streams_mutex_);
    streams = streams_;
  }
  for (const auto& stream : streams) {
    std::lock_guard lock(stream->mutex);  // the stream's destructor delists it first
    if (stream->live) stream->live->query_fault();
  }
}

void DeviceBase::prune_streams() noexcept {
  std::erase_if(streams_, [](const std::shared_ptr<StreamSpans>& stream) {
    std::lock_guard spans(stream->mutex);
    return stream->closed && stream->spans.empty();
  });
}

void DeviceBase::start_timeline() {
  std::lock_guard timeline(timeline_mutex_);
  if (timing())
    throw std::logic_error("device_timeline: the work of " + name() +
                           " already goes to another trace; one trace at a time takes a device's timeline");
  drop_spans();
  timeline_starting();
  listening_.store(true);
}

void DeviceBase::take_timeline(std::vector<TimedSpan>& out) {
  std::lock_guard timeline(timeline_mutex_);
  before_take();
  std::vector<std::shared_ptr<StreamSpans>> streams;
  {
    std::lock_guard lock(streams_mutex_);
    streams = streams_;
  }
  for (const auto& stream : streams) {
    // The issued spans at the front are copied out, and their times read without the stream's
    // mutex: a thread issuing work to the stream takes it at every span, and must not wait for
    // the device's clock readings (three CUDA calls a span).
    std::vector<std::shared_ptr<Span>> issued;
    {
      std::lock_guard spans(stream->mutex);
      for (const auto& span : stream->spans) {
        if (!span->issued) break;
        issued.push_back(span);
      }
    }
    std::size_t done = 0;
    for (const auto& span : issued) {
      const Resolved r = span->dropped ? Resolved::lost : resolve(*stream, *span);
      if (r == Resolved::pending) break;  // and so are the spans after it, issued later
      if (r == Resolved::ready) {
        // A stream runs one piece of work at a time: a span that would begin before the last
        // one ended (the device's clock read through another reference) begins as it ends.
        const auto begin = std::max(span->begin, stream->last_end);
        const auto end = std::max(span->end, begin);
        out.push_back({stream->track, span->name, span->bytes, begin, end});
        stream->last_end = end;
      }
      ++done;
    }
    std::lock_guard spans(stream->mutex);
    for (; done > 0; --done) {
      give_back(*stream->spans.front());
      stream->spans.pop_front();
    }
  }
  std::lock_guard lock(streams_mutex_);
  prune_streams();
}

void DeviceBase::stop_timeline() noexcept {
  std::lock_guard timeline(timeline_mutex_);
  listening_.store(false);  // what is left is dropped as the next timeline starts
}

void DeviceBase::issued(StreamSpans& stream, Span& span, bool timed) noexcept {
  std::lock_guard lock(stream.mutex);
  if (!timed) span.dropped = true;
  span.issued = true;
  if (span.released) release(span);  // a mark stored after the device let go of the span
}

void DeviceBase::drop_spans() noexcept {
  std::lock_guard lock(streams_mutex_);
  for (auto& stream : streams_) {
    std::lock_guard spans(stream->mutex);
    for (auto& span : stream->spans) give_back(*span);
    stream->spans.clear();
  }
}

std::string async_failure(const std::string& what) {
  return "device work failed: " + what +
         ". Device work fails after the call that issued it returned, so this is reported by the first check that "
         "followed (by the stage that issued the work, at its next call, or by whoever waits for it); run with "
         "CUDA_LAUNCH_BLOCKING=1 to have each CUDA launch report its own failure";
}

void log_teardown_failure(const char* where) noexcept {
  static std::atomic<bool> logged{false};
  try {
    std::string what = "unknown exception";
    try {
      if (const auto current = std::current_exception()) std::rethrow_exception(current);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    if (!logged.exchange(true))
      log::error("stoker::gpu: {} went on past a failure of device work (later ones are logged at debug level): {}",
                 where, what);
    else
      log::debug("stoker::gpu: {} went on past a failure of device work: {}", where, what);
  } catch (...) {  // no memory to log with: the destructor goes on all the same
  }
}

}  // namespace detail

}  // namespace stoker::gpu
