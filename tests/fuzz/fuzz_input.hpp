// Reads a fuzzer's input as a stream of small decisions. Every read succeeds: once the bytes run
// out it yields zeros, so a short input is still a complete (if dull) program and libFuzzer's
// mutations of any byte change one decision, not the framing of all the ones after it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace salus::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  [[nodiscard]] bool empty() const { return pos_ >= size_; }
  [[nodiscard]] std::size_t left() const { return empty() ? 0 : size_ - pos_; }

  std::uint8_t byte() { return empty() ? 0 : data_[pos_++]; }

  // `bytes` bytes (1..8), little-endian.
  std::uint64_t bits(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(byte()) << (8 * i);
    return v;
  }

  // An index below `n` (n > 0); n <= 256 costs one byte.
  std::size_t below(std::size_t n) {
    if (n <= 1) return 0;
    return static_cast<std::size_t>((n <= 256 ? byte() : bits(4)) % n);
  }

  // True with probability about `percent` / 100.
  bool chance(int percent) { return byte() % 100 < percent; }

  // Up to `max` bytes as a string (a length byte, then the characters).
  std::string text(std::size_t max) {
    const std::size_t n = below(max + 1);
    std::string s;
    for (std::size_t i = 0; i < n && !empty(); ++i) s.push_back(static_cast<char>(byte()));
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The call being checked, in words, for the failure message. With SALUS_FUZZ_VERBOSE set, every
// call is printed as it is made (to read a reproducer).
inline std::string& current_call() {
  static std::string call;
  return call;
}
inline void describe_call(std::string call) {
  static const bool verbose = std::getenv("SALUS_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "call: %s\n", call.c_str());
  current_call() = std::move(call);
}

// printf-style formatting for the call descriptions and messages.
template <class... Args>
std::string format_call(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// An inconsistency the target found: print it and abort, which libFuzzer (and the replay
// executable's ctest run) reports as a crash with this message above the stack.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz check failed: %s\n  during: %s\n", what.c_str(),
               current_call().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace salus::fuzz

#define FUZZ_CHECK(cond, message)                                                       \
  do {                                                                                  \
    if (!(cond)) ::salus::fuzz::fail(std::string(#cond) + ": " + std::string(message)); \
  } while (false)
