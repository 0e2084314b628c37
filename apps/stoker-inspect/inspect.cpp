#include "inspect.h"

#include "format.h"
#include "plot_page.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <utility>

namespace stoker::inspect {

using Json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------
// Parsing

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

double seconds_field(const Json& record, const char* key) {
  const Json& v = field(record, key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
    throw BadLine(std::string("'") + key + "' must be a non-negative number, not " + v.dump());
  return v.get<double>();
}

// nlohmann reads every non-negative integer as unsigned, so this also rejects -1 and 2.5.
std::uint64_t count_field(const Json& record, const char* key) {
  const Json& v = field(record, key);
  if (!v.is_number_unsigned())
    throw BadLine(std::string("'") + key + "' must be a non-negative integer, not " + v.dump());
  return v.get<std::uint64_t>();
}

// nlohmann's messages start with "[json.exception.parse_error.101] parse error at line 1,";
// the line is ours to name, so only the column and the reason are kept.
std::string parse_problem(const Json::exception& e) {
  std::string what = e.what();
  if (const auto column = what.find("column "); column != std::string::npos) return what.substr(column);
  if (const auto tag_end = what.find("] "); what.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos)
    return what.substr(tag_end + 2);
  return what;
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
    if (const auto rank = j.find("rank"); rank != j.end()) {
      const std::string r = rank->is_string() ? rank->get<std::string>() : rank->dump();
      if (!log_.rank.empty() && log_.rank != r)
        throw BadLine("a record of rank " + r + " in the log of rank " + log_.rank);
      log_.rank = r;
    }
    if (*type == "consumer") {
      log_.consumer = ConsumerCounters{count_field(j, "items"), seconds_field(j, "waited_s"), seconds_field(j, "t")};
      return;
    }
    if (*type == "pipeline") {
      log_.pipeline_threads = static_cast<int>(count_field(j, "threads"));
      log_.cores = static_cast<int>(count_field(j, "cores"));
      return;
    }
    if (*type == "sample") return sample(j);
    if (*type == "stage") return stage(j);
    if (*type == "counters") return counters(j);
    if (*type == "epoch") return epoch(j);
    if (*type == "autotune") return move(j);
    // Other types are left for later versions of the log to add; they are not errors.
  }

 private:
  void sample(const Json& j) {
    const double t = seconds_field(j, "t");
    const std::string name = text_field(j, "queue");
    const std::uint64_t size = count_field(j, "size");
    const std::uint64_t capacity = count_field(j, "capacity");
    if (capacity == 0) throw BadLine("'capacity' must be at least 1");
    const std::string producer = text_field(j, "producer");
    const std::string consumer = text_field(j, "consumer");

    auto [it, added] = index_.emplace(name, log_.queues.size());
    if (added) log_.queues.push_back({name, producer, consumer, capacity, {}});
    QueueSeries& q = log_.queues[it->second];
    if (q.producer != producer || q.consumer != consumer)
      throw BadLine("queue '" + name + "' was between '" + q.producer + "' and '" + q.consumer +
                    "' earlier in the log, here between '" + producer + "' and '" + consumer + "'");
    q.capacity = capacity;
    // A meter read while an item is half-way in can exceed the capacity by a little; that
    // is a full queue, not a broken log.
    const double fill = std::min(1.0, static_cast<double>(size) / static_cast<double>(capacity));
    q.samples.push_back({t, size, fill});
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
    log_.stages.push_back(std::move(s));
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
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // a trailing newline is no error
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
  if (std::filesystem::is_directory(path, ignored)) throw LogError(path + ": is a directory, not a log");
  std::ifstream in(path);
  if (!in) throw LogError(path + ": cannot open: " + std::strerror(errno));
  return parse_log(in, path, options);
}

// ---------------------------------------------------------------------------------------
// Analysis

namespace {

QueueSummary summarize(const QueueSeries& q) {
  QueueSummary s{q.name, q.producer, q.consumer, q.capacity, q.samples.size()};
  if (q.samples.empty()) return s;
  std::vector<double> fills;
  double empty = 0, full = 0;
  enum class Extreme { none, empty, full } last = Extreme::none;
  for (const FillSample& x : q.samples) {
    fills.push_back(x.fill);
    empty += x.size == 0;
    full += x.fill >= 1.0;
    const Extreme now = x.size == 0 ? Extreme::empty : x.fill >= 1.0 ? Extreme::full : Extreme::none;
    if (now == Extreme::none) continue;
    if (last != Extreme::none && now != last) ++s.swings;
    last = now;
  }
  const double n = static_cast<double>(fills.size());
  std::sort(fills.begin(), fills.end());
  for (double f : fills) s.mean_fill += f / n;
  // Nearest rank: the smallest fill that at least 95% of the samples do not exceed.
  const auto rank = static_cast<std::size_t>(std::ceil(0.95 * n));
  s.p95_fill = fills[std::max<std::size_t>(rank, 1) - 1];
  s.empty_pct = 100.0 * empty / n;
  s.full_pct = 100.0 * full / n;
  return s;
}

StageSummary shares(const StageCounters& c, double fallback_run_s) {
  StageSummary s{c};
  const double run = c.t > 0 ? c.t : fallback_run_s;
  if (run <= 0) return s;
  auto pct = [](double part, double whole) { return std::clamp(100.0 * part / whole, 0.0, 100.0); };
  s.busy_pct = pct(c.busy_s, run * c.threads);
  s.starved_pct = pct(c.starved_s, run);
  s.blocked_pct = pct(c.blocked_s, run);
  return s;
}

using apps::fixed;

std::string percent(double pct) { return fixed(pct, 0) + "%"; }

// THE BOTTLENECK RULE
//
// Every stage runs as fast as it can until a queue stops it, so the slowest stage sets the
// pace of the whole pipeline. Everything before it produces faster than it consumes: those
// queues fill up and their producers wait on full outputs (blocked). Everything after it
// consumes faster than it is fed: those queues run dry and their consumers wait on empty
// inputs (starved). The slowest stage itself neither waits for input nor for room: it is
// busy all the time. The training loop is the stage after the last queue, so "every queue
// full" names it, and "every queue empty" names the source.
//
// So each stage in the chain is a candidate, and each is scored by how well the run fits
// that picture: a queue counts by its mean fill when it lies before the candidate and by
// its mean emptiness (1 - fill) after it; when the stage counters are there, a stage
// counts by its blocked share before the candidate, its starved share after it, and the
// candidate by its busy share. The candidate with the best fit (0..1) is the bottleneck;
// the fit is reported, because a pipeline whose stages are nearly balanced fits every
// candidate about equally.
//
// Mean fill rather than time-full: a blocked producer resumes only when its queue is back
// to half full, so a queue held up by a slow consumer swings between half and full and is
// "full" in only part of the samples.
class Verdict {
 public:
  Verdict(const std::vector<QueueSummary>& queues, const std::vector<StageSummary>& stages) : queues_(queues) {
    // Candidate k lies between queue k-1 and queue k; the last is the training loop.
    for (const QueueSummary& q : queues) candidates_.push_back(q.producer);
    candidates_.push_back(queues.back().consumer);
    for (const std::string& name : candidates_) {
      const auto it =
          std::find_if(stages.begin(), stages.end(), [&](const StageSummary& s) { return s.counters.name == name; });
      counters_.push_back(it == stages.end() ? nullptr : &*it);
    }
  }

  /// The threads of every stage with counters, the training loop's none.
  int threads_given() const {
    int n = 0;
    for (const StageSummary* s : counters_) n += s ? s->counters.threads : 0;
    return n;
  }

  std::size_t bottleneck() const {
    std::size_t best = 0;
    for (std::size_t k = 1; k < candidates_.size(); ++k)
      if (fit(k) > fit(best)) best = k;
    return best;
  }

  double fit(std::size_t k) const {
    double queue_fit = 0;
    for (std::size_t i = 0; i < queues_.size(); ++i)
      queue_fit += i < k ? queues_[i].mean_fill : 1.0 - queues_[i].mean_fill;
    queue_fit /= static_cast<double>(queues_.size());

    double stage_fit = 0;
    int counted = 0;
    for (std::size_t j = 0; j < candidates_.size(); ++j) {
      const StageSummary* s = counters_[j];
      if (!s) continue;
      stage_fit += (j < k ? s->blocked_pct : j > k ? s->starved_pct : s->busy_pct) / 100.0;
      ++counted;
    }
    return counted == 0 ? queue_fit : (queue_fit + stage_fit / counted) / 2;
  }

  const std::string& name(std::size_t k) const { return candidates_[k]; }
  const StageSummary* counters(std::size_t k) const { return counters_[k]; }
  bool is_source(std::size_t k) const { return k == 0; }
  bool is_trainer(std::size_t k) const { return k + 1 == candidates_.size(); }

 private:
  const std::vector<QueueSummary>& queues_;
  std::vector<std::string> candidates_;        // stage names in pipeline order
  std::vector<const StageSummary*> counters_;  // per candidate; null without a record
};

std::string describe_full(const QueueSummary& q) {
  return q.name + ": mean fill " + fixed(q.mean_fill, 2) + ", full in " + percent(q.full_pct) + " of samples";
}
std::string describe_empty(const QueueSummary& q) {
  return q.name + ": mean fill " + fixed(q.mean_fill, 2) + ", empty in " + percent(q.empty_pct) + " of samples";
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

std::string evidence(const Verdict& v, std::size_t k, const std::vector<QueueSummary>& queues) {
  std::vector<std::string> before, after;
  for (std::size_t i = 0; i < queues.size(); ++i)
    (i < k ? before : after).push_back(i < k ? describe_full(queues[i]) : describe_empty(queues[i]));

  std::string out;
  if (v.is_trainer(k))
    out = "every queue sits near full, so every stage waits on the training loop (" + join(before, "; ") + ")";
  else if (v.is_source(k))
    out = "every queue sits near empty, so every stage waits on the source '" + v.name(k) + "' (" + join(after, "; ") +
          ")";
  else
    out = "the queues before '" + v.name(k) + "' sit near full (" + join(before, "; ") +
          ") and the queues after it near empty (" + join(after, "; ") + ")";

  if (const StageSummary* s = v.counters(k))
    out += "; '" + v.name(k) + "' was busy " + percent(s->busy_pct) + " of the time of its " +
           std::to_string(s->counters.threads) + (s->counters.threads == 1 ? " thread" : " threads") + ", starved " +
           percent(s->starved_pct) + ", blocked " + percent(s->blocked_pct);
  else if (v.is_trainer(k) && k > 0 && v.counters(k - 1))
    out += "; '" + v.name(k - 1) + "', which feeds the training loop, was blocked " +
           percent(v.counters(k - 1)->blocked_pct) + " of the run";
  return out;
}

// A queue that is often empty and often full is in the way of a pipeline whose stages run
// in bursts: it cannot hold a burst's output, so the producer waits, and then it cannot
// cover the next lull, so the consumer waits. But every run fills its queues at the start
// and drains them after the last item, and in a short run the drain alone can be 10% of
// the samples; that is two swings, so a queue must swing more often than that as well.
constexpr double kSwingPct = 10.0;
constexpr std::size_t kSwings = 4;

std::string suggestion(const Verdict& v, std::size_t k, const std::vector<QueueSummary>& queues,
                       const OccupancyLog& log) {
  std::string out;
  const StageSummary* s = v.counters(k);
  if (v.is_trainer(k)) {
    out =
        "the input pipeline keeps ahead of training: speed up the training step; the input stages have "
        "threads to spare";
  } else if (v.is_source(k) && (!s || s->counters.threads == 1)) {
    // A source is called by one thread at a time, so more threads cannot help it.
    out = "the source '" + v.name(k) +
          "' runs on one thread: make each call cheaper, for example by moving decoding into a map stage "
          "with more threads, or read several shards in parallel";
  } else if (s) {
    const int threads = s->counters.threads;
    out = "give '" + v.name(k) + "' more threads (it has " + std::to_string(threads) +
          "; try {.threads = " + std::to_string(threads * 2) + "}), or make its function cheaper";
    // The stages' bodies run on the pipeline's threads: more for one stage than the pipeline
    // has to spare would only queue its bodies behind the others'.
    const int given = v.threads_given();
    if (log.pipeline_threads > 0 && given + threads > log.pipeline_threads) {
      out += "; the pipeline's " + std::to_string(log.pipeline_threads) + " threads are all given to its stages (" +
             std::to_string(given) + " in all), so give it as many more (PipelineBuilder::threads(" +
             std::to_string(given + threads) + "))";
      if (log.cores > 0 && given + threads > log.cores)
        out += ": beyond the machine's " + std::to_string(log.cores) +
               " cores that helps a stage that waits (for a disk, a network, a device), not one that computes";
    }
  } else {
    out = "give '" + v.name(k) + "' more threads, or make its function cheaper";
  }
  for (const QueueSummary& q : queues)
    if (q.empty_pct >= kSwingPct && q.full_pct >= kSwingPct && q.swings >= kSwings)
      out += "; queue '" + q.name + "' swings between empty (" + percent(q.empty_pct) + " of samples) and full (" +
             percent(q.full_pct) + "): a larger capacity (" + std::to_string(q.capacity) + " now; try " +
             std::to_string(q.capacity * 2) + ") would absorb the bursts";
  return out;
}

// Below this the run fits no candidate much better than the others; the verdict says so.
constexpr double kConfidentFit = 0.6;

}  // namespace

Report analyze(const OccupancyLog& log) {
  if (log.queues.empty()) throw LogError(log.source + ": no queues to analyze");
  Report r;
  r.source = log.source;
  double first = INFINITY, last = -INFINITY;
  for (const QueueSeries& q : log.queues) {
    r.queues.push_back(summarize(q));
    for (const FillSample& x : q.samples) {
      first = std::min(first, x.t);
      last = std::max(last, x.t);
    }
  }
  r.duration_s = last >= first ? last - first : 0;
  for (const StageCounters& c : log.stages) r.stages.push_back(shares(c, last > 0 ? last : 0));
  r.counters = log.counters;

  const Verdict verdict(r.queues, r.stages);
  const std::size_t k = verdict.bottleneck();
  r.bottleneck = verdict.name(k);
  r.confidence = verdict.fit(k);
  r.evidence = evidence(verdict, k, r.queues);
  if (r.confidence < kConfidentFit)
    r.evidence = "weak evidence (the run fits other stages almost as well; see the plot): " + r.evidence;
  r.suggestion = suggestion(verdict, k, r.queues, log);
  r.moves = log.moves;
  return r;
}

// ---------------------------------------------------------------------------------------
// Output

namespace {

std::string pad(const std::string& s, std::size_t width, bool right) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

// A table whose columns are as wide as their widest cell; the first `text_columns` are
// left-aligned, the numbers after them right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows, std::size_t text_columns) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (widths.size() <= c) widths.push_back(0);
      widths[c] = std::max(widths[c], row[c].size());
    }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) line += (c ? "  " : "") + pad(row[c], widths[c], c >= text_columns);
    out << line << '\n';
  }
}

