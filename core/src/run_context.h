// SPDX-License-Identifier: Apache-2.0
// What an occupancy log records about the run around the pipeline: which program wrote it, the
// job and rank it belongs to, and how much CPU the machine and the process spent. Internal.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace stoker::detail {

/// The fields of the log's `run` record that say whose log it is: `program` (the executable's
/// name), `job` and `rank`, `host` and `pid`. `job` is the label of that name when the pipeline
/// has one, otherwise the launcher's (Slurm's job and step, PMIx's namespace as Open MPI's
/// mpirun sets it, torchrun's run id), otherwise one of this process alone; `rank` the label, or
/// the launcher's, or absent. Two logs belong to one job exactly when their `job`s are equal.
nlohmann::json run_identity(const std::map<std::string, std::string>& labels);

/// Whether thread `tid` of this process is runnable (running, or waiting for a core) rather than
/// asleep, from /proc/self/task/TID/stat; empty where the system does not say.
std::optional<bool> thread_runnable(int tid) noexcept;

/// CPU time spent so far: by this process (all its threads), and by the whole machine, every
/// process together (busy and all time, summed over its CPUs, from /proc/stat). Empty where the
/// system does not say.
struct CpuTimes {
  std::optional<double> process_s;
  std::optional<double> machine_busy_s, machine_all_s;

  static CpuTimes now() noexcept;
};

/// The CPU spent from `start` to `end`, as fields of the log's `pipeline` record:
/// `process_cpu_s`, and `machine_busy_pct` (the share of the machine's CPU time that any
/// process used). Absent where either reading lacks them.
void add_cpu_fields(nlohmann::json& record, const CpuTimes& start, const CpuTimes& end);

}  // namespace stoker::detail
