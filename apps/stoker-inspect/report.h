// SPDX-License-Identifier: Apache-2.0
// A run's report for people (tables and the verdict) and as one JSON object.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>

#include "verdict.h"

namespace stoker::inspect {

/// The tables and the verdict, for people.
void print_report(std::ostream& out, const Report& report);

/// The report as one JSON object: file, program, job, rank, duration_s, queues, stages,
/// counters, consumer, pipeline, verdict, bottleneck, fit, evidence (a list), suggestion,
/// fits, autotune.
nlohmann::json to_json(const Report& report);

}  // namespace stoker::inspect
