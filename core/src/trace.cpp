// SPDX-License-Identifier: Apache-2.0
#include "trace.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace stoker::detail {

namespace {
using Json = nlohmann::ordered_json;
constexpr int kPid = 1;
constexpr int kTimedPid = 2;  // work timed outside the pipeline: a device's streams

Json metadata(int pid, int tid, const char* what, Json args) {
  Json j{{"ph", "M"}, {"pid", pid}};
  if (tid >= 0) j["tid"] = tid;
  j["name"] = what;
  j["args"] = std::move(args);
  return j;
}
}  // namespace

TraceFile::TraceFile(const std::string& path, Clock::time_point origin) : path_(path), origin_(origin) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw std::runtime_error("trace '" + path + "': cannot open for writing: " + std::strerror(errno));
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", file_);
  emit(metadata(kPid, -1, "process_name", {{"name", "stoker pipeline"}}).dump());
}

TraceFile::~TraceFile() {
  if (file_ != nullptr) std::fclose(file_);
}

TraceFile::Track& TraceFile::add_track(const std::string& name, std::string span_name) {
  Track& t = tracks_.emplace_back();
  t.span_name_ = std::move(span_name);
  t.tid_ = static_cast<int>(tracks_.size());
  // Spans are the bulk of the file: their JSON is put together from a head made once.
  t.span_head_ = "{\"ph\":\"X\",\"pid\":" + std::to_string(kPid) + ",\"tid\":" + std::to_string(t.tid_) +
                 ",\"name\":" + Json(t.span_name_).dump() + ",\"ts\":";
  emit(metadata(kPid, t.tid_, "thread_name", {{"name", name}}).dump());
  emit(metadata(kPid, t.tid_, "thread_sort_index", {{"sort_index", t.tid_}}).dump());
  return t;
}

double TraceFile::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void TraceFile::emit(const std::string& head, const char* tail) {
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(head.c_str(), file_);
  std::fputs(tail, file_);
}

void TraceFile::write(Clock::time_point t, const std::vector<std::pair<std::string, std::size_t>>& fills,
                      const std::vector<TimedSpan>& timed) {
  for (Track& track : tracks_) {
    taken_.clear();
    {
      std::lock_guard lock(track.mutex_);
      std::swap(taken_, track.events_);
    }
    for (const Track::Event& e : taken_) {
      if (e.kind == Track::Kind::span) {
        char tail[64];
        const double begin = micros(e.begin);
        std::snprintf(tail, sizeof tail, "%.3f,\"dur\":%.3f}", begin, micros(e.end) - begin);
        emit(track.span_head_, tail);
      } else {
        emit(Json{{"ph", "i"},
                  {"pid", kPid},
                  {"tid", track.tid_},
                  {"s", "g"},
                  {"name", "epoch " + std::to_string(e.value + 1)},  // for people, from 1
                  {"ts", micros(e.begin)}}
                 .dump());
      }
    }
  }
  for (const TimedSpan& span : timed) {
    auto track = timed_tracks_.find(span.track);
    if (track == timed_tracks_.end()) {
      if (timed_tracks_.empty()) emit(metadata(kTimedPid, -1, "process_name", {{"name", "devices"}}).dump());
      track = timed_tracks_.emplace(span.track, static_cast<int>(timed_tracks_.size()) + 1).first;
      emit(metadata(kTimedPid, track->second, "thread_name", {{"name", span.track}}).dump());
    }
    const double begin = micros(span.begin);
    Json e{{"ph", "X"},         {"pid", kTimedPid}, {"tid", track->second},
           {"name", span.name}, {"ts", begin},      {"dur", micros(span.end) - begin}};
    if (span.bytes > 0) e["args"] = {{"bytes", span.bytes}};
    emit(e.dump());
  }
  for (std::size_t i = 0; i < fills.size(); ++i) {
    if (i == counter_heads_.size())
      counter_heads_.push_back("{\"ph\":\"C\",\"pid\":" + std::to_string(kPid) +
                               ",\"name\":" + Json("queue " + fills[i].first).dump() + ",\"ts\":");
    char tail[64];
    std::snprintf(tail, sizeof tail, "%.3f,\"args\":{\"items\":%zu}}", micros(t), fills[i].second);
    emit(counter_heads_[i], tail);
  }
}

void TraceFile::close() {
  if (file_ == nullptr) return;
  std::fputs("\n]}\n", file_);
  const bool failed = std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) throw std::runtime_error("trace '" + path_ + "': writing failed");
}

}  // namespace stoker::detail
