#include "stoker/core/detail/trace.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace stoker::detail {

namespace {
using Json = nlohmann::ordered_json;
constexpr int kPid = 1;
}  // namespace

TraceFile::TraceFile(const std::string& path, Clock::time_point origin) : path_(path), origin_(origin) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr)
    throw std::runtime_error("trace '" + path + "': cannot open for writing: " + std::strerror(errno));
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", file_);
  emit(Json{{"ph", "M"}, {"pid", kPid}, {"name", "process_name"}, {"args", {{"name", "stoker pipeline"}}}}.dump());
}

TraceFile::~TraceFile() {
  if (file_ != nullptr) std::fclose(file_);
}

TraceFile::Track& TraceFile::add_track(const std::string& name, std::string span_name) {
  Track& t = tracks_.emplace_back();
  t.span_name_ = std::move(span_name);
  t.tid_ = static_cast<int>(tracks_.size());
  emit(Json{{"ph", "M"}, {"pid", kPid}, {"tid", t.tid_}, {"name", "thread_name"}, {"args", {{"name", name}}}}.dump());
  emit(Json{
      {"ph", "M"}, {"pid", kPid}, {"tid", t.tid_}, {"name", "thread_sort_index"}, {"args", {{"sort_index", t.tid_}}}}
           .dump());
  return t;
}

double TraceFile::micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void TraceFile::emit(const std::string& json_object) {
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(json_object.c_str(), file_);
}

void TraceFile::write(Clock::time_point t, const std::vector<std::pair<std::string, std::size_t>>& fills) {
  for (Track& track : tracks_) {
    taken_.clear();
    {
      std::lock_guard lock(track.mutex_);
      std::swap(taken_, track.events_);
    }
    for (const Track::Event& e : taken_) {
      if (e.kind == Track::Kind::span)
        emit(Json{{"ph", "X"},
                  {"pid", kPid},
                  {"tid", track.tid_},
                  {"name", track.span_name_},
                  {"ts", micros(e.begin)},
                  {"dur", micros(e.end) - micros(e.begin)}}
                 .dump());
      else
        emit(Json{{"ph", "i"},
                  {"pid", kPid},
                  {"tid", track.tid_},
                  {"s", "g"},
                  {"name", "epoch " + std::to_string(e.value)},
                  {"ts", micros(e.begin)}}
                 .dump());
    }
  }
  for (const auto& [queue, size] : fills)
    emit(Json{{"ph", "C"}, {"pid", kPid}, {"name", "queue " + queue}, {"ts", micros(t)}, {"args", {{"items", size}}}}
             .dump());
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
