// SPDX-License-Identifier: Apache-2.0
// Checks of numeric options that every stoker program uses, so that a bad value gets the same
// short message naming the option everywhere. Private to apps/.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

namespace stoker::apps {

namespace detail {

template <class T>
std::string show(T value) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
    return text;
  }
}

// CLI11's own Range and PositiveNumber print their bounds with %f (a bound of DBL_MAX is 300
// digits), say "not in range" for text that is no number at all, and CLI11 converts "-5" to
// an unsigned option as 2^64 - 5. This parses the text itself, so that it can tell those apart.
template <class T>
std::string check(const std::string& text, T lo, T hi, bool lo_open) {
  const std::string got = ", got " + (text.empty() ? std::string("nothing") : text);
  const bool no_upper = hi == std::numeric_limits<T>::max();
  const std::string wanted = no_upper  ? (lo_open ? "must be > " + show(lo)
                                                  : (lo == T{0} ? "must be 0 or more" : "must be at least " + show(lo)))
                             : lo_open ? "must be > " + show(lo) + " and at most " + show(hi)
                                       : "must be " + show(lo) + " to " + show(hi);
  if constexpr (std::is_integral_v<T>) {
    const char* begin = text.data();
    const char* end = begin + text.size();
    if (std::is_unsigned_v<T> && begin != end && *begin == '-') {
      long long negative = 0;  // a whole number below 0 is out of range, not "not a number"
      const auto [p, ec] = std::from_chars(begin, end, negative);
      if (p == end && ec != std::errc::invalid_argument) return wanted + got;
    }
    T value{};
    const bool negative = begin != end && *begin == '-';
    const auto [p, ec] = std::from_chars(begin + (begin != end && *begin == '+'), end, value);
    if (ec == std::errc::result_out_of_range && p == end)
      return (negative ? wanted : "must be at most " + show(hi)) + got;
    if (ec != std::errc{} || p != end || begin == end) return "must be a whole number" + got;
    if (value < lo || value > hi || (lo_open && value == lo)) return wanted + got;
  } else {
    char* parsed_end = nullptr;
    const double value = std::strtod(text.c_str(), &parsed_end);
    if (text.empty() || parsed_end != text.c_str() + text.size() || !std::isfinite(value))
      return "must be a number" + got;
    if (value < static_cast<double>(lo) || value > static_cast<double>(hi) ||
        (lo_open && value == static_cast<double>(lo)))
      return wanted + got;
  }
  return {};
}

template <class T>
std::string describe(T lo, T hi, bool lo_open) {
  if (std::is_unsigned_v<T> && lo == T{0} && !lo_open && hi == std::numeric_limits<T>::max())
    return "";  // UINT says it
  if (hi == std::numeric_limits<T>::max()) return (lo_open ? "> " : ">= ") + show(lo);
  return (lo_open ? "(" : "[") + show(lo) + ", " + show(hi) + "]";
}

template <class T>
CLI::Validator make(T lo, T hi, bool lo_open) {
  static_assert(std::is_arithmetic_v<T>);
  return CLI::Validator([lo, hi, lo_open](std::string& text) { return check<T>(text, lo, hi, lo_open); },
                        describe(lo, hi, lo_open));
}

}  // namespace detail

/// `option->check(apps::in_range(1u, 100u))`: a number of the option's type from lo to hi.
/// CLI11 puts the option's name before the message: "--epochs: must be 1 to 100, got 0".
template <class T>
CLI::Validator in_range(T lo, T hi) {
  return detail::make<T>(lo, hi, false);
}

/// A number of type T of at least `lo` ("--seed: must be 0 or more, got -5").
template <class T>
CLI::Validator at_least(T lo) {
  return detail::make<T>(lo, std::numeric_limits<T>::max(), false);
}

/// A number of type T above `lo`, e.g. a rate: "--lr: must be > 0, got 0".
template <class T>
CLI::Validator above(T lo, T hi = std::numeric_limits<T>::max()) {
  return detail::make<T>(lo, hi, true);
}

}  // namespace stoker::apps
