#include "memory/page_mover.hpp"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string_view>

#include "log/log.hpp"

namespace salus::memory {

namespace {

// How often putting a page back under its address is tried. A map or an access grant that the
// driver refused a moment ago (for want of a resource then) succeeds when asked again, and giving
// up would leave a live block's address without its page; a driver that refuses every time has
// lost the context, and then the tries cost microseconds.
constexpr int kRestoreAttempts = 16;

// Errors after which the context is lost for good (a kernel fault): every later call fails the
// same way, so trying again only delays the report.
bool sticky(const DeviceError& e) {
  static constexpr std::string_view kSticky[] = {
      "CUDA_ERROR_ILLEGAL_ADDRESS",      "CUDA_ERROR_LAUNCH_FAILED",
      "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
      "CUDA_ERROR_MISALIGNED_ADDRESS",   "CUDA_ERROR_INVALID_ADDRESS_SPACE",
      "CUDA_ERROR_INVALID_PC",           "CUDA_ERROR_ECC_UNCORRECTABLE",
      "CUDA_ERROR_ASSERT",               "CUDA_ERROR_CONTEXT_IS_DESTROYED",
      "CUDA_ERROR_DEINITIALIZED",        "CUDA_ERROR_LAUNCH_TIMEOUT",
  };
  return std::find(std::begin(kSticky), std::end(kSticky), e.status()) != std::end(kSticky);
}

template <class F>
void retried(F&& step) {
  for (int attempt = 1;; ++attempt) {
    try {
      step();
      return;
    } catch (const DeviceError& e) {
      if (attempt == kRestoreAttempts || sticky(e)) throw;
      log::warn("putting a page back failed (try {} of {}): {}", attempt, kRestoreAttempts,
                e.what());
    }
  }
}

}  // namespace

AccessGrants::AccessGrants(int device_count, int device,
                           const std::function<bool(int, int)>& reaches) {
  on_device_.resize(static_cast<std::size_t>(device_count));
  for (int p = 0; p < device_count; ++p) {
    auto& grants = on_device_[static_cast<std::size_t>(p)];
    // The owner always: its pages on a peer are borrowed only over a link it has.
    grants.push_back({device, Access::read_write});
    for (int q = 0; q < device_count; ++q) {
      if (q != device && (q == p || reaches(q, p))) grants.push_back({q, Access::read_write});
    }
  }
  // Host memory is within every device's reach.
  for (int q = 0; q < device_count; ++q) on_host_.push_back({q, Access::read_write});
}

std::span<const AccessGrant> AccessGrants::of(Location where) const {
  if (where.is_host()) return on_host_;
  return on_device_.at(static_cast<std::size_t>(where.index));
}

PageMover::PageMover(std::shared_ptr<DeviceBackend> backend, int device, std::size_t page_bytes,
                     std::size_t window_pages)
    : backend_(std::move(backend)),
      device_(device),
      page_bytes_(page_bytes),
      window_pages_(window_pages) {}

PageMover::~PageMover() {
  if (window_ == 0) return;
  try {
    stream_->synchronize();
    backend_->free_address(window_, window_pages_ * page_bytes_);
  } catch (const Error& e) {
    log::error("releasing the page mover of device {} failed: {}", device_, e.what());
  }
}

void PageMover::ensure_started() {
  if (window_ != 0) return;
  // The least urgent priority: moves yield to the jobs' own work.
  stream_.emplace(backend_, device_, backend_->stream_priority_range(device_).least);
  for (std::size_t i = 0; i < window_pages_; ++i) landed_.emplace_back(backend_, device_);
  window_ = backend_->reserve_address(window_pages_ * page_bytes_, page_bytes_);
}

double PageMover::run(std::span<PageMove> moves,
                      std::span<const std::shared_ptr<const Event>> after,
                      const AccessGrants& grants, std::vector<Page>& old) {
  if (moves.empty()) return 0.0;
  std::lock_guard lock(mu_);
  ensure_started();
  const auto start = std::chrono::steady_clock::now();
  DeviceBackend& backend = *backend_;
  // Ordered after every use so far of the pages (the owners are quiescent: nothing new comes),
  // and after whatever last used the destination pages.
  for (const auto& mark : after) {
    if (!mark->query()) backend.stream_wait_event(stream_->handle(), mark->handle(), device_);
  }
  for (const PageMove& move : moves) {
    if (move.to.fence) move.to.fence->order(backend, stream_->handle(), device_);
  }
  for (std::size_t first = 0; first < moves.size(); first += window_pages_) {
    const std::size_t n = std::min(window_pages_, moves.size() - first);
    move_window(moves.subspan(first, n), grants, old);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void PageMover::move_window(std::span<PageMove> window, const AccessGrants& grants,
                            std::vector<Page>& old) {
  stage_window(window);
  swap_window(window, grants, old);
}

void PageMover::stage_window(std::span<PageMove> window) {
  DeviceBackend& backend = *backend_;
  const AccessGrant self{device_, Access::read_write};
  std::size_t staged = 0;
  bool slot_mapped = false;  // the slot being staged is mapped (its access or copy may fail)
  try {
    for (; staged < window.size(); ++staged) {
      const DevicePtr slot = window_ + staged * page_bytes_;
      backend.map(slot, page_bytes_, window[staged].to.chunk, 0);
      slot_mapped = true;
      backend.set_access(slot, page_bytes_, std::span(&self, 1));
      backend.copy_async(slot, window[staged].va, page_bytes_, stream_->handle());
      landed_[staged].record(stream_->handle());
      slot_mapped = false;
    }
  } catch (...) {
    // Nothing has changed hands yet: undo the staging and leave every page where it was. The
    // slot that failed half-way is unmapped too, or every later move would find it taken.
    try {
      stream_->synchronize();
      const std::size_t mapped = staged + (slot_mapped ? 1 : 0);
      for (std::size_t i = 0; i < mapped; ++i) {
        backend.unmap(window_ + i * page_bytes_, page_bytes_);
      }
    } catch (const Error& e) {
      log::error("undoing a staged page move failed: {}", e.what());
    }
    throw;
  }
}

void PageMover::swap_window(std::span<PageMove> window, const AccessGrants& grants,
                            std::vector<Page>& old) {
  DeviceBackend& backend = *backend_;
  std::size_t i = 0;
  try {
    for (; i < window.size(); ++i) {
      PageMove& move = window[i];
      landed_[i].synchronize();
      const DevicePtr slot = window_ + i * page_bytes_;
      backend.unmap(slot, page_bytes_);
      backend.unmap(move.va, page_bytes_);
      bool new_mapped = false;
      try {
        backend.map(move.va, page_bytes_, move.to.chunk, 0);
        new_mapped = true;
        backend.set_access(move.va, page_bytes_, grants.of(move.to.where));
      } catch (...) {
        // Put the old page back under its address; its bytes are intact. When the new page got
        // mapped but not its access, it has to come off first (the caller takes it back as unused).
        if (new_mapped) backend.unmap(move.va, page_bytes_);
        retried([&] { backend.map(move.va, page_bytes_, move.slot->chunk, 0); });
        retried([&] { backend.set_access(move.va, page_bytes_, grants.of(move.slot->where)); });
        throw;
      }
      old.push_back({move.slot->chunk, nullptr, move.slot->where});
      // What the page waited for has finished: the copy came after it.
      *move.slot = PageSlot{move.to.chunk, move.to.where, true, false, nullptr};
      move.done = true;
    }
  } catch (...) {
    try {
      for (std::size_t j = i + 1; j < window.size(); ++j) {
        landed_[j].synchronize();
        backend.unmap(window_ + j * page_bytes_, page_bytes_);
      }
    } catch (const Error& e) {
      log::error("undoing a staged page move failed: {}", e.what());
    }
    throw;
  }
}

}  // namespace salus::memory
