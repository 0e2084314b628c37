// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace stoker {

/// An exception thrown by a stage's function, rethrown to the consumer with the stage's
/// name. The original exception is kept: `std::rethrow_exception(e.original())`.
class StageError : public std::runtime_error {
 public:
  StageError(std::string stage, const std::string& message, std::exception_ptr original)
      : std::runtime_error("stage '" + stage + "' failed: " + message),
        stage_(std::move(stage)),
        original_(std::move(original)) {}
  const std::string& stage() const noexcept { return stage_; }
  std::exception_ptr original() const noexcept { return original_; }

 private:
  std::string stage_;
  std::exception_ptr original_;
};

}  // namespace stoker
