// A spinning thread's pause, for the few places that watch a word instead of sleeping (a turn
// that is due, a socket's answer that comes quickly): it lets the core's other hyperthread run
// and saves power.
#pragma once

namespace salus::waits {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace salus::waits
