// SPDX-License-Identifier: Apache-2.0
#include <cstdio>
#include <iterator>
#include <ostream>
#include <string>

#include "stoker/core/stage_stats.h"

namespace stoker {

namespace {
double pct(std::chrono::nanoseconds part, std::chrono::nanoseconds whole) {
  return whole.count() > 0 ? 100.0 * static_cast<double>(part.count()) / static_cast<double>(whole.count()) : 0.0;
}
}  // namespace

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* kUnits[] = {"kB", "MB", "GB", "TB", "PB", "EB"};
  if (bytes < 1000) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1000;
  std::size_t unit = 0;
  while (value >= 999.5 && unit + 1 < std::size(kUnits)) {  // "1000 kB" is "1.00 MB"
    value /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.*f %s", value < 99.95 ? (value < 9.995 ? 2 : 1) : 0, value, kUnits[unit]);
  return text;
}

void print_summary(std::ostream& out, const PipelineSummary& s) {
  char line[256];
  const double wall = std::chrono::duration<double>(s.wall).count();
  std::snprintf(line, sizeof line, "%-20s %7s %12s %12s %8s %8s %9s %9s\n", "stage", "threads", "items in", "items out",
                "skipped", "busy %", "starved %", "blocked %");
  out << line;
  for (const auto& st : s.stages) {
    // Busy is summed over threads: divide by them so 100% means every thread busy.
    std::snprintf(line, sizeof line, "%-20s %7d %12llu %12llu %8llu %8.1f %9.1f %9.1f\n", st.name.c_str(), st.threads,
                  static_cast<unsigned long long>(st.items_in), static_cast<unsigned long long>(st.items_out),
                  static_cast<unsigned long long>(st.skipped), pct(st.busy, s.wall) / st.threads,
                  pct(st.starved, s.wall), pct(st.blocked, s.wall));
    out << line;
  }
  std::snprintf(line, sizeof line, "%-28s %8s %8s %8s\n", "queue", "capacity", "empty %", "full %");
  out << line;
  for (const auto& q : s.queues) {
    std::snprintf(line, sizeof line, "%-28s %8zu %8.1f %8.1f\n", q.name.c_str(), q.capacity,
                  pct(q.time_empty, q.lifetime), pct(q.time_full, q.lifetime));
    out << line;
  }
  for (const auto& c : s.counters) {
    std::snprintf(line, sizeof line, "%-28s %12llu", c.name.c_str(), static_cast<unsigned long long>(c.value));
    out << line;
    if (c.name.ends_with("_bytes")) out << " (" << format_bytes(c.value) << ")";
    out << '\n';
  }
  std::snprintf(line, sizeof line, "consumer: %llu items in %.3f s, waited %.1f%% of the time; stages on %d threads\n",
                static_cast<unsigned long long>(s.consumed), wall, pct(s.consumer_wait, s.wall), s.threads);
  out << line;
}

}  // namespace stoker
