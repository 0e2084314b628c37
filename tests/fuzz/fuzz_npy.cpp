// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the .npy parser on any bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "stoker/stages/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto file = std::as_bytes(std::span(data, size));
  auto pool = stoker::BufferPool::create();
  try {
    const auto sample = stoker::parse_npy(file, "fuzz-input.npy", *pool);
    // A parse that succeeds must account for every byte of the file.
    const auto header = stoker::parse_npy_header(file, file.size(), "fuzz-input.npy");
    if (sample.data.size() != sample.shape.elements() * stoker::dtype_size(sample.dtype) ||
        header.data_offset + sample.data.size() != size)
      std::abort();
  } catch (const stoker::DataError&) {
  }
  return 0;
}
