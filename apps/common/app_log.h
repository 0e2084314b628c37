// SPDX-License-Identifier: Apache-2.0
// The log level of the programs that run stoker's libraries, from the environment. Private to
// apps/.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "app_main.h"
#include "stoker/core/log.h"

namespace stoker::apps {

/// Sets stoker's log level (stoker::set_log_level) from STOKER_LOG_LEVEL or, without it, from
/// SPDLOG_LEVEL as spdlog reads it: comma-separated, a bare level for every logger and
/// `stoker=LEVEL` for stoker's ("warn", "stoker=debug,off"); other loggers' entries are theirs.
/// Throws UsageError naming the variable when what concerns stoker names no level.
inline void log_level_from_environment() {
  const auto level_of = [](const std::string& variable, std::string_view text) {
    if (const auto level = parse_log_level(text)) return *level;
    throw UsageError(variable + ": '" + std::string(text) +
                     "' is not a log level (trace, debug, info, warn, error, critical, off)");
  };
  if (const char* value = std::getenv("STOKER_LOG_LEVEL"); value != nullptr && *value != '\0') {
    set_log_level(level_of("STOKER_LOG_LEVEL", value));
    return;
  }
  const char* value = std::getenv("SPDLOG_LEVEL");
  if (value == nullptr) return;
  std::optional<LogLevel> every, ours;
  std::string_view rest(value);
  while (!rest.empty()) {
    const std::string_view entry = rest.substr(0, rest.find(','));
    rest.remove_prefix(std::min(rest.size(), entry.size() + 1));
    const auto equals = entry.find('=');
    if (equals == std::string_view::npos)
      every = level_of("SPDLOG_LEVEL", entry);
    else if (entry.substr(0, equals) == "stoker")
      ours = level_of("SPDLOG_LEVEL", entry.substr(equals + 1));
  }
  if (ours || every) set_log_level(ours ? *ours : *every);
}

}  // namespace stoker::apps
