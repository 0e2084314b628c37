// SPDX-License-Identifier: Apache-2.0
// Small, fast, reproducible random numbers.
#pragma once

#include <cstdint>
#include <string_view>

namespace stoker {

/// SplitMix64 finaliser: a good 64-bit mix, used to derive independent seeds.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Seed for a stream identified by (seed, a, b), e.g. (pipeline seed, epoch, sample id):
/// the same triple gives the same stream on every thread and every run.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) noexcept {
  return mix64(mix64(mix64(seed) ^ a) ^ b);
}

/// FNV-1a of `text`: a number for a name that is the same with every compiler and library.
constexpr std::uint64_t hash_name(std::string_view text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

/// xoshiro256** by Blackman and Vigna. Unlike the standard library's distributions, its
/// output, and `below()`, are the same with every compiler and library.
class Rng {
 public:
  using result_type = std::uint64_t;
  explicit constexpr Rng(std::uint64_t seed = 0) noexcept {
    for (auto& s : s_) s = seed = mix64(seed);
  }
  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return ~result_type{0}; }

  constexpr result_type operator()() noexcept {
    const auto result = rotl(s_[1] * 5, 7) * 9;
    const auto t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, n), unbiased (Lemire's multiply-and-reject). `n` must be > 0.
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    __extension__ using u128 = unsigned __int128;
    u128 m = static_cast<u128>((*this)()) * n;
    auto low = static_cast<std::uint64_t>(m);
    if (low < n) {
      const auto threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<u128>((*this)()) * n;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  /// True with probability p.
  constexpr bool bernoulli(double p) noexcept { return static_cast<double>((*this)() >> 11) * 0x1.0p-53 < p; }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4]{};
};

}  // namespace stoker