double rounded(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

}  // namespace

void print_report(std::ostream& out, const Report& r) {
  const std::size_t samples = r.queues.empty() ? 0 : r.queues.front().samples;
  out << r.source << ": " << r.queues.size() << (r.queues.size() == 1 ? " queue" : " queues") << " over "
      << fixed(r.duration_s, 2) << " s, " << samples << (samples == 1 ? " sample" : " samples") << " per queue\n\n";

  std::vector<std::vector<std::string>> queues{
      {"queue", "producer -> consumer", "capacity", "mean fill", "p95 fill", "empty %", "full %", "swings"}};
  for (const QueueSummary& q : r.queues)
    queues.push_back({q.name, q.producer + " -> " + q.consumer, std::to_string(q.capacity), fixed(q.mean_fill, 2),
                      fixed(q.p95_fill, 2), fixed(q.empty_pct, 1), fixed(q.full_pct, 1), std::to_string(q.swings)});
  print_table(out, queues, 2);

  if (!r.stages.empty()) {
    out << '\n';
    std::vector<std::vector<std::string>> stages{{"stage", "threads", "items in", "items out", "busy s", "starved s",
                                                  "blocked s", "busy %", "starved %", "blocked %"}};
    for (const StageSummary& s : r.stages) {
      const StageCounters& c = s.counters;
      stages.push_back({c.name, std::to_string(c.threads), std::to_string(c.items_in), std::to_string(c.items_out),
                        fixed(c.busy_s, 3), fixed(c.starved_s, 3), fixed(c.blocked_s, 3), fixed(s.busy_pct, 1),
                        fixed(s.starved_pct, 1), fixed(s.blocked_pct, 1)});
    }
    print_table(out, stages, 1);
    out << "(busy % is of the stage's threads x the run; starved and blocked % are of the run)\n";
  }
  if (!r.counters.empty()) {
    std::string line;
    for (const auto& [name, value] : r.counters)
      line += (line.empty() ? "" : ", ") + name + " " + std::to_string(value);
    out << "\ncounters: " << line << '\n';
  }

  if (!r.moves.empty()) {
    out << "\nautotune: " << r.moves.size() << (r.moves.size() == 1 ? " move\n" : " moves\n");
    for (const TuningMove& m : r.moves)
      out << "  at " << fixed(m.t, 2) << " s: " << m.what << " (" << m.evidence << ")\n";
  }

  out << "\nbottleneck: " << r.bottleneck << " (fit " << fixed(r.confidence, 2) << ")\n"
      << "evidence:   " << r.evidence << "\n"
      << "suggestion: " << r.suggestion << "\n";
}

