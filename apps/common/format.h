// SPDX-License-Identifier: Apache-2.0
// Small text helpers that stoker's programs share. Private to apps/ (and their tests); no
// dependency beyond the standard library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace stoker::apps {

/// CLI11 puts its hint on a second line; the contract is one line on stderr.
inline std::string one_line(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  return message;
}

/// `value` with `decimals` digits after the point, as printf's %.*f writes it.
inline std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

/// `n` and its noun: "1 epoch", "2 epochs".
inline std::string plural(std::uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace stoker::apps
