// SPDX-License-Identifier: Apache-2.0
// stoker-bench SUITE [options]: micro- and macro-benchmarks of stoker against the baselines
// it has to beat, each measured in the same run so that machine noise hits all of them.
#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>

#include "app_log.h"
#include "app_main.h"
#include "bench_suite.h"

namespace stoker::bench {

SuiteRun setup_augment(CLI::App& command);   // bench_augment.cpp
SuiteRun setup_transfer(CLI::App& command);  // bench_transfer.cpp
SuiteRun setup_resume(CLI::App& command);    // bench_resume.cpp
SuiteRun setup_remote(CLI::App& command);    // bench_remote.cpp
SuiteRun setup_decode(CLI::App& command);    // bench_decode.cpp
SuiteRun setup_resize(CLI::App& command);    // bench_resize.cpp
SuiteRun setup_images(CLI::App& command);    // bench_images.cpp
SuiteRun setup_gpu_resize(CLI::App& command);  // bench_gpu_resize.cpp

namespace {

// Adding a suite (pipeline, augment, transfer, ...) is one row here and one setup function.
constexpr Suite kSuites[] = {
    {"shuffle", "RandomShuffleQueue's cost per item: drawing from all it holds vs from its oldest window",
     &setup_shuffle},
    {"pipeline", "efficiency against the slowest stage; framework cost per item vs tbb::parallel_pipeline",
     &setup_pipeline},
    {"augment", "the reference job (Fashion-MNIST crops) in crops/s: stoker pipeline vs a plain loop on all cores",
     &setup_augment},
    {"autotune", "the autotuner from a bad thread split against the best hand-chosen one; its cost when well set",
     &setup_autotune},
    {"resume",
     "exact resume of the reference job mid-epoch: time to the first batch vs fresh and fast-forward; state()'s cost",
     &setup_resume},
    {"remote", "under mpirun: items/s through a remote edge vs one process; bytes/s vs a plain MPI_Send/MPI_Recv loop",
     &setup_remote},
    {"transfer", "host-to-device GB/s pinned vs pageable; copy + crop overlap; crop kernel vs device-to-device copy",
     &setup_transfer},
    {"decode", "JPEG images/s for a crop: whole decode + cut vs window decode vs DCT scaling, one thread",
     &setup_decode},
    {"resize", "RandomResizedCrop's cost per crop on one core, by option, against a plain crop of the same output",
     &setup_resize},
    {"images",
     "the image job (JPEGs -> RandomResizedCrop 224, mirror, normalize, batches of 256) in images/s on N threads: "
     "stoker pipeline vs a tight loop (and torchvision's DataLoader)",
     &setup_images},
    {"gpu_resize",
     "GpuResizedCrop on batches of decoded images: kernel vs a device-to-device copy of the same bytes, vs the CPU's "
     "RandomResizedCrop on all cores",
     &setup_gpu_resize},
};

// One field of /proc/cpuinfo or /proc/meminfo, without the key; empty when absent.
std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto begin = line.find_first_not_of(" \t", colon + 1);
    return begin == std::string::npos ? std::string{} : line.substr(begin);
  }
  return {};
}

// Enough to tell two machines apart in docs/benchmarks.md, and nothing that names the host.
Json describe_machine() {
  Json machine;
  machine["cores"] = std::thread::hardware_concurrency();
  const std::string cpu = proc_field("/proc/cpuinfo", "model name");
  machine["cpu"] = cpu.empty() ? "unknown" : cpu;
  const std::string mem_kb = proc_field("/proc/meminfo", "MemTotal");
  if (!mem_kb.empty()) machine["memory_gib"] = std::stod(mem_kb) / (1024.0 * 1024.0);
#ifdef __VERSION__
  machine["compiler"] = __VERSION__;
#endif
#ifdef NDEBUG
  machine["optimized_build"] = true;
#else
  machine["optimized_build"] = false;
#endif
  return machine;
}