Json to_json(const Report& r) {
  Json queues = Json::array();
  for (const QueueSummary& q : r.queues)
    queues.push_back({{"name", q.name},
                      {"producer", q.producer},
                      {"consumer", q.consumer},
                      {"capacity", q.capacity},
                      {"samples", q.samples},
                      {"mean_fill", rounded(q.mean_fill, 4)},
                      {"p95_fill", rounded(q.p95_fill, 4)},
                      {"empty_pct", rounded(q.empty_pct, 2)},
                      {"full_pct", rounded(q.full_pct, 2)},
                      {"swings", q.swings}});
  Json counters = Json::object();
  for (const auto& [name, value] : r.counters) counters[name] = value;
  Json stages = Json::array();
  for (const StageSummary& s : r.stages) {
    const StageCounters& c = s.counters;
    stages.push_back({{"name", c.name},
                      {"threads", c.threads},
                      {"items_in", c.items_in},
                      {"items_out", c.items_out},
                      {"busy_s", c.busy_s},
                      {"starved_s", c.starved_s},
                      {"blocked_s", c.blocked_s},
                      {"busy_pct", rounded(s.busy_pct, 2)},
                      {"starved_pct", rounded(s.starved_pct, 2)},
                      {"blocked_pct", rounded(s.blocked_pct, 2)}});
  }
  Json moves = Json::array();
  for (const TuningMove& m : r.moves) moves.push_back({{"t", m.t}, {"what", m.what}, {"evidence", m.evidence}});
  return {{"file", r.source},
          {"duration_s", rounded(r.duration_s, 4)},
          {"queues", std::move(queues)},
          {"stages", std::move(stages)},
          {"counters", std::move(counters)},
          {"bottleneck", r.bottleneck},
          {"confidence", rounded(r.confidence, 3)},
          {"evidence", r.evidence},
          {"suggestion", r.suggestion},
          {"autotune", moves}};
}

// ---------------------------------------------------------------------------------------
// Plot
//
// The verdict on top; below it one lane per queue, source at the top, and between two lanes
// the row of the stage that empties the lane above and fills the lane below, with its busy,
// starved and blocked shares level with it on the right. The bottleneck is the row where the
// lanes change from full (above it) to empty (below it). The HTML page holds the same SVG and
// a script (plot_page.h) that redraws the lanes, the time axis and the epochs for a time range
// from a finer binning of the samples.

namespace {

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 allows no control characters but tab and newline, not even as references.
        out += static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' ? '?' : c;
    }
  }
  return out;
}

