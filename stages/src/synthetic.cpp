// SPDX-License-Identifier: Apache-2.0
#include "stoker/stages/synthetic.h"

#include <cstring>

#include "stoker/core/random.h"

namespace stoker {

SyntheticSource::SyntheticSource(SyntheticOptions synthetic, ReaderOptions options)
    : Reader(std::move(options)), synthetic_(synthetic) {
  if (synthetic_.shape.elements() == 0)
    throw std::invalid_argument("SyntheticSource: option shape " + synthetic_.shape.str() + " is empty");
  if (synthetic_.num_classes < 1)
    throw std::invalid_argument("SyntheticSource: option num_classes must be at least 1, got " +
                                std::to_string(synthetic_.num_classes));
}

Sample SyntheticSource::read(std::uint64_t id) const {
  check_id(id);
  // Separate streams for the label and the content, both functions of (seed, id) alone.
  const auto label = static_cast<std::int32_t>(
      Rng(derive_seed(synthetic_.seed, id, 0)).below(static_cast<std::uint64_t>(synthetic_.num_classes)));
  Sample sample(*pool(), synthetic_.shape, synthetic_.dtype, label, id);
  Rng rng(derive_seed(synthetic_.seed, id, 1));

  if (synthetic_.dtype == DType::f32) {
    // 24 random bits give every float in [0, 1) with step 2^-24; two per generator step.
    auto values = sample.as<float>();
    std::size_t i = 0;
    for (; i + 2 <= values.size(); i += 2) {
      const auto r = rng();
      values[i] = static_cast<float>(r >> 40) * 0x1p-24f;
      values[i + 1] = static_cast<float>((r >> 8) & 0xFFFFFF) * 0x1p-24f;
    }
    if (i < values.size()) values[i] = static_cast<float>(rng() >> 40) * 0x1p-24f;
    return sample;
  }
  // Integers: every bit is uniform, so fill the bytes 8 at a time.
  std::byte* out = sample.data.data();
  std::size_t left = sample.data.size();
  for (; left >= 8; left -= 8, out += 8) {
    const auto r = rng();
    std::memcpy(out, &r, 8);
  }
  if (left) {
    const auto r = rng();
    std::memcpy(out, &r, left);
  }
  return sample;
}

}  // namespace stoker
