// Stamps: how the soak proves that a block's bytes are still the ones written into it.
//
// Stamps are sparse to spare the CPU (two cores shared by several engineers): one 8-byte word per
// 4 KiB, plus the block's last word, each a hash of the block's tag and the offset. That still
// touches every OS page of every block, so a page moved to a peer or the host and back with the
// wrong bytes, two live blocks sharing a page, or a block handed on while a reader still uses it
// shows up as a mismatch (and an unmapped page as a fault).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

#include "salus/device.hpp"
#include "salus/sim.hpp"  // KiB

namespace salus::soak {

inline constexpr std::size_t kStampStride = 4096;

inline std::uint64_t stamp_word(std::uint64_t tag, std::size_t offset) {
  // splitmix64 of (tag, offset): distinct blocks and offsets give unrelated words.
  std::uint64_t z = tag * 0x9E3779B97F4A7C15ull + offset + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Calls fn(offset) for each stamped word of a block of `bytes` (at least 8).
template <class Fn>
void for_each_stamp(std::size_t bytes, Fn&& fn) {
  for (std::size_t offset = 0; offset + sizeof(std::uint64_t) <= bytes; offset += kStampStride) {
    fn(offset);
  }
  fn((bytes - sizeof(std::uint64_t)) & ~std::size_t{7});
}

inline void write_stamps(DevicePtr ptr, std::size_t bytes, std::uint64_t tag) {
  auto* base = reinterpret_cast<unsigned char*>(ptr);
  for_each_stamp(bytes, [&](std::size_t offset) {
    const std::uint64_t word = stamp_word(tag, offset);
    std::memcpy(base + offset, &word, sizeof word);
  });
}

inline bool stamps_intact(DevicePtr ptr, std::size_t bytes, std::uint64_t tag) {
  const auto* base = reinterpret_cast<const unsigned char*>(ptr);
  bool intact = true;
  for_each_stamp(bytes, [&](std::size_t offset) {
    std::uint64_t word = 0;
    std::memcpy(&word, base + offset, sizeof word);
    if (word != stamp_word(tag, offset)) intact = false;
  });
  return intact;
}

// Half sub-page blocks (they share pages with other jobs' blocks), half up to `max_bytes`.
inline std::size_t random_block_size(std::mt19937_64& rng, std::size_t max_bytes) {
  if (rng() % 2 == 0) return 512 + rng() % (256 * KiB);
  return 256 * KiB + rng() % (max_bytes - 256 * KiB + 1);
}

inline double uniform(std::mt19937_64& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

}  // namespace salus::soak
