// SPDX-License-Identifier: Apache-2.0
// How stoker's libraries write to stoker's log (stoker/core/log.h): log::warn("stage '{}': ...",
// name), formatted as spdlog formats, and only when the level is on. Private to the libraries'
// sources (the stoker_logging target); a host never sees spdlog through stoker.
#pragma once

#include <spdlog/logger.h>

#include <utility>

namespace stoker::log {

/// stoker's logger, named "stoker": its level and sink are what set_log_level and
/// set_log_handler set. Never registered with spdlog, so a host's spdlog setup leaves it be.
spdlog::logger& logger();

template <class... Args>
void trace(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().trace(format, std::forward<Args>(args)...);
}
template <class... Args>
void debug(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().debug(format, std::forward<Args>(args)...);
}
template <class... Args>
void info(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().info(format, std::forward<Args>(args)...);
}
template <class... Args>
void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().warn(format, std::forward<Args>(args)...);
}
template <class... Args>
void error(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().error(format, std::forward<Args>(args)...);
}
template <class... Args>
void critical(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().critical(format, std::forward<Args>(args)...);
}

}  // namespace stoker::log