// A coordinate for an attribute: one decimal, none when it is whole.
std::string num(double v) {
  std::string s = fixed(v, 1);
  if (s.ends_with(".0")) s.resize(s.size() - 2);
  return s == "-0" ? "0" : s;
}

// 1, 2 or 5 times a power of ten, giving about `ticks` ticks over `range`. The page's script
// has the same rule, so that the axis reads the same before and after a zoom.
double nice_step(double range, int ticks) {
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10 * power;
}

// The samples of one queue within a stretch of time: the lowest, the mean and the highest fill.
struct Bin {
  double lo = 0, hi = 0, sum = 0;
  std::size_t n = 0;

  void add(double fill) {
    lo = n == 0 ? fill : std::min(lo, fill);
    hi = n == 0 ? fill : std::max(hi, fill);
    sum += fill;
    ++n;
  }
  double mean() const { return n == 0 ? 0 : sum / static_cast<double>(n); }
};

// `count` bins of equal length over [t0, t1]; each sample goes into the one its time falls in.
std::vector<Bin> bin_samples(const QueueSeries& q, double t0, double t1, std::size_t count) {
  std::vector<Bin> bins(count);
  const double per_second = static_cast<double>(count) / (t1 - t0);
  for (const FillSample& s : q.samples) {
    const double i = std::clamp(std::floor((s.t - t0) * per_second), 0.0, static_cast<double>(count - 1));
    bins[static_cast<std::size_t>(i)].add(s.fill);
  }
  return bins;
}

// `text` in lines of at most `width` characters, broken at spaces.
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string word, line;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width) lines.push_back(std::exchange(line, ""));
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// "h2d_bytes 1652747624 (1.65 GB)": a byte count gets its size in units people read.
std::string describe_counter(const std::string& name, std::uint64_t value) {
  std::string out = name + " " + std::to_string(value);
  if (!name.ends_with("_bytes") || value < 1000) return out;
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  double v = static_cast<double>(value) / 1000;
  std::size_t unit = 0;
  for (; v >= 1000 && unit + 1 < std::size(kUnits); ++unit) v /= 1000;
  return out + " (" + fixed(v, v < 10 ? 2 : v < 100 ? 1 : 0) + " " + kUnits[unit] + ")";
}

std::string percent_of(double pct) { return fixed(pct, 0) + "%"; }

// The share of the run the consumer waited for input, by its own record.
double waited_share(const ConsumerCounters& c) { return c.t > 0 ? std::clamp(c.waited_s / c.t, 0.0, 1.0) : 0.0; }

// Attributes that outline a text in `colour`, its background, so that lines crossing it stop
// short of the letters.
std::string halo(const std::string& colour) {
  return " stroke=\"" + colour + "\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\"";
}

constexpr const char* kArea = "#deebf7";  // under a lane's mean fill: a full lane reads as a block
constexpr const char* kBand = "#9ecae1";  // a lane's lowest to highest fill
constexpr const char* kMean = "#08519c";  // its mean fill
constexpr const char* kLaneBackground = "#f1f3f5";
constexpr const char* kBusy = "#1b9e77";     // Dark2's green, orange and purple: apart for most
constexpr const char* kStarved = "#d95f02";  // colour-blind readers too
constexpr const char* kBlocked = "#7570b3";
constexpr const char* kBottleneck = "#c0392b";
constexpr const char* kBottleneckRow = "#fdecea";
constexpr const char* kQuiet = "#666666";  // secondary text

// Lines of the verdict over the lanes; `label` is set in bold before the first line of a paragraph.
struct TextLine {
  std::string label, text;
  double size = 12;
  std::string attributes;

  double height() const { return size + (size > 12 ? 6 : 3); }  // from the baseline above to its own
};

// Liberation Sans and Arial share their metrics, in which a line of kWrapChars characters of
// 12 px text fits the picture's width.
constexpr const char* kFonts = "Liberation Sans, Arial, Helvetica, sans-serif";
constexpr std::size_t kWrapChars = 170;

// A lane's columns are 1 to 4 pixels wide: wide enough for about 4 samples where they are
// dense, so that a queue whose fill swings from one sample to the next draws a band from its
// lowest to its highest fill rather than a zigzag. The page's script has the same rule.
int column_width(double samples, int columns) {
  return static_cast<int>(std::clamp(std::ceil(4 * columns / std::max(samples, 1.0)), 1.0, 4.0));
}

class Plot {
 public:
  // Where everything goes, in SVG pixels. The lanes share one time axis; the column on their
  // right holds each stage's shares and each queue's figures, level with its row.
  static constexpr double kWidth = 1120;
  static constexpr double kLeft = 64;   // where the time axis starts; stage names sit left of it
  static constexpr int kColumns = 720;  // the lanes' width in pixels, a multiple of every column width
  static constexpr double kSide = kLeft + kColumns + 32;  // the column on the right
  static constexpr double kSideWidth = kWidth - kSide - 16;
  static constexpr double kStageRow = 30;    // a stage's name, with its bar on the right
  static constexpr double kLaneLabel = 16;   // a queue's name, over its lane
  static constexpr double kLaneHeight = 40;  // fill 0 at the bottom, 1 at the top
  static constexpr double kLaneGap = 4;
  static constexpr double kBlock = kStageRow + kLaneLabel + kLaneHeight + kLaneGap;
  static constexpr double kHeaderTop = 16;
  static constexpr double kEpochRow = 30;  // the epochs' labels over the first row, and the bars' legend

  Plot(const OccupancyLog& log, const Report& report) : log_(log), report_(report) {
    if (report.queues.size() != log.queues.size())
      throw std::invalid_argument(log.source + ": the report to plot with the log is not analyze() of it");
    for (const QueueSeries& q : log.queues)
      for (const FillSample& s : q.samples) t1_ = std::max(t1_, s.t);
    for (const EpochMark& e : log.epochs) t1_ = std::max(t1_, e.t);
    for (const TuningMove& m : log.moves) t1_ = std::max(t1_, m.t);
    if (t1_ <= t0_) t1_ = t0_ + 1;  // a single instant still needs an axis
    for (const QueueSeries& q : log.queues) samples_ = std::max(samples_, q.samples.size());
    column_width_ = column_width(static_cast<double>(samples_), kColumns);

    // The chain of stages as the verdict sees it: each queue's producer, then the training loop.
    for (const QueueSeries& q : log.queues) stages_.push_back(q.producer);
    if (!log.queues.empty()) stages_.push_back(log.queues.back().consumer);

    header_.push_back({"",
                       report.source + ": " + std::to_string(log.queues.size()) +
                           (log.queues.size() == 1 ? " queue" : " queues") + " over " + fixed(report.duration_s, 2) +
                           " s, " + std::to_string(samples_) + " samples per queue" +
                           (log.epochs.empty() ? "" : ", " + apps::plural(log.epochs.size(), "epoch")),
                       14, "font-weight=\"bold\""});
    header_.push_back({"bottleneck: ", report.bottleneck + " (fit " + fixed(report.confidence, 2) + ")", 16,
                       std::string("fill=\"") + kBottleneck + "\""});
    paragraph("evidence: ", report.evidence);
    paragraph("suggestion: ", report.suggestion);
    if (!report.counters.empty()) {
      std::vector<std::string> counters;
      for (const auto& [name, value] : report.counters) counters.push_back(describe_counter(name, value));
      paragraph("counters: ", join(counters, ", "));
    }
    top_ = kHeaderTop + kEpochRow + 8;
    for (const TextLine& line : header_) top_ += line.height();
  }

