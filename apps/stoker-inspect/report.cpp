// SPDX-License-Identifier: Apache-2.0
#include "report.h"

#include <ostream>

#include "text.h"

namespace stoker::inspect {

using Json = nlohmann::json;

void print_report(std::ostream& out, const Report& r) {
  const std::size_t samples = r.queues.empty() ? 0 : r.queues.front().samples;
  out << r.source << ": " << r.queues.size() << (r.queues.size() == 1 ? " queue" : " queues") << " over "
      << fixed(r.duration_s, 2) << " s, " << samples << (samples == 1 ? " sample" : " samples") << " per queue";
  if (!r.program.empty()) out << "; written by " << r.program << (r.rank.empty() ? "" : ", rank " + r.rank);
  out << "\n\n";

  std::vector<std::vector<std::string>> queues{{"queue", "producer -> consumer", "capacity", "mean fill", "p95 fill",
                                                "empty %", "full %", "waiting %", "swings"}};
  for (const QueueSummary& q : r.queues)
    queues.push_back({q.name, q.producer + " -> " + q.consumer,
                      std::to_string(q.capacity) + (q.floor ? " (" + std::to_string(q.floor) + " kept)" : ""),
                      fixed(q.mean_fill, 2), fixed(q.p95_fill, 2), fixed(q.empty_pct, 1), fixed(q.full_pct, 1),
                      fixed(q.waiting_pct, 1), std::to_string(q.swings)});
  print_table(out, queues, 2);
  out << "(fill: what the consumer could take, of the most it could; waiting %: samples with the producer "
         "holding items it had no room for)\n";

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
  const ConsumerSummary& c = r.consumer;
  out << "\ntraining loop: ";
  if (c.recorded)
    out << "took " << c.items << " items in " << fixed(c.run_s, 2) << " s, waiting for them " << fixed(c.waited_pct, 1)
        << "% of the run";
  else
    out << "no consumer record; the last queue was empty in " << fixed(c.waited_pct, 1) << "% of samples";
  if (c.exchange_wait_pct)
    out << ", for other ranks in the gradient exchange " << fixed(*c.exchange_wait_pct, 1) << "%";
  out << '\n';
  const PipelineFigures& p = r.pipeline;
  if (p.threads > 0) {
    out << "pipeline: " << p.threads << (p.threads == 1 ? " thread" : " threads");
    if (p.cores > 0) out << " on a machine of " << p.cores << (p.cores == 1 ? " core" : " cores");
    if (p.cpu_s) out << "; its threads used " << fixed(*p.cpu_s, 2) << " s of CPU";
    if (p.machine_busy_pct) out << "; the machine's CPU was busy " << fixed(*p.machine_busy_pct, 0) << "%";
    out << '\n';
  }
  if (!r.counters.empty()) {
    std::string line;
    for (const auto& [name, value] : r.counters)
      line += (line.empty() ? "" : ", ") + name + " " + std::to_string(value);
    out << "counters: " << line << '\n';
  }

  if (!r.moves.empty()) {
    out << "\nautotune: " << r.moves.size() << (r.moves.size() == 1 ? " move\n" : " moves\n");
    for (const TuningMove& m : r.moves)
      out << "  at " << fixed(m.t, 2) << " s: " << m.what << " (" << m.evidence << ")\n";
  }

  const Verdict& v = r.verdict;
  out << "\nbottleneck: " << v.headline << " (fit " << fixed(v.fit, 2) << ")\n";
  for (std::size_t i = 0; i < v.evidence.size(); ++i)
    out << (i == 0 ? "evidence:   " : "            ") << v.evidence[i] << '\n';
  out << "suggestion: " << v.suggestion << "\n";
}

Json to_json(const Report& r) {
  Json queues = Json::array();
  for (const QueueSummary& q : r.queues)
    queues.push_back({{"name", q.name},
                      {"producer", q.producer},
                      {"consumer", q.consumer},
                      {"capacity", q.capacity},
                      {"floor", q.floor},
                      {"samples", q.samples},
                      {"mean_fill", rounded(q.mean_fill, 4)},
                      {"p95_fill", rounded(q.p95_fill, 4)},
                      {"empty_pct", rounded(q.empty_pct, 2)},
                      {"full_pct", rounded(q.full_pct, 2)},
                      {"waiting_pct", rounded(q.waiting_pct, 2)},
                      {"swings", q.swings},
                      {"refill_s", rounded(q.refill_s, 4)},
                      {"refills", q.refills}});
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
                      {"pool_wait_s", c.pool_wait_s},
                      {"busy_pct", rounded(s.busy_pct, 2)},
                      {"starved_pct", rounded(s.starved_pct, 2)},
                      {"blocked_pct", rounded(s.blocked_pct, 2)},
                      {"pool_wait_pct", rounded(s.pool_wait_pct, 2)}});
  }
  const ConsumerSummary& c = r.consumer;
  Json consumer{{"recorded", c.recorded},
                {"items", c.items},
                {"run_s", rounded(c.run_s, 4)},
                {"waited_s", rounded(c.waited_s, 4)},
                {"waited_pct", rounded(c.waited_pct, 2)},
                {"exchange_wait_pct", c.exchange_wait_pct ? Json(rounded(*c.exchange_wait_pct, 2)) : Json()}};
  const PipelineFigures& p = r.pipeline;
  auto optional = [](const std::optional<double>& x) { return x ? Json(rounded(*x, 4)) : Json(); };
  Json pipeline{{"threads", p.threads},
                {"cores", p.cores},
                {"cpu_s", optional(p.cpu_s)},
                {"runnable_s", optional(p.runnable_s)},
                {"process_cpu_s", optional(p.process_cpu_s)},
                {"machine_busy_pct", optional(p.machine_busy_pct)}};
  Json fits = Json::object();
  for (const auto& [name, fit] : r.verdict.fits) fits[name] = rounded(fit, 3);
  Json moves = Json::array();
  for (const TuningMove& m : r.moves) moves.push_back({{"t", m.t}, {"what", m.what}, {"evidence", m.evidence}});
  const Verdict& v = r.verdict;
  return {{"file", r.source},
          {"program", r.program},
          {"job", r.job},
          {"rank", r.rank},
          {"duration_s", rounded(r.duration_s, 4)},
          {"queues", std::move(queues)},
          {"stages", std::move(stages)},
          {"counters", std::move(counters)},
          {"consumer", std::move(consumer)},
          {"pipeline", std::move(pipeline)},
          {"verdict", name(v.kind)},
          {"bottleneck", v.part},
          {"headline", v.headline},
          {"fit", rounded(v.fit, 3)},
          {"evidence", v.evidence},
          {"suggestion", v.suggestion},
          {"fits", std::move(fits)},
          {"autotune", moves}};
}

}  // namespace stoker::inspect
