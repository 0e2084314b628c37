// SPDX-License-Identifier: Apache-2.0
// The run as one picture: the verdict on top, a lane per queue with its fill over time and a
// strip under it for the time its producer waited for room, each stage's busy, starved and
// blocked shares between the lanes, the epochs and the autotuner's moves.
#pragma once

#include <string>

#include "log.h"
#include "verdict.h"

namespace stoker::inspect {

/// The run as one picture, a standalone SVG document: the verdict on top, then one lane per
/// queue in pipeline order, source at the top, with each stage's row between the queue that
/// feeds it and the queue it fills (its busy, starved and blocked shares as a bar), the
/// epochs and the autotuner's moves across the lanes, and the counters. `report` is `analyze(log)`
/// (std::invalid_argument for a report with other queues).
std::string plot_svg(const OccupancyLog& log, const Report& report);
/// The same picture in a self-contained HTML page that can zoom into a time range and shows
/// each queue's fill under the pointer. It carries each queue's fill at a finer resolution
/// than the picture, but never more than a few MiB of it, however long the run.
std::string plot_html(const OccupancyLog& log, const Report& report);

/// Text for an SVG or HTML document: the five XML specials escaped, other control characters
/// (which XML cannot carry) replaced.
std::string escape_xml(const std::string& s);
/// A coordinate for an attribute: one decimal, none when it is whole.
std::string num(double v);
/// The fonts the pictures are set in.
inline constexpr const char* kFonts = "Liberation Sans, Arial, Helvetica, sans-serif";

}  // namespace stoker::inspect