  std::string svg() const;
  // The finer bins, the epochs and the geometry, for the page's script.
  Json page_data() const;

 private:
  double x(double t) const { return kLeft + kColumns * (t - t0_) / (t1_ - t0_); }
  double stage_top(std::size_t k) const { return top_ + kBlock * static_cast<double>(k); }
  double lane_top(std::size_t i) const { return stage_top(i) + kStageRow + kLaneLabel; }
  double y(std::size_t lane, double fill) const { return lane_top(lane) + kLaneHeight * (1 - fill); }
  double axis_y() const { return stage_top(log_.queues.size()) + kStageRow; }
  double height() const { return axis_y() + 84; }

  void paragraph(const std::string& label, const std::string& text) {
    const std::vector<std::string> lines = wrap(label + text, kWrapChars);
    for (std::size_t i = 0; i < lines.size(); ++i)
      header_.push_back(i == 0 && lines[i].starts_with(label) ? TextLine{label, lines[i].substr(label.size()), 12, ""}
                                                              : TextLine{"", lines[i], 12, ""});
  }

  const StageSummary* counters_of(const std::string& stage) const {
    for (const StageSummary& s : report_.stages)
      if (s.counters.name == stage) return &s;
    return nullptr;
  }

  void write_header(std::ostream& svg) const;
  void write_stage_row(std::ostream& svg, std::size_t k) const;
  void write_lane_plot(std::ostream& svg, std::size_t i) const;
  void write_lane(std::ostream& svg, std::size_t i) const;
  void write_time_axis(std::ostream& svg) const;
  // Vertical marks across the lanes: the epochs' starts, the autotuner's moves.
  struct Mark {
    double t;
    std::string label, title;
  };
  struct MarkGroup {
    std::string cls, stroke, dash;
    double label_y;
    std::vector<Mark> marks;
  };
  std::vector<MarkGroup> marks() const;
  void write_marks(std::ostream& svg) const;

  const OccupancyLog& log_;
  const Report& report_;
  double t0_ = 0, t1_ = 0;   // the time axis: from the start of the pipeline to its last record
  std::size_t samples_ = 0;  // of the queue with the most
  int column_width_ = 1;     // pixels
  std::vector<std::string> stages_;
  std::vector<TextLine> header_;
  double top_ = 0;  // of the first stage row
};

void Plot::write_header(std::ostream& svg) const {
  double y = kHeaderTop;
  for (const TextLine& line : header_) {
    y += line.height();
    svg << "<text x=\"8\" y=\"" << num(y) << "\" font-size=\"" << num(line.size) << "\""
        << (line.attributes.empty() ? "" : " ") << line.attributes << ">";
    if (!line.label.empty()) svg << "<tspan font-weight=\"bold\">" << escape_xml(line.label) << "</tspan>";
    svg << escape_xml(line.text) << "</text>\n";
  }
}

// A stage's name on the left, between the lane it empties and the lane it fills, and its
// shares of the run as one stacked bar on the right.
void Plot::write_stage_row(std::ostream& svg, std::size_t k) const {
  const std::string& name = stages_[k];
  const bool bottleneck = name == report_.bottleneck;
  const bool trainer = k + 1 == stages_.size();
  const StageSummary* s = trainer ? nullptr : counters_of(name);
  const double top = stage_top(k);
  svg << "<g class=\"stage" << (bottleneck ? " bottleneck" : "") << "\" data-stage=\"" << escape_xml(name) << "\">\n";

  std::string role = trainer ? "the training loop" : k == 0 ? "source" : "";
  if (s) {
    const int threads = s->counters.threads;
    role += (role.empty() ? "" : ", ") + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  }
  svg << "<text x=\"8\" y=\"" << num(top + 20) << "\" font-size=\"13\"" << halo(bottleneck ? kBottleneckRow : "#ffffff")
      << "><tspan font-weight=\"bold\"" << (bottleneck ? std::string(" fill=\"") + kBottleneck + "\"" : "") << ">"
      << escape_xml(name) << "</tspan>";
  if (!role.empty()) svg << "<tspan fill=\"" << kQuiet << "\"> \xc2\xb7 " << role << "</tspan>";
  if (bottleneck) svg << "<tspan font-weight=\"bold\" fill=\"" << kBottleneck << "\"> \xc2\xb7 the bottleneck</tspan>";
  svg << "</text>\n";

  if (!s) {
    std::string why = trainer               ? "no counters: the training loop keeps none"
                      : log_.stages.empty() ? "no counters: the log has no stage records"
                                            : "no counters in the log for this stage";
    if (trainer && log_.consumer && log_.consumer->t > 0)  // the pipeline's record of its consumer
      why = "took " + std::to_string(log_.consumer->items) + " items, waiting for them " +
            fixed(100 * waited_share(*log_.consumer), 1) + "% of the run";
    svg << "<text x=\"" << num(kSide) << "\" y=\"" << num(top + 19) << "\" font-size=\"11\" fill=\"" << kQuiet << "\">"
        << why << "</text>\n</g>\n";
    return;
  }
  // Busy is a share of threads x run, starved and blocked shares of the run: with several
  // threads they can add up to more than the run, and are then drawn to scale of their sum.
  const double parts[] = {s->busy_pct, s->starved_pct, s->blocked_pct};
  const char* colours[] = {kBusy, kStarved, kBlocked};
  const char* names[] = {"busy", "starved", "blocked"};
  const double scale = kSideWidth / std::max(100.0, parts[0] + parts[1] + parts[2]);
  svg << "<rect x=\"" << num(kSide) << "\" y=\"" << num(top + 5) << "\" width=\"" << num(kSideWidth)
      << "\" height=\"10\" fill=\"#e5e5e5\"/>\n";
  double at = kSide;
  for (int p = 0; p < 3; ++p) {
    svg << "<rect class=\"" << names[p] << "\" x=\"" << num(at) << "\" y=\"" << num(top + 5) << "\" width=\""
        << fixed(parts[p] * scale, 2) << "\" height=\"10\" fill=\"" << colours[p] << "\"><title>" << names[p] << " "
        << fixed(parts[p], 1) << "%</title></rect>\n";
    at += parts[p] * scale;
  }
  svg << "<text x=\"" << num(kSide) << "\" y=\"" << num(top + 27) << "\" font-size=\"11\">busy " << percent_of(parts[0])
      << " \xc2\xb7 starved " << percent_of(parts[1]) << " \xc2\xb7 blocked " << percent_of(parts[2])
      << "</text>\n</g>\n";
}

