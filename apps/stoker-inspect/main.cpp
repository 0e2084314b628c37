// SPDX-License-Identifier: Apache-2.0
// stoker-inspect LOG [options]: reads a pipeline's occupancy log, sums up each queue and
// stage, names the stage that limits the pipeline with the evidence, and plots the queues.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>

#include "app_main.h"
#include "inspect.h"

namespace stoker::inspect {
namespace {

using apps::one_line;
using apps::UsageError;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_html(const std::string& path) { return ends_with(path, ".html") || ends_with(path, ".htm"); }

void write_plot(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw UsageError("--plot " + path + ": cannot open for writing: " + std::strerror(errno));
  out << text;
  out.close();
  if (!out) throw UsageError("--plot " + path + ": write failed");
}

int run(int argc, char** argv) {
  CLI::App app{
      "stoker-inspect: reads a pipeline's occupancy log (written with .occupancy_log(path)), prints each\n"
      "queue's fill and each stage's counters, and names the bottleneck stage with its evidence.\n"
      "See " +
      apps::doc_page("inspect.md") + " for how to read the report."};
  app.name("stoker-inspect");

  std::vector<std::string> log_paths;
  std::string plot_path;
  bool json = false, skip_bad_lines = false;
  app.add_option("LOG", log_paths,
                 "The occupancy log: JSON Lines of sample and stage records. Several: the logs of the ranks of one "
                 "job (run.rank*.jsonl), read together to name the rank that holds the others back; logs of "
                 "different runs are refused")
      ->required();
  app.add_flag("--json", json,
               "Also print the report as one JSON object on the last line of stdout (queues, stages, the "
               "training loop's figures, verdict, bottleneck, fit, evidence, suggestion)");
  app.add_option("--plot", plot_path,
                 "Draw the run into FILE: a lane per queue with its fill over time, each stage's busy, starved "
                 "and blocked shares, the epochs and the verdict; an SVG image for FILE.svg, or for FILE.html the "
                 "same in a page that zooms into a time range and reads each queue's fill under the pointer")
      ->type_name("FILE");
  app.add_flag("--skip-bad-lines", skip_bad_lines,
               "Skip malformed lines (counting them in a warning) instead of stopping at the first; "
               "useful for the torn last line of a run that crashed");

  if (const auto done = apps::parse_command_line(app, argc, argv)) return *done;

  try {
    // Checked before reading a log that may be large, so that a typo costs nothing.
    if (!plot_path.empty() && !ends_with(plot_path, ".svg") && !ends_with(plot_path, ".html") &&
        !ends_with(plot_path, ".htm"))
      throw UsageError("--plot " + plot_path + ": the file name must end in .svg or .html");
    if (!plot_path.empty()) apps::prepare_output_file("--plot", plot_path);  // as stoker-train's files

    std::vector<OccupancyLog> logs;
    for (const auto& path : log_paths) {
      logs.push_back(read_log(path, {.skip_bad_lines = skip_bad_lines}));
      const OccupancyLog& log = logs.back();
      if (log.skipped_lines > 0)
        std::cerr << "stoker-inspect: warning: " << path << ": skipped " << log.skipped_lines << " malformed line"
                  << (log.skipped_lines == 1 ? "" : "s") << " (first: " << log.first_skipped << ")\n";
    }
    if (logs.size() > 1) {
      const JobReport job = analyze_job(logs);
      if (!plot_path.empty())  // first, so that a failure prints no report
        write_plot(plot_path, is_html(plot_path) ? plot_job_html(logs, job) : plot_job_svg(logs, job));
      print_job(std::cout, job);
      if (!plot_path.empty()) std::cout << "plot:       " << plot_path << "\n";
      if (json) std::cout << to_json(job).dump() << std::endl;
      return 0;
    }
    const OccupancyLog& log = logs.front();
    const Report report = analyze(log);
    if (!plot_path.empty())  // first, so that a failure prints no report
      write_plot(plot_path, is_html(plot_path) ? plot_html(log, report) : plot_svg(log, report));
    print_report(std::cout, report);
    if (!plot_path.empty()) std::cout << "plot:       " << plot_path << "\n";
    if (json) std::cout << to_json(report).dump() << std::endl;
    return 0;
  } catch (const LogError& e) {
    std::cerr << "stoker-inspect: " << one_line(e.what()) << '\n';
    return 2;
  }
}

}  // namespace
}  // namespace stoker::inspect

int main(int argc, char** argv) {
  return stoker::apps::guarded_main("stoker-inspect", stoker::inspect::run, argc, argv);
}
