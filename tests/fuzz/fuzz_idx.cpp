// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the IDX parsers, and the gzip decoder in front of them, on any bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "stoker/stages/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = std::as_bytes(std::span(data, size));
  try {
    const auto images = stoker::parse_idx_images(file, "fuzz-input");
    // A parse that succeeds must describe exactly the pixels it returns.
    if (images.pixels.size() != std::size_t{images.count} * images.height * images.width) std::abort();
  } catch (const stoker::DataError&) {
  }
  try {
    const auto labels = stoker::parse_idx_labels(file, "fuzz-input");
    for (const auto label : labels)
      if (label < 0 || label > 255) std::abort();
  } catch (const stoker::DataError&) {
  }
  return 0;
}
