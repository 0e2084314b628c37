// SPDX-License-Identifier: Apache-2.0
// stoker's log: what its libraries report that is not the error of a call (an item a stage
// skipped, the first few; the autotuner's moves; a failure of device work met in a destructor;
// an occupancy log that could not be finished). It goes to stderr unless the host routes it
// into its own logging with set_log_handler; set_log_level filters it.
//
// The interface is plain C++: a host needs no spdlog to compile against it. A host that logs
// with spdlog passes the messages on as they come, the levels being spdlog's:
//
//   stoker::set_log_handler([logger = spdlog::default_logger()](stoker::LogLevel level, std::string_view text) {
//     logger->log(static_cast<spdlog::level::level_enum>(level), text);
//   });
#pragma once

#include <functional>
#include <optional>
#include <string_view>

namespace stoker {

/// From the most to the least verbose, numbered as spdlog's levels (spdlog::level::level_enum).
enum class LogLevel { trace, debug, info, warn, error, critical, off };

/// Receives each message at or above log_level(): its level and its text, one line without a
/// newline, valid during the call. Called on the thread that logs (a stage's, the pipeline's
/// monitor, a destructor's), one call at a time: stoker serializes them, so the handler needs no
/// lock of its own. It must not throw (what it throws is dropped) nor call back into stoker.
using LogHandler = std::function<void(LogLevel level, std::string_view text)>;

/// Sends stoker's messages to `handler` from now on; an empty handler sends them to stderr
/// again (the default: "[time] [stoker] [level] text"). Thread-safe. Returns once no call to
/// the handler it replaces is under way, so that the host may then destroy what that one uses.
void set_log_handler(LogHandler handler);

/// Messages below `level` are dropped before they are formatted. Thread-safe. The default is
/// the environment's STOKER_LOG_LEVEL when it names a level (parse_log_level), else info.
void set_log_level(LogLevel level);
LogLevel log_level();

/// The level `name` names: trace, debug, info, warn (or warning), error (or err), critical or
/// off, in any case; nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view name);

}  // namespace stoker
