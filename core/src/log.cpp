// SPDX-License-Identifier: Apache-2.0
#include "stoker/core/log.h"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "stoker_log.h"

namespace stoker {

namespace {

// The logger's one sink: the host's handler, or stderr as spdlog's default logger writes it.
// base_sink holds its mutex around sink_it_, which serializes the handler's calls and lets
// set() wait for the call under way.
class HandlerSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  void set(LogHandler handler) {
    std::lock_guard lock(mutex_);
    handler_ = std::move(handler);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    if (!handler_) {
      stderr_.log(message);
      return;
    }
    try {
      handler_(static_cast<LogLevel>(message.level), std::string_view(message.payload.data(), message.payload.size()));
    } catch (...) {  // the handler's to report; a stage that logs goes on
    }
  }
  void flush_() override { stderr_.flush(); }

 private:
  LogHandler handler_;
  spdlog::sinks::stderr_color_sink_st stderr_;  // single-threaded: only ever called under mutex_
};

struct Log {
  std::shared_ptr<HandlerSink> sink = std::make_shared<HandlerSink>();
  spdlog::logger logger{"stoker", sink};

  Log() {
    logger.set_level(spdlog::level::info);
    if (const char* env = std::getenv("STOKER_LOG_LEVEL"); env != nullptr && *env != '\0') {
      if (const auto level = parse_log_level(env))
        logger.set_level(static_cast<spdlog::level::level_enum>(*level));
      else
        logger.warn(
            "STOKER_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, critical, off): logging at info",
            env);
    }
  }
};

// Made on first use and never destroyed, so that a static object's destructor may still log
// at exit.
Log& the_log() {
  static Log* const log = new Log;
  return *log;
}

}  // namespace

namespace log {
spdlog::logger& logger() { return the_log().logger; }
}  // namespace log

void set_log_handler(LogHandler handler) { the_log().sink->set(std::move(handler)); }

void set_log_level(LogLevel level) { the_log().logger.set_level(static_cast<spdlog::level::level_enum>(level)); }

LogLevel log_level() { return static_cast<LogLevel>(the_log().logger.level()); }

std::optional<LogLevel> parse_log_level(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  struct Name {
    std::string_view text;
    LogLevel level;
  };
  static constexpr Name kNames[] = {
      {"trace", LogLevel::trace}, {"debug", LogLevel::debug},       {"info", LogLevel::info},
      {"warn", LogLevel::warn},   {"warning", LogLevel::warn},      {"error", LogLevel::error},
      {"err", LogLevel::error},   {"critical", LogLevel::critical}, {"off", LogLevel::off},
  };
  for (const auto& [text, level] : kNames)
    if (text == lower) return level;
  return std::nullopt;
}

}  // namespace stoker
