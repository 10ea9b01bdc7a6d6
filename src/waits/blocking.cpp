#include "waits/blocking.hpp"

#include <atomic>

namespace salus {

namespace {
std::atomic<BeforeBlocking> g_hook{nullptr};
}  // namespace

BeforeBlocking set_before_blocking(BeforeBlocking hook) noexcept {
  return g_hook.exchange(hook);
}

namespace waits {

void before_blocking() noexcept {
  if (const BeforeBlocking hook = g_hook.load(std::memory_order_acquire)) hook();
}

}  // namespace waits
}  // namespace salus
