// SPDX-License-Identifier: Apache-2.0
#include "log.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace stoker::inspect {

using Json = nlohmann::json;

std::optional<std::uint64_t> OccupancyLog::counter(const std::string& name) const {
  for (const auto& [key, value] : counters)
    if (key == name) return value;
  return std::nullopt;
}

namespace {

// What is wrong with one line; the caller adds the file and the line number.
struct BadLine : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const Json& field(const Json& record, const char* key) {
  const auto it = record.find(key);
  if (it == record.end()) throw BadLine(record.at("type").get<std::string>() + " record has no '" + key + "'");
  return *it;
}

std::string text_field(const Json& record, const char* key) {
  const Json& v = field(record, key);
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    throw BadLine(std::string("'") + key + "' must be a non-empty string, not " + v.dump());
  return v.get<std::string>();
}

double seconds_value(const Json& v, const char* key) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw BadLine(std::string("'") + key + "' must be a non-negative number, not " + v.dump());
  return v.get<double>();
}
double seconds_field(const Json& record, const char* key) { return seconds_value(field(record, key), key); }

// A field later versions of the log added: absent in older logs.
std::optional<double> optional_seconds(const Json& record, const char* key) {
  const auto it = record.find(key);
  return it == record.end() ? std::nullopt : std::optional(seconds_value(*it, key));
}

// nlohmann reads every non-negative integer as unsigned, so this also rejects -1 and 2.5.
std::uint64_t count_value(const Json& v, const char* key) {
  if (!v.is_number_unsigned())
    throw BadLine(std::string("'") + key + "' must be a non-negative integer, not " + v.dump());
  return v.get<std::uint64_t>();
}
std::uint64_t count_field(const Json& record, const char* key) { return count_value(field(record, key), key); }
std::uint64_t optional_count(const Json& record, const char* key) {
  const auto it = record.find(key);
  return it == record.end() ? 0 : count_value(*it, key);
}

