// SPDX-License-Identifier: Apache-2.0
#include "run_context.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>  // program_invocation_short_name
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

namespace stoker::detail {

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// The job as the launcher names it, the same in every process it started.
std::optional<std::string> launcher_job() {
  if (const char* slurm = env("SLURM_JOB_ID")) {
    const char* step = env("SLURM_STEP_ID");
    return std::string("slurm:") + slurm + (step ? std::string(".") + step : "");
  }
  if (const char* pmix = env("PMIX_NAMESPACE"))
    return std::string("pmix:") + pmix;  // Open MPI's mpirun, srun --mpi=pmix
  if (const char* torch = env("TORCHELASTIC_RUN_ID")) return std::string("torchrun:") + torch;
  return std::nullopt;
}

std::optional<std::string> launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* rank = env(name)) return rank;
  if (env("TORCHELASTIC_RUN_ID"))
    if (const char* rank = env("RANK")) return rank;
  return std::nullopt;
}

}  // namespace

nlohmann::json run_identity(const std::map<std::string, std::string>& labels) {
  const std::string host = host_name();
  const auto pid = static_cast<long>(getpid());
  nlohmann::json out = {{"program", program_invocation_short_name}, {"host", host}, {"pid", pid}};
  if (const auto job = labels.find("job"); job != labels.end()) {
    out["job"] = job->second;
  } else if (auto launched = launcher_job()) {
    out["job"] = *launched;
  } else {  // a process of its own: its host, its pid and when it ran
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    out["job"] = host + ":" + std::to_string(pid) + ":" + std::to_string(ns);
  }
  if (labels.find("rank") == labels.end())
    if (auto rank = launcher_rank()) out["rank"] = *rank;
  for (const auto& [key, value] : labels) out[key] = value;
  return out;
}

std::optional<bool> thread_runnable(int tid) noexcept {
  try {
    // "tid (comm) S ...": the state follows the last ')', the name may hold any character.
    std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return std::nullopt;
    const auto close = line.rfind(')');
    if (close == std::string::npos || close + 2 >= line.size()) return std::nullopt;
    return line[close + 2] == 'R';
  } catch (...) {
    return std::nullopt;
  }
}

CpuTimes CpuTimes::now() noexcept {
  CpuTimes t;
  timespec ts{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0)
    t.process_s = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  try {
    // "cpu  user nice system idle iowait irq softirq steal ...", in clock ticks.
    std::ifstream stat("/proc/stat");
    std::string line;
    const long ticks = sysconf(_SC_CLK_TCK);
    if (ticks > 0 && std::getline(stat, line) && line.rfind("cpu ", 0) == 0) {
      std::istringstream fields(line.substr(4));
      unsigned long long v[8] = {};
      int n = 0;
      while (n < 8 && fields >> v[n]) ++n;
      if (n >= 5) {
        const unsigned long long idle = v[3] + v[4];
        unsigned long long all = 0;
        for (int i = 0; i < n; ++i) all += v[i];
        t.machine_busy_s = static_cast<double>(all - idle) / static_cast<double>(ticks);
        t.machine_all_s = static_cast<double>(all) / static_cast<double>(ticks);
      }
    }
  } catch (...) {  // no /proc: the figures are left out
  }
  return t;
}

void add_cpu_fields(nlohmann::json& record, const CpuTimes& start, const CpuTimes& end) {
  if (start.process_s && end.process_s) record["process_cpu_s"] = std::max(0.0, *end.process_s - *start.process_s);
  if (start.machine_all_s && end.machine_all_s && *end.machine_all_s > *start.machine_all_s) {
    const double busy = *end.machine_busy_s - *start.machine_busy_s;
    record["machine_busy_pct"] = std::clamp(100 * busy / (*end.machine_all_s - *start.machine_all_s), 0.0, 100.0);
  }
}

}  // namespace stoker::detail