// A queue's fill: the band from the lowest to the highest fill in each column, the line
// through the means and the area under it. The page's script redraws them on a zoom.
void Plot::write_lane_plot(std::ostream& svg, std::size_t i) const {
  // Columns without a sample are passed over: their neighbours join.
  std::vector<std::pair<std::string, const Bin*>> points;  // "x," and the column's samples
  const std::vector<Bin> columns = bin_samples(log_.queues[i], t0_, t1_, kColumns / column_width_);
  for (std::size_t c = 0; c < columns.size(); ++c)
    if (columns[c].n > 0)
      points.emplace_back(num(kLeft + (static_cast<double>(c) + 0.5) * column_width_) + ",", &columns[c]);
  std::string area, band, mean;
  for (const auto& [at, b] : points) {
    area += " " + at + num(y(i, b->mean()));
    band += " " + at + num(y(i, b->hi));
    mean += (mean.empty() ? "M" : " ") + at + num(y(i, b->mean()));
  }
  for (auto p = points.rbegin(); p != points.rend(); ++p) band += " " + p->first + num(y(i, p->second->lo));
  if (!points.empty()) {
    area = "M" + points.front().first + num(y(i, 0)) + area + " " + points.back().first + num(y(i, 0)) + "Z";
    band = "M" + band.substr(1) + "Z";
  }
  svg << "<g class=\"lane-plot\" clip-path=\"url(#plot-area)\">\n"
      << "<path class=\"area\" fill=\"" << kArea << "\" d=\"" << area << "\"/>\n"
      << "<path class=\"band\" fill=\"" << kBand << "\" d=\"" << band << "\"/>\n"
      << "<path class=\"mean\" fill=\"none\" stroke=\"" << kMean
      << "\" stroke-width=\"1.25\" stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"" << mean << "\"/>\n</g>\n";
}

// A queue's name over its lane, and its figures over the whole run on the right (the page's
// script puts the fill under the pointer there).
void Plot::write_lane(std::ostream& svg, std::size_t i) const {
  const QueueSeries& q = log_.queues[i];
  const QueueSummary& summary = report_.queues[i];
  const double top = lane_top(i);
  svg << "<g class=\"lane\" data-queue=\"" << escape_xml(q.name) << "\">\n"
      << "<text x=\"" << num(kLeft + 4) << "\" y=\"" << num(top - 4) << "\"" << halo("#ffffff") << ">"
      << escape_xml(q.producer + " -> " + q.consumer + " (" + q.name + ", capacity " + std::to_string(q.capacity) + ")")
      << "</text>\n";
  svg << "<text class=\"readout\" x=\"" << num(kSide) << "\" y=\"" << num(top + 15) << "\">mean fill "
      << fixed(summary.mean_fill, 2) << ", p95 " << fixed(summary.p95_fill, 2) << "</text>\n"
      << "<text class=\"readout\" x=\"" << num(kSide) << "\" y=\"" << num(top + 31) << "\" font-size=\"11\" fill=\""
      << kQuiet << "\">full in " << percent_of(summary.full_pct) << ", empty in " << percent_of(summary.empty_pct)
      << " of the samples</text>\n</g>\n";
}

// The ticks and the grid lines across the lanes; the page's script redraws them on a zoom.
void Plot::write_time_axis(std::ostream& svg) const {
  const double step = nice_step(t1_ - t0_, 6);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::ostringstream grid, ticks;
  for (double k = std::ceil(t0_ / step - 1e-9); k * step <= t1_ + step * 1e-9; ++k) {
    const double t = k * step + 0.0;  // not "-0" for the first tick
    const std::string at = num(x(t));
    grid << "<line x1=\"" << at << "\" y1=\"" << num(stage_top(0)) << "\" x2=\"" << at << "\" y2=\"" << num(axis_y())
         << "\"/>\n";
    ticks << "<line x1=\"" << at << "\" y1=\"" << num(axis_y()) << "\" x2=\"" << at << "\" y2=\"" << num(axis_y() + 5)
          << "\"/>\n<text x=\"" << at << "\" y=\"" << num(axis_y() + 18) << "\" stroke=\"none\">" << fixed(t, decimals)
          << "</text>\n";
  }
  svg << "<g class=\"time-grid\" stroke=\"#d0d4d9\" stroke-width=\"0.75\">\n"
      << grid.str() << "</g>\n<g class=\"time-axis\" stroke=\"black\" text-anchor=\"middle\">\n"
      << ticks.str() << "</g>\n";
}

// Fewer labels than marks when they would crowd: each is at least this far from the last.
constexpr double kMarkLabelGap = 56;

void Plot::write_marks(std::ostream& svg) const {
  for (const MarkGroup& group : marks()) {
    // The lines first, so that none crosses a label.
    std::string labels;
    double last_label = -INFINITY;
    svg << "<g class=\"" << group.cls << "\" clip-path=\"url(#plot-area)\">\n";
    for (const Mark& m : group.marks) {
      const std::string at = num(x(m.t));
      svg << "<line x1=\"" << at << "\" y1=\"" << num(stage_top(0) - 14) << "\" x2=\"" << at << "\" y2=\""
          << num(axis_y()) << "\" stroke=\"" << group.stroke << "\" stroke-dasharray=\"" << group.dash << "\">"
          << (m.title.empty() ? "" : "<title>" + escape_xml(m.title) + "</title>") << "</line>\n";
      if (x(m.t) - last_label < kMarkLabelGap) continue;
      last_label = x(m.t);
      labels += "<text x=\"" + num(x(m.t) + 3) + "\" y=\"" + num(group.label_y) + "\" font-size=\"11\" fill=\"" +
                group.stroke + "\"" + halo("#ffffff") + ">" + escape_xml(m.label) + "</text>\n";
    }
    svg << labels << "</g>\n";
  }
}

std::vector<Plot::MarkGroup> Plot::marks() const {
  MarkGroup epochs{"epochs", "#333333", "4 3", stage_top(0) - 6, {}};
  for (const EpochMark& e : log_.epochs)
    epochs.marks.push_back({e.t, "epoch " + std::to_string(e.epoch + 1), ""});  // the log counts from 0, people from 1
  MarkGroup moves{"moves", "#d95f02", "2 2", axis_y() - 4, {}};
  for (const TuningMove& m : log_.moves) moves.marks.push_back({m.t, "autotune", m.what + " (" + m.evidence + ")"});
  return {epochs, moves};
}

