// SPDX-License-Identifier: Apache-2.0
// How a suggestion is spelled for the program that wrote the log: stoker-train's options for a
// stoker-train log (`--crop-threads 4`), the C++ API for a program built on the library
// (`{.threads = 4}`).
#pragma once

#include <cstddef>
#include <string>

namespace stoker::inspect {

class Vocabulary {
 public:
  /// For the log of `program` (the run record's; empty for a log without one: the library's terms),
  /// which read `data` (the run record's "data" label: "images" for stoker-train --images).
  explicit Vocabulary(const std::string& program, const std::string& data = {});

  /// How to give stage `stage` `n` threads: "--crop-threads 4", "{.threads = 4} on stage 'crops'";
  /// empty when the program has no way to.
  std::string stage_threads(const std::string& stage, int n) const;
  /// How to give the pipeline `n` threads: "--threads 4", "PipelineBuilder::threads(4)".
  std::string pipeline_threads(int n) const;
  /// How to make the queue `queue` (produced by `producer`) hold `n` items; empty when the
  /// program has no way to.
  std::string queue_capacity(const std::string& queue, const std::string& producer, bool shuffle, std::size_t n) const;
  /// How to make shuffle `queue` (of `capacity`) keep `n` items back (min_after_dequeue).
  std::string min_after_dequeue(const std::string& queue, std::size_t capacity, std::size_t n) const;
  /// The program's way to move the crops to the device, for a pipeline short of cores: "--augment gpu",
  /// or the library's GpuAugment; empty when the program has none (stoker-train --images, which
  /// refuses --augment gpu).
  std::string device_work() const;
  /// "stoker-train" or "the program".
  const std::string& program() const { return program_; }

 private:
  bool train_ = false;
  bool images_ = false;
  std::string program_;
};

}  // namespace stoker::inspect
