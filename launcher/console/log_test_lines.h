// Deterministic line streams for the log path's tests and benchmark: the
// writer process and the checker build the same bytes from the same seed.
#pragma once

#include <cstdint>
#include <string>

namespace dflash::logtest {

/// splitmix64: tiny, seedable, identical everywhere.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi].
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Next() % (hi - lo + 1); }
};

/// `count` lines of `min_len..max_len` bytes (without the '\n'). Each starts
/// with "<index>:" (cut short for short lines) and never contains '\n'. With
/// `partial_last`, the last line has no '\n'.
inline std::string MakeLines(uint64_t seed, uint64_t count, uint64_t min_len, uint64_t max_len,
                             bool partial_last) {
  Rng rng(seed);
  std::string out;
  out.reserve(count * (min_len + max_len) / 2 + count);
  for (uint64_t i = 0; i < count; ++i) {
    size_t len = rng.Range(min_len, max_len);
    std::string head = std::to_string(i) + ":";
    size_t start = out.size();
    out.append(head, 0, std::min(len, head.size()));
    while (out.size() - start < len) out.push_back(static_cast<char>(' ' + rng.Next() % 95));
    if (i + 1 < count || !partial_last) out.push_back('\n');
  }
  return out;
}

}  // namespace dflash::logtest