std::string Plot::svg() const {
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"occupancy\" width=\"" << num(kWidth) << "\" height=\""
      << num(height()) << "\" viewBox=\"0 0 " << num(kWidth) << ' ' << num(height()) << "\" font-family=\"" << kFonts
      << "\" font-size=\"12\">\n"
      << "<title>queue fill over time: " << escape_xml(log_.source) << "</title>\n"
      << "<defs><clipPath id=\"plot-area\"><rect x=\"" << num(kLeft) << "\" y=\"0\" width=\"" << kColumns
      << "\" height=\"" << num(height()) << "\"/></clipPath></defs>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  write_header(svg);

  // The bars' legend, over the column on the right.
  const double legend_y = stage_top(0) - 8;
  double at = kSide;
  for (const auto& [name, colour] :
       {std::pair{"busy", kBusy}, {"starved: input empty", kStarved}, {"blocked: output full", kBlocked}}) {
    svg << "<rect x=\"" << num(at) << "\" y=\"" << num(legend_y - 9) << "\" width=\"10\" height=\"10\" fill=\""
        << colour << "\"/><text x=\"" << num(at + 13) << "\" y=\"" << num(legend_y) << "\" font-size=\"11\">" << name
        << "</text>\n";
    at += 13 + 5.6 * static_cast<double>(std::strlen(name)) + 12;
  }

  for (std::size_t i = 0; i < log_.queues.size(); ++i) {
    svg << "<rect x=\"" << num(kLeft) << "\" y=\"" << num(lane_top(i)) << "\" width=\"" << kColumns << "\" height=\""
        << num(kLaneHeight) << "\" fill=\"" << kLaneBackground << "\"/>\n"
        << "<text x=\"" << num(kLeft - 4) << "\" y=\"" << num(lane_top(i) + 8) << "\" font-size=\"10\" fill=\""
        << kQuiet << "\" text-anchor=\"end\">full</text>\n"
        << "<text x=\"" << num(kLeft - 4) << "\" y=\"" << num(lane_top(i) + kLaneHeight)
        << "\" font-size=\"10\" fill=\"" << kQuiet << "\" text-anchor=\"end\">empty</text>\n";
  }
  for (std::size_t k = 0; k < stages_.size(); ++k)
    if (stages_[k] == report_.bottleneck)
      svg << "<rect x=\"4\" y=\"" << num(stage_top(k) + 2) << "\" width=\"" << num(kWidth - 8) << "\" height=\""
          << num(kStageRow - 4) << "\" rx=\"3\" fill=\"" << kBottleneckRow << "\"/>\n";
  write_time_axis(svg);
  for (std::size_t i = 0; i < log_.queues.size(); ++i) write_lane_plot(svg, i);
  write_marks(svg);
  // The names over the lines, each with a halo of its background, top to bottom as the pipeline runs.
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    write_stage_row(svg, k);
    if (k < log_.queues.size()) write_lane(svg, k);
  }

  svg << "<line x1=\"" << num(kLeft) << "\" y1=\"" << num(axis_y()) << "\" x2=\"" << num(kLeft + kColumns) << "\" y2=\""
      << num(axis_y()) << "\" stroke=\"black\"/>\n"
      << "<text x=\"" << num(kLeft + kColumns / 2.0) << "\" y=\"" << num(axis_y() + 34)
      << "\" text-anchor=\"middle\">time (s)</text>\n"
      << "<text x=\"8\" y=\"" << num(axis_y() + 56) << "\" font-size=\"11\" fill=\"" << kQuiet
      << "\">Each lane is a queue's fill (size / capacity): the band spans the lowest to the highest sample in each "
         "column of pixels, the line is their mean.</text>\n"
      << "<text x=\"8\" y=\"" << num(axis_y() + 71) << "\" font-size=\"11\" fill=\"" << kQuiet
      << "\">A stage's bar: busy is its threads at work (of threads x run); starved and blocked are the time none "
         "ran because its input was empty or its output full.</text>\n"
      << "</svg>\n";
  return svg.str();
}

// The page keeps the queues' fill in finer bins than the picture, this many over all queues
// together: enough to zoom into a minute of an hour's run, in a page of about a MiB.
constexpr std::size_t kPageBins = 80'000;

Json Plot::page_data() const {
  const std::size_t per_queue =
      std::max<std::size_t>(kColumns, kPageBins / std::max<std::size_t>(log_.queues.size(), 1));
  const std::size_t count = std::clamp<std::size_t>(samples_, 1, per_queue);

  Json lanes = Json::array();
  for (std::size_t i = 0; i < log_.queues.size(); ++i) {
    // Fills in thousandths: finer than a pixel of any lane, and a third of the text of a fraction.
    std::vector<int> lo, mean, hi;
    std::vector<std::size_t> n;
    for (const Bin& b : bin_samples(log_.queues[i], t0_, t1_, count)) {
      lo.push_back(static_cast<int>(std::lround(1000 * b.lo)));
      mean.push_back(static_cast<int>(std::lround(1000 * b.mean())));
      hi.push_back(static_cast<int>(std::lround(1000 * b.hi)));
      n.push_back(b.n);
    }
    lanes.push_back({{"top", lane_top(i)}, {"lo", lo}, {"mean", mean}, {"hi", hi}, {"n", n}});
  }
  Json marks = Json::array();
  for (const MarkGroup& g : this->marks()) {
    Json items = Json::array();
    for (const Mark& m : g.marks) items.push_back({m.t, m.label, m.title});
    marks.push_back(
        {{"cls", g.cls}, {"stroke", g.stroke}, {"dash", g.dash}, {"labelY", g.label_y}, {"marks", std::move(items)}});
  }
  return {{"t0", t0_},
          {"t1", t1_},
          {"bins", count},
          {"left", kLeft},
          {"columns", kColumns},
          {"laneHeight", kLaneHeight},
          {"top", stage_top(0)},
          {"bottom", axis_y()},
          {"markLabelGap", kMarkLabelGap},
          {"lanes", std::move(lanes)},
          {"marks", std::move(marks)}};
}