// How busy the rest of the machine was while a suite ran: figures taken next to a compiler
// or a test suite on 2 cores are not the machine's figures, and the JSON should say so.
class BackgroundLoad {
 public:
  BackgroundLoad() : start_(sample()) {}
  Json measure() const {
    const Sample end = sample();
    const double wall = std::chrono::duration<double>(end.wall - start_.wall).count();
    const double capacity = wall * std::max(1u, std::thread::hardware_concurrency());
    Json load;
    if (capacity <= 0 || !end.valid || !start_.valid) return load;
    const double others = (end.busy_s - start_.busy_s) - (end.own_s - start_.own_s);
    load["other_processes_cpu_pct"] = std::max(0.0, 100.0 * others / capacity);
    load["steal_pct"] = 100.0 * (end.steal_s - start_.steal_s) / capacity;
    return load;
  }

 private:
  struct Sample {
    std::chrono::steady_clock::time_point wall;
    double busy_s = 0, steal_s = 0, own_s = 0;
    bool valid = false;
  };
  static Sample sample() {
    Sample s;
    s.wall = std::chrono::steady_clock::now();
    auto seconds = [](timeval t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
    // The suite's child processes (a baseline in another language) are its own load too.
    for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
      rusage u{};
      getrusage(who, &u);
      s.own_s += seconds(u.ru_utime) + seconds(u.ru_stime);
    }
    // cpu  user nice system idle iowait irq softirq steal ...
    std::ifstream stat("/proc/stat");
    std::string cpu;
    double user, nice, system, idle, iowait, irq, softirq, steal;
    if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal)) return s;
    const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
    s.busy_s = (user + nice + system + irq + softirq) / tick;
    s.steal_s = steal / tick;
    s.valid = true;
    return s;
  }
  Sample start_;
};

void add_common_options(CLI::App& command, CommonOptions& common) {
  command.add_flag("--json", common.json, "Print the result as one JSON object on the last line of stdout");
  command.add_option("--repeats", common.repeats, "Repeats; every figure is their median")
      ->check(apps::in_range(1, 1000))
      ->capture_default_str();
}

using apps::one_line;

int run(int argc, char** argv) {
  CLI::App app{"stoker-bench: benchmarks of stoker against baselines measured in the same run"};
  app.name("stoker-bench");
  app.require_subcommand(1);

  CommonOptions common;
  std::optional<Suite> chosen;
  SuiteRun chosen_run;
  for (const Suite& suite : kSuites) {
    CLI::App* command = app.add_subcommand(suite.name, suite.summary);
    add_common_options(*command, common);
    SuiteRun run = suite.setup(*command);
    command->callback([&chosen, &chosen_run, &suite, run] {
      chosen = suite;
      chosen_run = run;
    });
  }

  // CLI11 would call an unknown suite "a missing subcommand"; name it instead.
  if (argc > 1 && argv[1][0] != '-' && std::none_of(std::begin(kSuites), std::end(kSuites), [&](const Suite& s) {
        return std::string(argv[1]) == s.name;
      })) {
    std::string known;
    for (const Suite& s : kSuites) known += (known.empty() ? "" : ", ") + std::string(s.name);
    std::cerr << "stoker-bench: unknown suite '" << argv[1] << "' (suites: " << known << ")\n";
    return 2;
  }

  if (const auto done = apps::parse_command_line(app, argc, argv)) return *done;
  apps::log_level_from_environment();

  Json out;
  out["suite"] = chosen->name;
  out["machine"] = describe_machine();
  const BackgroundLoad load;
  Json figures = chosen_run(common);
  out["background_load"] = load.measure();
  if (const Json& background = out["background_load"]; background.contains("other_processes_cpu_pct")) {
    const double pct = background["other_processes_cpu_pct"].get<double>();
    std::cout << "\nother processes used " << static_cast<int>(pct) << "% of the machine's CPU time during this run"
              << (pct > 10 ? ": a busy machine, so compare the ratios, not the absolute figures" : "") << "\n";
  }
  for (auto& field : figures.items()) out[field.key()] = std::move(field.value());
  if (common.json) std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace stoker::bench

int main(int argc, char** argv) { return stoker::apps::guarded_main("stoker-bench", stoker::bench::run, argc, argv); }