// A label's value as text: labels are strings, but a rank written as a number is the same rank.
std::string label(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 1,";
// the line is ours to name, so only the column and the reason are kept.
std::string parse_problem(const Json::exception& e) {
  std::string what = e.what();
  if (const auto column = what.find("column "); column != std::string::npos) return what.substr(column);
  if (const auto tag_end = what.find("] "); what.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos)
    return what.substr(tag_end + 2);
  return what;
}

// The first line of a file that is not an occupancy log but something a user may take for one:
// what it is and what to give instead; empty for anything else.
std::string other_kind(const std::string& line) {
  const std::string give = "; stoker-inspect reads the file written by --occupancy-log (.occupancy_log())";
  if (line.find("\"traceEvents\"") != std::string::npos || line.rfind("[", 0) == 0)
    return "a Chrome trace (--trace, .trace()), not an occupancy log: open it in ui.perfetto.dev" + give;
  if (line.find('\0') != std::string::npos) return "not an occupancy log: it is not text" + give;
  Json j;
  try {
    j = Json::parse(line);
  } catch (const Json::exception&) {
    return {};
  }
  if (!j.is_object()) return {};
  const auto format = j.find("format");
  if (format == j.end() || !format->is_string()) return {};
  if (*format == "stoker-train-checkpoint")
    return "a stoker-train checkpoint (--checkpoint), not an occupancy log: it resumes a run (--resume)" + give;
  if (*format == "stoker-pipeline-state")
    return "a pipeline's state (Pipeline::state()), not an occupancy log: it resumes a pipeline (.resume_from())" +
           give;
  return {};
}

class LogParser {
 public:
  explicit LogParser(OccupancyLog& log) : log_(log) {}

  void record(const std::string& line) {
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception& e) {  // also a number too large for a double
      throw BadLine("not JSON: " + parse_problem(e));
    }
    if (!j.is_object()) throw BadLine("a record must be a JSON object, not " + std::string(j.type_name()));
    const auto type = j.find("type");
    if (type == j.end() || !type->is_string()) throw BadLine("record has no string 'type'");
    // Logs before the run record carried the rank in every record.
    if (const auto rank = j.find("rank"); rank != j.end() && *type != "run") set_rank(label(*rank));
    if (*type == "run") return run(j);
    if (*type == "sample") return sample(j);
    if (*type == "stage") return stage(j);
    if (*type == "consumer") {
      log_.consumer = ConsumerCounters{count_field(j, "items"), seconds_field(j, "waited_s"), seconds_field(j, "t")};
      return;
    }
    if (*type == "pipeline") return pipeline(j);
    if (*type == "counters") return counters(j);
    if (*type == "epoch") return epoch(j);
    if (*type == "autotune") return move(j);
    // Other types are left for later versions of the log to add; they are not errors.
  }

 private:
  void set_rank(const std::string& r) {
    if (!log_.rank.empty() && log_.rank != r)
      throw BadLine("a record of rank " + r + " in the log of rank " + log_.rank);
    log_.rank = r;
  }

  // {"type":"run","t":0,"program":"stoker-train","job":"pmix:123","host":"h","pid":7,"threads":4,"cores":8,
  //  "rank":"1", ...labels}
  void run(const Json& j) {
    if (seen_run_) throw BadLine("a second run record: the file holds the logs of two runs; give each its own file");
    seen_run_ = true;
    log_.program = text_field(j, "program");
    log_.job = text_field(j, "job");
    if (const auto rank = j.find("rank"); rank != j.end()) set_rank(label(*rank));
    if (const auto role = j.find("role"); role != j.end()) log_.role = label(*role);
    if (const auto data = j.find("data"); data != j.end()) log_.data = label(*data);
    log_.pipeline.threads = static_cast<int>(optional_count(j, "threads"));
    log_.pipeline.cores = static_cast<int>(optional_count(j, "cores"));
  }

  void sample(const Json& j) {
    const double t = seconds_field(j, "t");
    const std::string name = text_field(j, "queue");
    const std::uint64_t size = count_field(j, "size");
    const std::uint64_t capacity = count_field(j, "capacity");
    if (capacity == 0) throw BadLine("'capacity' must be at least 1");
    const std::uint64_t floor = optional_count(j, "floor");
    if (floor >= capacity) throw BadLine("'floor' must be less than 'capacity'");
    const std::uint64_t waiting = optional_count(j, "waiting");
    const std::string producer = text_field(j, "producer");
    const std::string consumer = text_field(j, "consumer");

    auto [it, added] = index_.emplace(name, log_.queues.size());
    if (added) log_.queues.push_back({name, producer, consumer, capacity, floor, {}});
    QueueSeries& q = log_.queues[it->second];
    if (q.producer != producer || q.consumer != consumer)
      throw BadLine("queue '" + name + "' was between '" + q.producer + "' and '" + q.consumer +
                    "' earlier in the log, here between '" + producer + "' and '" + consumer + "'");
    q.capacity = capacity;
    q.floor = floor;
    // A shuffle hands out all it holds once its input has ended: more than its room, which
    // is as full as it gets.
    const double fill = std::min(1.0, static_cast<double>(size) / static_cast<double>(q.room()));
    q.samples.push_back({t, size, waiting, fill});
  }

  void stage(const Json& j) {
    StageCounters s;
    s.name = text_field(j, "stage");
    s.t = seconds_field(j, "t");
    const std::uint64_t threads = count_field(j, "threads");
    if (threads == 0 || threads > 1'000'000) throw BadLine("'threads' must be between 1 and 1000000");
    s.threads = static_cast<int>(threads);
    s.items_in = count_field(j, "items_in");
    s.items_out = count_field(j, "items_out");
    s.busy_s = seconds_field(j, "busy_s");
    s.starved_s = seconds_field(j, "starved_s");
    s.blocked_s = seconds_field(j, "blocked_s");
    s.pool_wait_s = std::min(s.blocked_s, optional_seconds(j, "pool_wait_s").value_or(0));
    log_.stages.push_back(std::move(s));
  }

  void pipeline(const Json& j) {
    PipelineFigures& p = log_.pipeline;
    p.threads = static_cast<int>(count_field(j, "threads"));
    p.cores = static_cast<int>(count_field(j, "cores"));
    p.cpu_s = optional_seconds(j, "cpu_s");
    p.runnable_s = optional_seconds(j, "runnable_s");
    p.process_cpu_s = optional_seconds(j, "process_cpu_s");
    p.machine_busy_pct = optional_seconds(j, "machine_busy_pct");
  }

  void counters(const Json& j) {
    const Json& all = field(j, "counters");
    if (!all.is_object()) throw BadLine("'counters' must be an object of names and counts, not " + all.dump());
    for (const auto& [name, value] : all.items()) {
      if (!value.is_number_unsigned())
        throw BadLine("counter '" + name + "' must be a non-negative integer, not " + value.dump());
      log_.counters.emplace_back(name, value.get<std::uint64_t>());
    }
  }

  void epoch(const Json& j) { log_.epochs.push_back({seconds_field(j, "t"), count_field(j, "epoch")}); }

  // {"type":"autotune","t":1.2,"changes":[{"stage":"crops","from":1,"to":2},...],"evidence":"..."}
  void move(const Json& j) {
    TuningMove m{seconds_field(j, "t"), "", text_field(j, "evidence")};
    const Json& changes = field(j, "changes");
    if (!changes.is_array() || changes.empty())
      throw BadLine("'changes' must be a non-empty array of {stage, from, to}, not " + changes.dump());
    for (const Json& c : changes) {
      if (!c.is_object()) throw BadLine("a change must be an object {stage, from, to}, not " + c.dump());
      m.what += (m.what.empty() ? "" : ", ") + text_field(c, "stage") + " " + std::to_string(count_field(c, "from")) +
                " -> " + std::to_string(count_field(c, "to")) + (m.what.empty() ? " threads" : "");
    }
    log_.moves.push_back(std::move(m));
  }

  OccupancyLog& log_;
  std::map<std::string, std::size_t> index_;  // queue name -> position in log_.queues
  bool seen_run_ = false;
};

