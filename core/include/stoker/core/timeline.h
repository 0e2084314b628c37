// SPDX-License-Identifier: Apache-2.0
// Work timed outside the pipeline's threads, such as the copies and kernels on a device's
// streams, for the pipeline's trace (PipelineOptions::trace, PipelineOptions::timelines).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace stoker {

/// One piece of timed work: [begin, end) on the steady clock, on the track `track` (one per
/// device stream, e.g. "cuda:0 stream 2"), which the trace draws under a "devices" process.
struct TimedSpan {
  std::string track;
  const char* name = "";    ///< static storage: "h2d", "crop", "gemm", ...
  std::uint64_t bytes = 0;  ///< bytes moved, for a copy; 0 for a kernel
  std::chrono::steady_clock::time_point begin, end;
};

/// A source of timed spans, e.g. stoker::gpu::device_timeline(device). A traced pipeline calls
/// start() once as it starts (the source times its work from then on, and may refuse by
/// throwing, e.g. when another trace already listens), take() at every trace write, from one
/// thread, to move out the spans that ended since the last take(), each track's in time order,
/// and stop() once after the last take(); work still running then is left out of the trace.
class TimelineSource {
 public:
  virtual ~TimelineSource() = default;
  virtual void start() = 0;
  virtual void take(std::vector<TimedSpan>& out) = 0;
  virtual void stop() noexcept = 0;
};

}  // namespace stoker
