// SPDX-License-Identifier: Apache-2.0
#include "job.h"

#include <algorithm>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "plot.h"
#include "plot_page.h"
#include "report.h"
#include "text.h"

namespace stoker::inspect {

using Json = nlohmann::json;

namespace {

std::string pct(double fraction) { return fixed(100 * fraction, 1) + "%"; }

// A rank that waited in the gradient exchange this much less of its run than the median other
// rank is the one they wait for: every rank's step is as long as the slowest's, so the gap is
// the time the others spent waiting for it. Less is noise (or no one rank).
constexpr double kExchangeGap = 0.1;
// A rank whose training loop waited for its input this share of its run, and twice the median
// rank's, is held back by its input.
constexpr double kInputStandsOut = 0.05;

// "the other rank 3.0%", "the other 2 ranks 3.0% to 5.0%".
std::string the_others(double lo, double hi, std::size_t n) {
  return n == 1 ? "the other rank " + pct(lo)
                : "the other " + std::to_string(n) + " ranks " + pct(lo) + " to " + pct(hi);
}

// The logs must be the ranks of one job: each with a rank of its own, all of one job.
void check_one_job(const std::vector<OccupancyLog>& logs) {
  const std::string read_alone = ": read each log on its own, or give the logs of one job's ranks (run.rank*.jsonl)";
  for (std::size_t i = 0; i < logs.size(); ++i) {
    const OccupancyLog& a = logs[i];
    if (a.rank.empty()) throw LogError(a.source + ": the log has no rank, so it is no rank of a job" + read_alone);
    for (std::size_t j = 0; j < i; ++j) {
      const OccupancyLog& b = logs[j];
      if (a.job != b.job)
        throw LogError(b.source + " and " + a.source + " are logs of different runs (job " +
                       (b.job.empty() ? "unknown" : b.job) + " and job " + (a.job.empty() ? "unknown" : a.job) + ")" +
                       read_alone);
      if (a.rank == b.rank)
        throw LogError(b.source + " and " + a.source + " are both the log of rank " + a.rank + read_alone);
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// What the straggler's own log says about its input: its verdict, first evidence and suggestion.
std::string own_verdict(const JobReport::Rank& r) {
  const Verdict& v = r.report.verdict;
  return v.headline + " (" + (v.evidence.size() > 1 ? v.evidence[1] : v.evidence.front()) + ")";
}

// Data-parallel with every rank's exchange wait: the rank the others wait for waits least. False
// when no rank stands out that way.
bool exchange_straggler(JobReport& job) {
  std::vector<double> waits;
  for (const auto& r : job.ranks) {
    if (!r.exchange) return false;
    waits.push_back(*r.exchange);
  }
  const auto least = static_cast<std::size_t>(std::min_element(waits.begin(), waits.end()) - waits.begin());
  std::vector<double> others, other_inputs;
  for (std::size_t i = 0; i < waits.size(); ++i)
    if (i != least) {
      others.push_back(waits[i]);
      other_inputs.push_back(job.ranks[i].wait);
    }
  if (median(others) - waits[least] < kExchangeGap) return false;
  const auto& slow = job.ranks[least];
  const auto [lo, hi] = std::minmax_element(others.begin(), others.end());
  job.straggler = slow.name;
  job.evidence.push_back(slow.name + " waited for the others in the gradient exchange " + pct(waits[least]) +
                         " of its run, " + the_others(*lo, *hi, others.size()) + ": at every step they wait for it");
  const double input = slow.wait, others_input = median(other_inputs);
  if (input >= kInputStandsOut && input >= 2 * others_input) {
    job.evidence.push_back(slow.name + "'s training loop waited for its input " + pct(input) +
                           " of its run, the others' " + pct(others_input) +
                           " (median): its input is slow; its own pipeline: " + own_verdict(slow));
    job.suggestion = "speed up " + slow.name + "'s input: " + slow.report.verdict.suggestion +
                     "; if its settings are the others', look for what else takes its host's cores";
  } else {
    job.evidence.push_back(slow.name + "'s training loop waited for its input only " + pct(input) +
                           " of its run: its input keeps up, its training step itself is slower than the others'");
    job.suggestion = "find what slows " + slow.name +
                     "'s training step: other processes on its host, a slower or shared device, the cores mpirun "
                     "binds it to (docs/scale-out.md), or more work in its step than in the others'";
  }
  return true;
}

// Data-parallel without the exchange counted: only the slowest rank's training loop waits for
// its input; the others wait for it in the exchange, their queues full.
void input_straggler(JobReport& job) {
  std::vector<double> waits;
  for (const auto& r : job.ranks) waits.push_back(r.wait);
  const auto worst = static_cast<std::size_t>(std::max_element(waits.begin(), waits.end()) - waits.begin());
  std::vector<double> others;
  for (std::size_t i = 0; i < waits.size(); ++i)
    if (i != worst) others.push_back(waits[i]);
  const auto& slow = job.ranks[worst];
  const auto [lo, hi] = std::minmax_element(others.begin(), others.end());
  if (slow.wait >= kInputStandsOut && slow.wait >= 2 * median(waits)) {
    job.straggler = slow.name;
    job.evidence.push_back(slow.name + "'s training loop waited for its input " + pct(slow.wait) + " of its run, " +
                           the_others(*lo, *hi, others.size()) + ": every step waits for it");
    job.evidence.push_back("its own pipeline: " + own_verdict(slow));
    job.suggestion = "speed up " + slow.name + "'s input: " + slow.report.verdict.suggestion +
                     "; if its settings are the others', look for what else takes its host's cores";
  } else {
    const auto [min, max] = std::minmax_element(waits.begin(), waits.end());
    job.evidence.push_back("no rank stands out: the training loops waited for input " + pct(*min) + " to " + pct(*max) +
                           " of their runs");
    job.suggestion = "read each rank's verdict above";
  }
}

// Remote workers: the trainer takes what each worker sends as it comes, so a slow worker sends
// less (and makes the trainer wait only when the others cannot make up for it).
void worker_straggler(JobReport& job) {
  std::vector<std::size_t> workers;
  const JobReport::Rank* trainer = nullptr;
  for (std::size_t i = 0; i < job.ranks.size(); ++i)
    if (job.ranks[i].role == "worker")
      workers.push_back(i);
    else
      trainer = &job.ranks[i];
  auto rate = [&](std::size_t i) {
    const auto& r = job.ranks[i];
    return r.report.consumer.run_s > 0 ? static_cast<double>(r.items) / r.report.consumer.run_s : 0.0;
  };
  if (trainer)
    job.evidence.push_back("the trainer, " + trainer->name + ", waited for batches " + pct(trainer->wait) +
                           " of its run" + (trainer->wait < 0.2 ? ": the workers together keep up with it" : ""));
  if (workers.size() < 2) {
    job.suggestion = "read each rank's verdict above";
    return;
  }
  const auto slowest = *std::min_element(workers.begin(), workers.end(),
                                         [&](std::size_t a, std::size_t b) { return rate(a) < rate(b); });
  std::vector<double> others;
  for (std::size_t i : workers)
    if (i != slowest) others.push_back(rate(i));
  const double typical = median(others);
  const auto [lo, hi] = std::minmax_element(others.begin(), others.end());
  const auto& slow = job.ranks[slowest];
  if (typical <= 0 || rate(slowest) > 0.6 * typical) {
    job.evidence.push_back("no worker stands out: they sent " + fixed(*lo, 1) + " to " + fixed(*hi, 1) +
                           " batches per second");
    job.suggestion = "read each rank's verdict above";
    return;
  }
  job.straggler = slow.name;
  job.evidence.push_back(slow.name + " sent " + fixed(rate(slowest), 1) + " batches per second (" +
                         std::to_string(slow.items) + " in all), the other workers " + fixed(*lo, 1) + " to " +
                         fixed(*hi, 1) + ": its own pipeline: " + own_verdict(slow));
  job.suggestion = "speed up " + slow.name + "'s pipeline: " + slow.report.verdict.suggestion +
                   "; if its settings are the others', look for what else takes its host's cores";
}

}  // namespace

JobReport analyze_job(const std::vector<OccupancyLog>& logs) {
  check_one_job(logs);
  JobReport job;
  for (const OccupancyLog& log : logs) {
    Report r = analyze(log);
    JobReport::Rank rank{"rank " + log.rank, log.role,         r.consumer.waited_pct / 100,
                         std::nullopt,       r.consumer.items, std::move(r)};
    if (rank.report.consumer.exchange_wait_pct) rank.exchange = *rank.report.consumer.exchange_wait_pct / 100;
    job.remote = job.remote || log.role == "worker";
    job.ranks.push_back(std::move(rank));
  }
  if (job.ranks.size() < 2) return job;
  if (job.remote)
    worker_straggler(job);
  else if (!exchange_straggler(job))
    input_straggler(job);  // also where the exchange's waits show none, as a rank's input may
  return job;
}

void print_job(std::ostream& out, const JobReport& job) {
  for (const auto& r : job.ranks) {
    out << "==== " << r.name << (r.role.empty() ? "" : " (" + r.role + ")") << "\n";
    print_report(out, r.report);
    out << "\n";
  }
  std::vector<std::vector<std::string>> rows{
      {"rank", "role", "bottleneck", "input wait %", "exchange wait %", "items", "last queue's mean fill"}};
  for (const auto& r : job.ranks)
    rows.push_back({r.name, r.role.empty() ? "-" : r.role, r.report.verdict.part, fixed(100 * r.wait, 1),
                    r.exchange ? fixed(100 * *r.exchange, 1) : "-", std::to_string(r.items),
                    r.report.queues.empty() ? "-" : fixed(r.report.queues.back().mean_fill, 2)});
  out << "==== the job: " << job.ranks.size() << " ranks, "
      << (job.remote ? "a trainer with remote workers" : "data-parallel") << "\n";
  print_table(out, rows, 3);
  out << "straggler:  " << (job.straggler.empty() ? "none" : job.straggler) << "\n";
  for (std::size_t i = 0; i < job.evidence.size(); ++i)
    out << (i == 0 ? "evidence:   " : "            ") << job.evidence[i] << '\n';
  out << "suggestion: " << job.suggestion << "\n";
}

Json to_json(const JobReport& job) {
  Json ranks = Json::array();
  for (const auto& r : job.ranks)
    ranks.push_back({{"rank", r.name},
                     {"role", r.role},
                     {"input_wait_pct", rounded(100 * r.wait, 2)},
                     {"exchange_wait_pct", r.exchange ? Json(rounded(100 * *r.exchange, 2)) : Json()},
                     {"items", r.items},
                     {"report", to_json(r.report)}});
  return {{"mode", job.remote ? "remote workers" : "data-parallel"},
          {"ranks", std::move(ranks)},
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
            escape_xml(job.ranks[i].name + ": waited for input " + pct(job.ranks[i].wait) +
                       ", bottleneck: " + job.ranks[i].report.verdict.headline) +
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
