// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: the pipeline state's parser (PipelineState::from_json) on any bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "stoker/core/state.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto state =
        stoker::PipelineState::from_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz-input");
    // What parses must write back as the same state.
    if (stoker::PipelineState::from_json(state.to_json()) != state) std::abort();
  } catch (const stoker::StateError&) {
  }
  return 0;
}
