// SPDX-License-Identifier: Apache-2.0
// stoker-inspect's parts, for the program and the tests: the log's records (log.h), the verdict
// on them (verdict.h), the report for people and as JSON (report.h), the picture (plot.h), and
// the ranks of a job read together (job.h).
#pragma once

#include "job.h"
#include "log.h"
#include "plot.h"
#include "report.h"
#include "verdict.h"