// JSON to put inside a script element. '<', '>' and '&' appear in JSON only inside strings,
// where their \u escapes mean the same; without them the text cannot end the element or its
// CDATA section.
std::string script_json(const Json& j) {
  std::string out;
  for (char c : j.dump(-1, ' ', false, Json::error_handler_t::replace)) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string plot_svg(const OccupancyLog& log, const Report& report) { return Plot(log, report).svg(); }

std::string plot_html(const OccupancyLog& log, const Report& report) {
  const Plot plot(log, report);
  return std::string(kPageHead) + escape_xml("stoker-inspect: " + log.source) + kPageStyle + plot.svg() + kPageErrors +
         "const data = " + script_json(plot.page_data()) + ";\n" + kPageScript;
}

// ---------------------------------------------------------------------------------------
// Several ranks of one job.

namespace {

// The share of its run a rank's training loop waited for input: from its consumer record, or,
// in a log without one, the share of samples with the last queue empty.
double input_wait(const OccupancyLog& log, const Report& report) {
  if (log.consumer && log.consumer->t > 0) return waited_share(*log.consumer);
  return report.queues.empty() ? 0 : report.queues.back().empty_pct / 100;
}

std::string pct(double share) { return fixed(100 * share, 1) + "%"; }

}  // namespace

JobReport analyze_job(const std::vector<OccupancyLog>& logs) {
  JobReport job;
  for (const OccupancyLog& log : logs) {
    Report r = analyze(log);
    const double wait = input_wait(log, r);
    job.ranks.push_back({log.rank.empty() ? log.source : "rank " + log.rank, wait, std::move(r)});
  }
  if (job.ranks.size() < 2) return job;
  std::vector<double> waits;
  for (const auto& r : job.ranks) waits.push_back(r.wait);
  std::vector<double> sorted = waits;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2 - (sorted.size() % 2 == 0 ? 1 : 0)];
  const auto worst = static_cast<std::size_t>(std::max_element(waits.begin(), waits.end()) - waits.begin());
  double others_min = 1, others_max = 0;
  for (std::size_t i = 0; i < waits.size(); ++i) {
    if (i == worst) continue;
    others_min = std::min(others_min, waits[i]);
    others_max = std::max(others_max, waits[i]);
  }
  const auto& slow = job.ranks[worst];
  if (slow.wait >= 0.05 && slow.wait >= 2 * median) {
    job.straggler = slow.name;
    job.evidence = slow.name + "'s training loop waited for its input " + pct(slow.wait) + " of its run, the other " +
                   std::to_string(waits.size() - 1) + " ranks' " + pct(others_min) + " to " + pct(others_max) +
                   ": every step waits for it. Its own pipeline: " + slow.report.bottleneck + " (" +
                   slow.report.evidence + ")";
    job.suggestion = "speed up " + slow.name + "'s input: " + slow.report.suggestion +
                     "; if its settings are the others', look for what else takes its host's cores";
  } else {
    job.evidence = "no rank stands out: the training loops waited for input " + pct(sorted.front()) + " to " +
                   pct(sorted.back()) + " of their runs";
    job.suggestion = "read each rank's verdict above";
  }
  return job;
}

void print_job(std::ostream& out, const JobReport& job) {
  for (const auto& r : job.ranks) {
    out << "==== " << r.name << "\n";
    print_report(out, r.report);
    out << "\n";
  }
  std::vector<std::vector<std::string>> rows{{"rank", "bottleneck", "input wait %", "last queue's mean fill"}};
  for (const auto& r : job.ranks)
    rows.push_back({r.name, r.report.bottleneck, fixed(100 * r.wait, 1),
                    r.report.queues.empty() ? "-" : fixed(r.report.queues.back().mean_fill, 2)});
  out << "==== the job: " << job.ranks.size() << " ranks\n";
  print_table(out, rows, 2);
  out << "straggler:  " << (job.straggler.empty() ? "none" : job.straggler) << "\n"
      << "evidence:   " << job.evidence << "\n"
      << "suggestion: " << job.suggestion << "\n";
}

Json to_json(const JobReport& job) {
  Json ranks = Json::array();
  for (const auto& r : job.ranks)
    ranks.push_back({{"rank", r.name}, {"input_wait_pct", 100 * r.wait}, {"report", to_json(r.report)}});
  return {{"ranks", std::move(ranks)},
          {"straggler", job.straggler},
          {"evidence", job.evidence},
          {"suggestion", job.suggestion}};
}

std::string plot_job_svg(const std::vector<OccupancyLog>& logs, const JobReport& job) {
  if (logs.size() != job.ranks.size()) throw std::invalid_argument("plot_job_svg: a report of other logs");
  constexpr double kHeader = 58, kGap = 24, kFrame = 6;
  std::string body;
  double x = kGap, height = 0;
  for (std::size_t i = 0; i < logs.size(); ++i) {
    std::string plot = plot_svg(logs[i], job.ranks[i].report);
    // Each plot's clip path gets a name of its own: ids are the document's, not the plot's.
    const std::string id = "plot-area-" + std::to_string(i);
    for (std::size_t at = 0; (at = plot.find("plot-area", at)) != std::string::npos; at += id.size())
      plot.replace(at, 9, id);
    const auto read = [&](const char* attribute) {  // of the plot's own <svg> tag
      const std::string key = std::string(" ") + attribute + "=\"";
      const std::size_t at = plot.find(key) + key.size();
      return std::stod(plot.substr(at, plot.find('"', at) - at));
    };
    const double w = read("width"), h = read("height");
    plot.insert(plot.find("<svg ") + 5, "x=\"" + num(x) + "\" y=\"" + num(kHeader) + "\" ");
    if (job.ranks[i].name == job.straggler)
      body += "<rect x=\"" + num(x - kFrame) + "\" y=\"" + num(kHeader - kFrame) + "\" width=\"" + num(w + 2 * kFrame) +
              "\" height=\"" + num(h + 2 * kFrame) + "\" fill=\"none\" stroke=\"#c62828\" stroke-width=\"4\"/>\n";
    body += "<text x=\"" + num(x) + "\" y=\"" + num(kHeader - 12) + "\" font-size=\"15\" font-weight=\"bold\">" +
            escape_xml(job.ranks[i].name + ": waited for input " + pct(job.ranks[i].wait) + ", bottleneck " +
                       job.ranks[i].report.bottleneck) +
            "</text>\n" + plot;
    x += w + kGap;
    height = std::max(height, h);
  }
  const std::string verdict = job.straggler.empty() ? "no rank stands out" : "straggler: " + job.straggler;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"job\" width=\"" << num(x) << "\" height=\""
      << num(kHeader + height + kGap) << "\" font-family=\"" << kFonts << "\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << num(kGap) << "\" y=\"24\" font-size=\"18\" font-weight=\"bold\">"
      << escape_xml("the job: " + std::to_string(logs.size()) + " ranks; " + verdict) << "</text>\n"
      << body << "</svg>\n";
  return svg.str();
}

std::string plot_job_html(const std::vector<OccupancyLog>& logs, const JobReport& job) {
  return std::string(kPageHead) + "stoker-inspect: " + escape_xml(std::to_string(logs.size()) + " ranks") +
         "</title></head>\n<body style=\"margin:0; overflow-x:auto\">\n" + plot_job_svg(logs, job) +
         "</body>\n</html>\n";
}

}  // namespace stoker::inspect
