#include "inspect.h"

#include "format.h"

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
    if (*type == "sample") return sample(j);
    if (*type == "stage") return stage(j);
    if (*type == "counters") return counters(j);
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

std::string suggestion(const Verdict& v, std::size_t k, const std::vector<QueueSummary>& queues) {
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
  r.suggestion = suggestion(verdict, k, r.queues);
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
  return {{"file", r.source},
          {"duration_s", rounded(r.duration_s, 4)},
          {"queues", std::move(queues)},
          {"stages", std::move(stages)},
          {"counters", std::move(counters)},
          {"bottleneck", r.bottleneck},
          {"confidence", rounded(r.confidence, 3)},
          {"evidence", r.evidence},
          {"suggestion", r.suggestion}};
}

// ---------------------------------------------------------------------------------------
// Plot

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

// 1, 2 or 5 times a power of ten, giving about `ticks` ticks over `range`.
double nice_step(double range, int ticks) {
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10 * power;
}

// Tableau's ten colours: distinguishable, and readable for most colour-blind people.
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Frame {
  double left = 64, top = 24, width = 720, height = 300;
  double t_max = 1;
  double x(double t) const { return left + width * t / t_max; }
  double y(double fill) const { return top + height * (1.0 - fill); }
};

std::string point(double x, double y) { return fixed(x, 1) + "," + fixed(y, 1) + " "; }

// An hour at 50 ms is 72,000 samples per queue for 720 pixels. Keeping each pixel column's
// lowest and highest point, in the order they came, keeps every swing between empty and
// full visible at a fraction of the size.
std::string polyline_points(const QueueSeries& q, const Frame& f) {
  std::string out;
  std::size_t column_start = 0;
  while (column_start < q.samples.size()) {
    const long column = std::lround(std::floor(f.x(q.samples[column_start].t)));
    std::size_t end = column_start, lo = column_start, hi = column_start;
    for (; end < q.samples.size() && std::lround(std::floor(f.x(q.samples[end].t))) == column; ++end) {
      if (q.samples[end].fill < q.samples[lo].fill) lo = end;
      if (q.samples[end].fill > q.samples[hi].fill) hi = end;
    }
    for (std::size_t i : {std::min(lo, hi), std::max(lo, hi)}) {
      out += point(f.x(q.samples[i].t), f.y(q.samples[i].fill));
      if (lo == hi) break;
    }
    column_start = end;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace

std::string plot_svg(const OccupancyLog& log) {
  Frame f;
  f.t_max = 0;
  for (const QueueSeries& q : log.queues)
    for (const FillSample& s : q.samples) f.t_max = std::max(f.t_max, s.t);
  if (f.t_max <= 0) f.t_max = 1;  // a single instant still needs an axis
  const double legend_top = f.top + f.height + 48;
  const double total_width = f.left + f.width + 24;
  const double total_height = legend_top + 20.0 * static_cast<double>(log.queues.size()) + 8;

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << total_width << "\" height=\"" << total_height
      << "\" viewBox=\"0 0 " << total_width << ' ' << total_height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<title>queue fill over time: " << escape_xml(log.source) << "</title>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";

  svg << "<g stroke=\"#dddddd\">\n";
  for (double fill = 0; fill <= 1.0001; fill += 0.25)
    svg << "<line x1=\"" << f.left << "\" y1=\"" << f.y(fill) << "\" x2=\"" << f.left + f.width << "\" y2=\""
        << f.y(fill) << "\"/>\n";
  svg << "</g>\n<g text-anchor=\"end\">\n";
  for (double fill = 0; fill <= 1.0001; fill += 0.25)
    svg << "<text x=\"" << f.left - 6 << "\" y=\"" << f.y(fill) + 4 << "\">" << fixed(fill, 2) << "</text>\n";
  svg << "</g>\n<g text-anchor=\"middle\">\n";
  const double step = nice_step(f.t_max, 6);
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step)));
  for (double t = 0; t <= f.t_max * 1.0001; t += step) {
    svg << "<line x1=\"" << f.x(t) << "\" y1=\"" << f.top + f.height << "\" x2=\"" << f.x(t) << "\" y2=\""
        << f.top + f.height + 5 << "\" stroke=\"black\"/>\n"
        << "<text x=\"" << f.x(t) << "\" y=\"" << f.top + f.height + 18 << "\">" << fixed(t, decimals) << "</text>\n";
  }
  svg << "<text x=\"" << f.left + f.width / 2 << "\" y=\"" << f.top + f.height + 36 << "\">time (s)</text>\n"
      << "<text transform=\"translate(16 " << f.top + f.height / 2
      << ") rotate(-90)\">fill (size / capacity)</text>\n</g>\n"
      << "<polyline fill=\"none\" stroke=\"black\" points=\"" << point(f.left, f.top) << point(f.left, f.top + f.height)
      << point(f.left + f.width, f.top + f.height) << "\"/>\n";

  for (std::size_t i = 0; i < log.queues.size(); ++i) {
    const QueueSeries& q = log.queues[i];
    const char* colour = kColours[i % std::size(kColours)];
    const std::string label =
        q.producer + " -> " + q.consumer + " (" + q.name + ", capacity " + std::to_string(q.capacity) + ")";
    svg << "<polyline class=\"queue\" fill=\"none\" stroke=\"" << colour
        << "\" stroke-width=\"1.5\" stroke-opacity=\"0.8\" points=\"" << polyline_points(q, f) << "\"><title>"
        << escape_xml(label) << "</title></polyline>\n";
    const double y = legend_top + 20.0 * static_cast<double>(i);
    svg << "<line x1=\"" << f.left << "\" y1=\"" << y << "\" x2=\"" << f.left + 24 << "\" y2=\"" << y << "\" stroke=\""
        << colour << "\" stroke-width=\"3\"/>\n"
        << "<text x=\"" << f.left + 32 << "\" y=\"" << y + 4 << "\">" << escape_xml(label) << "</text>\n";
  }
  svg << "</svg>\n";
  return svg.str();
}

std::string plot_html(const OccupancyLog& log) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"/><title>stoker-inspect: " +
         escape_xml(log.source) + "</title></head>\n<body>\n" + plot_svg(log) + "</body>\n</html>\n";
}

}  // namespace stoker::inspect
