// SPDX-License-Identifier: Apache-2.0
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

Sample Sample::view(const Sample& entry, std::shared_ptr<const void> owner) noexcept {
  Sample s;
  s.data = Buffer::view({entry.data.data(), entry.data.size()}, std::move(owner));
  s.shape = entry.shape;
  s.dtype = entry.dtype;
  s.label = entry.label;
  s.id = entry.id;
  s.entry_ = &entry;
  return s;
}

const Sample* Sample::viewed() const noexcept {
  const Sample* e = entry_;
  // Anything changed since view() (a copy made for writing, a new label or shape) makes the
  // sample other than its entry.
  if (!e || data.data() != e->data.data() || data.size() != e->data.size() || shape != e->shape || dtype != e->dtype ||
      label != e->label || id != e->id)
    return nullptr;
  return e;
}

}  // namespace stoker