// The monitor writes queues in pipeline order, but a queue whose first records were
// skipped as malformed would come late; the producer -> consumer chain restores the order.
// Anything that is not a single chain is left in the order of the log.
void order_by_chain(std::vector<QueueSeries>& queues) {
  std::map<std::string, std::size_t> by_producer;
  std::set<std::string> consumers;
  for (std::size_t i = 0; i < queues.size(); ++i) {
    if (!by_producer.emplace(queues[i].producer, i).second) return;
    consumers.insert(queues[i].consumer);
  }
  std::vector<std::size_t> heads;
  for (std::size_t i = 0; i < queues.size(); ++i)
    if (!consumers.contains(queues[i].producer)) heads.push_back(i);
  if (heads.size() != 1) return;

  std::vector<std::size_t> chain{heads.front()};
  for (auto next = by_producer.find(queues[chain.back()].consumer);
       next != by_producer.end() && chain.size() < queues.size();
       next = by_producer.find(queues[chain.back()].consumer))
    chain.push_back(next->second);
  if (chain.size() != queues.size()) return;

  std::vector<QueueSeries> ordered;
  for (std::size_t i : chain) ordered.push_back(std::move(queues[i]));
  queues = std::move(ordered);
}

}  // namespace

OccupancyLog parse_log(std::istream& in, const std::string& source, ReadOptions options) {
  OccupancyLog log;
  log.source = source;
  LogParser parser(log);
  std::string line;
  bool first = true;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a trailing newline is no error
    if (std::exchange(first, false))
      if (const std::string kind = other_kind(line); !kind.empty()) throw LogError(source + ": " + kind);
    try {
      parser.record(line);
    } catch (const BadLine& e) {
      if (!options.skip_bad_lines) throw LogError(source + ":" + std::to_string(number) + ": " + e.what());
      if (log.skipped_lines++ == 0) log.first_skipped = "line " + std::to_string(number) + ": " + e.what();
    }
  }
  if (in.bad()) throw LogError(source + ": read error");
  if (log.queues.empty()) {
    throw LogError(source + ": no sample records" +
                   (log.skipped_lines > 0 ? " (" + std::to_string(log.skipped_lines) + " malformed lines skipped)"
                                          : std::string(" (is it a log written by .occupancy_log()?)")));
  }
  order_by_chain(log.queues);
  return log;
}

OccupancyLog read_log(const std::string& path, ReadOptions options) {
  std::error_code ignored;
  // A directory opens as a stream and then fails at the first read, which says less.
  if (std::filesystem::is_directory(path, ignored)) {
    if (std::filesystem::exists(std::filesystem::path(path) / "checkpoint", ignored))
      throw LogError(path +
                     ": is a checkpoint directory (stoker-train --checkpoint), not an occupancy log; "
                     "stoker-inspect reads the file written by --occupancy-log");
    throw LogError(path + ": is a directory, not a log");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw LogError(path + ": cannot open: " + std::strerror(errno));
  return parse_log(in, path, options);
}

}  // namespace stoker::inspect
