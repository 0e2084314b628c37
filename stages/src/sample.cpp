#include "stoker/stages/sample.h"

namespace stoker {

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::u8:
      return "uint8";
    case DType::u16:
      return "uint16";
    case DType::f32:
      return "float32";
  }
  return "?";
}

std::string Shape::str() const {
  std::string s = channels_last ? "" : std::to_string(channels) + "x";
  if (volume) s += std::to_string(depth) + "x";
  s += std::to_string(height) + "x" + std::to_string(width);
  return channels_last ? s + "x" + std::to_string(channels) : s;
}

}  // namespace stoker
