// SPDX-License-Identifier: Apache-2.0
// Images the image tests make, and ways to compare them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stoker/stages/image.h"
#include "stoker/stages/image_encode.h"

namespace stoker::test {

/// Interleaved uint8 pixels of a smooth pattern (gradients and a slow wave, different in every
/// channel), which JPEG at quality 100 keeps within a few levels.
inline Sample smooth_image(BufferPool& pool, std::uint32_t height, std::uint32_t width, std::uint32_t channels,
                           std::uint32_t seed = 0) {
  Sample s(pool, {.channels = channels, .height = height, .width = width, .channels_last = true}, DType::u8);
  auto* p = reinterpret_cast<std::uint8_t*>(s.data.data());
  for (std::uint32_t y = 0; y < height; ++y)
    for (std::uint32_t x = 0; x < width; ++x)
      for (std::uint32_t c = 0; c < channels; ++c) {
        const double u = double(x) / std::max(1u, width - 1), v = double(y) / std::max(1u, height - 1);
        const double wave = 0.5 + 0.5 * std::sin(3.0 * u + 2.0 * v + c + seed);
        const double value = c % 3 == 0 ? 0.6 * u + 0.4 * wave : c % 3 == 1 ? 0.7 * v + 0.3 * wave : wave;
        *p++ = static_cast<std::uint8_t>(std::lround(20 + 215 * value));
      }
  return s;
}

/// Interleaved uint8 pixels of noise: every byte independent, nothing a codec can smooth over.
inline Sample noise_image(BufferPool& pool, std::uint32_t height, std::uint32_t width, std::uint32_t channels,
                          std::uint32_t seed = 1) {
  Sample s(pool, {.channels = channels, .height = height, .width = width, .channels_last = true}, DType::u8);
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (auto& b : std::span(s.data.data(), s.data.size())) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    b = static_cast<std::byte>(state >> 24);
  }
  return s;
}

inline std::span<const std::uint8_t> pixels(const Sample& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data.data()), s.data.size()};
}

inline int max_abs_diff(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) throw std::invalid_argument("max_abs_diff: sizes differ");
  int most = 0;
  for (std::size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(int(a[i]) - int(b[i])));
  return most;
}

inline double mean_abs_diff(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) {
  if (a.size() != b.size()) throw std::invalid_argument("mean_abs_diff: sizes differ");
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
  return a.empty() ? 0 : sum / double(a.size());
}

/// The pixels of `window` of an interleaved image.
inline std::vector<std::uint8_t> cut(const Sample& s, const PixelRect& window) {
  const std::uint32_t c = s.shape.channels;
  std::vector<std::uint8_t> out;
  const auto p = pixels(s);
  for (std::uint32_t y = window.y; y < window.y + window.height; ++y) {
    const auto* row = p.data() + (std::size_t{y} * s.shape.width + window.x) * c;
    out.insert(out.end(), row, row + std::size_t{window.width} * c);
  }
  return out;
}

inline void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

}  // namespace stoker::test
