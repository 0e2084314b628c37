// SPDX-License-Identifier: Apache-2.0
// What the CPU transforms share. Private to stages/.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "stoker/stages/sample.h"
#include "stoker/stages/transforms.h"

namespace stoker::detail {

/// f(T{}) for the element type T of `t`.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::u8:
      return f(std::uint8_t{});
    case DType::u16:
      return f(std::uint16_t{});
    case DType::f32:
      return f(float{});
  }
  throw std::invalid_argument("unsupported dtype " + std::to_string(static_cast<int>(t)));
}

/// The Normalizer of an option, if given; its errors name `who`.
inline std::optional<Normalizer> make_normalizer(const std::optional<Normalization>& n, const char* who) {
  if (!n) return std::nullopt;
  try {
    return Normalizer(*n);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(who) + ": " + e.what());
  }
}

}  // namespace stoker::detail
