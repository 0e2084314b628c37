// SPDX-License-Identifier: Apache-2.0
// stoker's log in a host's hands: a handler of the host's receives what a failing stage logs,
// the level filters it, and the handler can be replaced safely while stages log.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/pipeline_support.h"
#include "stoker/core/log.h"

namespace {

using namespace stoker;
using stoker::test::CountUpTo;
using stoker::test::drain_epoch;

// A sink the test owns: every message with its level.
struct Captured {
  std::mutex mutex;
  std::vector<std::pair<LogLevel, std::string>> messages;

  LogHandler handler() {
    return [this](LogLevel level, std::string_view text) {
      std::lock_guard lock(mutex);
      messages.emplace_back(level, std::string(text));
    };
  }
  std::size_t size() {
    std::lock_guard lock(mutex);
    return messages.size();
  }
};

// Restores the default handler and level whatever a test case did.
struct DefaultLogAfter {
  LogLevel level = log_level();
  ~DefaultLogAfter() {
    set_log_handler({});
    set_log_level(level);
  }
};

// A pipeline whose "parse" stage fails on every odd item and skips it: 5 of 10 skipped.
Pipeline<int> skipping_pipeline() {
  return PipelineBuilder{}
      .threads(2)
      .epochs(1)
      .source("read", CountUpTo{10})
      .map("parse",
           [](int x) {
             if (x % 2 == 1) throw std::runtime_error("item " + std::to_string(x) + " is odd");
             return x;
           },
           {.threads = 2, .on_error = OnError::skip})
      .build();
}

}  // namespace

TEST_CASE("a failing stage's log goes to the host's handler, at its level, and not to stderr" * doctest::timeout(60)) {
  DefaultLogAfter restore;
  Captured captured;
  set_log_handler(captured.handler());
  set_log_level(LogLevel::info);
  {
    auto pipe = skipping_pipeline();
    CHECK(drain_epoch(pipe).size() == 5);
  }
  set_log_handler({});  // returns once no call is under way: `captured` is complete
  REQUIRE(captured.messages.size() == 5);
  for (const auto& [level, text] : captured.messages) {
    CAPTURE(text);
    CHECK(level == LogLevel::warn);
    CHECK(text.find("stage 'parse': skipped item") != std::string::npos);
    CHECK(text.find(" is odd") != std::string::npos);
    CHECK(text.find('\n') == std::string::npos);
  }
}

TEST_CASE("messages below the level reach no handler" * doctest::timeout(60)) {
  DefaultLogAfter restore;
  Captured captured;
  set_log_handler(captured.handler());
  set_log_level(LogLevel::error);
  CHECK(log_level() == LogLevel::error);
  {
    auto pipe = skipping_pipeline();
    CHECK(drain_epoch(pipe).size() == 5);
  }
  CHECK(captured.size() == 0);
}

TEST_CASE("replacing the handler waits for the call under way to the one it replaces" * doctest::timeout(60)) {
  DefaultLogAfter restore;
  set_log_level(LogLevel::info);
  std::promise<void> entered, release;
  auto released = release.get_future().share();
  std::atomic<int> calls{0};
  set_log_handler([&, released](LogLevel, std::string_view) {
    if (calls.fetch_add(1) == 0) {
      entered.set_value();
      released.wait();
    }
  });
  auto run = std::async(std::launch::async, [] {
    auto pipe = skipping_pipeline();
    return drain_epoch(pipe).size();
  });
  entered.get_future().wait();  // a stage is inside the handler
  auto replace = std::async(std::launch::async, [] { set_log_handler({}); });
  CHECK(replace.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
  release.set_value();
  replace.get();
  CHECK(run.get() == 5);
  // Once set_log_handler returned, the old handler is called no more.
  const int after = calls.load();
  Captured next;
  set_log_handler(next.handler());
  auto again = skipping_pipeline();
  drain_epoch(again);
  CHECK(calls.load() == after);
  CHECK(next.size() == 5);
}

TEST_CASE("log levels by name, as STOKER_LOG_LEVEL and SPDLOG_LEVEL give them") {
  CHECK(parse_log_level("trace") == LogLevel::trace);
  CHECK(parse_log_level("DEBUG") == LogLevel::debug);
  CHECK(parse_log_level("info") == LogLevel::info);
  CHECK(parse_log_level("warn") == LogLevel::warn);
  CHECK(parse_log_level("warning") == LogLevel::warn);
  CHECK(parse_log_level("err") == LogLevel::error);
  CHECK(parse_log_level("error") == LogLevel::error);
  CHECK(parse_log_level("critical") == LogLevel::critical);
  CHECK(parse_log_level("off") == LogLevel::off);
  CHECK_FALSE(parse_log_level("verbose"));
  CHECK_FALSE(parse_log_level(""));
}
