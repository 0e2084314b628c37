// SPDX-License-Identifier: Apache-2.0
#include "vocabulary.h"

#include <map>

namespace stoker::inspect {

namespace {

// stoker-train's pipelines (apps/stoker-train/train.cpp): the options that set a stage's threads
// and a queue's capacity. Its other stages have one thread, and no option for more.
const std::map<std::string, std::string>& train_stage_options() {
  static const std::map<std::string, std::string> options{
      {"crops", "--crop-threads"}, {"collate", "--collate-threads"}, {"unpack", "--collate-threads"}};
  return options;
}

}  // namespace

Vocabulary::Vocabulary(const std::string& program, const std::string& data)
    : train_(program == "stoker-train"), images_(data == "images"), program_(train_ ? program : "the program") {}

std::string Vocabulary::stage_threads(const std::string& stage, int n) const {
  const std::string count = std::to_string(n);
  if (!train_) return "{.threads = " + count + "} on stage '" + stage + "'";
  const auto option = train_stage_options().find(stage);
  return option == train_stage_options().end() ? "" : option->second + " " + count;
}

std::string Vocabulary::pipeline_threads(int n) const {
  return train_ ? "--threads " + std::to_string(n) : "PipelineBuilder::threads(" + std::to_string(n) + ")";
}

std::string Vocabulary::queue_capacity(const std::string& queue, const std::string& producer, bool shuffle,
                                       std::size_t n) const {
  const std::string count = std::to_string(n);
  if (!train_)
    return shuffle ? ".shuffle(\"" + queue + "\", {.capacity = " + count + "})"
                   : "{.queue = " + count + "} on stage '" + producer + "'";
  if (shuffle) return "--shuffle-capacity " + count;
  if (producer == "read" || producer == "ids") return "--read-queue " + count;
  return "--batch-queue " + count;  // every queue of batches
}

std::string Vocabulary::min_after_dequeue(const std::string& queue, std::size_t capacity, std::size_t n) const {
  if (train_) return "--min-after-dequeue " + std::to_string(n);
  return ".shuffle(\"" + queue + "\", {.capacity = " + std::to_string(capacity) +
         ", .min_after_dequeue = " + std::to_string(n) + "})";
}

std::string Vocabulary::device_work() const {
  if (!train_) return "stoker::gpu::GpuAugment";
  return images_ ? "" : "--augment gpu";
}

}  // namespace stoker::inspect
