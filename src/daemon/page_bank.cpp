#include "daemon/page_bank.hpp"

#include <fcntl.h>
#include <fmt/format.h>

#include <cerrno>

#include <algorithm>
#include <utility>

namespace salus::daemon {

PageBank::PageBank(DeviceBackend& backend, int device, std::size_t page_bytes,
                   std::size_t capacity_bytes)
    : backend_(backend),
      device_(device),
      page_bytes_(page_bytes),
      capacity_pages_(capacity_bytes / page_bytes) {}

PageBank::~PageBank() {
  for (const auto& [id, slot] : pages_) {
    try {
      backend_.release_chunk(slot.chunk);
    } catch (const std::exception&) {
      // The daemon is going: the driver frees what is left at exit.
    }
  }
}

DeviceUse PageBank::use() const {
  return {granted_ * page_bytes_,       peak_granted_ * page_bytes_,
          capacity_pages_ * page_bytes_, pages_.size() * page_bytes_,
          released_idle_ * page_bytes_, withheld_ * page_bytes_};
}

std::vector<std::uint64_t> PageBank::grant(SessionId owner, std::size_t count) {
  std::vector<std::uint64_t> out;
  while (out.size() < count && !free_.empty()) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  while (out.size() < count && pages_.size() < capacity_pages_) {
    ChunkHandle chunk;
    try {
      chunk = backend_.create_chunk(Location::gpu(device_), page_bytes_);
    } catch (const DeviceError&) {
      break;  // the device has less than it said (another user): what was granted stands
    }
    const std::uint64_t id = remote::page_id(device_, next_serial_++);
    Slot slot;
    slot.chunk = chunk;
    pages_.emplace(id, std::move(slot));
    out.push_back(id);
  }
  for (const std::uint64_t id : out) pages_.at(id).owner = owner;
  granted_ += out.size();
  peak_granted_ = std::max(peak_granted_, granted_);
  return out;
}

std::vector<std::uint64_t> PageBank::of_another_user(const std::vector<std::uint64_t>& ids,
                                                     std::uint32_t user) const {
  std::vector<std::uint64_t> out;
  for (const std::uint64_t id : ids) {
    const std::optional<std::uint32_t>& last = pages_.at(id).user;
    if (last && *last != user) out.push_back(id);
  }
  return out;
}

void PageBank::set_user(const std::vector<std::uint64_t>& ids, SessionId owner,
                        std::uint32_t user) {
  for (const std::uint64_t id : ids) {
    Slot& slot = pages_.at(id);
    if (slot.owner == owner) slot.user = user;
  }
}

void PageBank::set_fence(std::uint64_t id, FencePtr fence) { pages_.at(id).fence = std::move(fence); }

bool PageBank::all_held_by(SessionId owner, const std::vector<std::uint64_t>& ids) const {
  std::vector<std::uint64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return false;
  return std::all_of(ids.begin(), ids.end(), [&](std::uint64_t id) {
    auto it = pages_.find(id);
    return it != pages_.end() && it->second.owner == owner;
  });
}

void PageBank::take_back(const std::vector<std::uint64_t>& ids, remote::GiveFence mode,
                         FencePtr fence) {
  const Clock::time_point now = Clock::now();
  for (const std::uint64_t id : ids) {
    Slot& slot = pages_.at(id);
    slot.owner = 0;
    slot.freed_at = now;
    if (mode == remote::GiveFence::settled) slot.fence = nullptr;
    if (mode == remote::GiveFence::fenced) slot.fence = fence;
    free_.push_back(id);
  }
  granted_ -= ids.size();
  if (mode == remote::GiveFence::fenced) fenced_returns_ += ids.size();
}

std::size_t PageBank::take_back_all(SessionId owner) {
  std::vector<std::uint64_t> ids;
  for (const auto& [id, slot] : pages_) {
    if (slot.owner == owner) ids.push_back(id);
  }
  // The holder's own work ended with it (the coordinator waits for its exit first); a fence of
  // another process's work it was granted with may still hold.
  take_back(ids, remote::GiveFence::untouched);
  return ids.size();
}

void PageBank::forget_fences_of(SessionId session) {
  for (auto& [id, slot] : pages_) {
    if (!slot.fence || slot.fence->from != session) continue;
    if (slot.withheld) {
      release_withheld(id);
    } else {
      slot.fence = nullptr;
    }
  }
}

void PageBank::withhold(std::uint64_t id, SessionId owner) {
  Slot& slot = pages_.at(id);
  if (slot.owner != owner) return;  // went back meanwhile (its session closed)
  slot.owner = 0;
  slot.withheld = true;
  --granted_;
  ++withheld_;
}

std::vector<std::pair<std::uint64_t, PageBank::FencePtr>> PageBank::withheld() const {
  std::vector<std::pair<std::uint64_t, FencePtr>> out;
  for (const auto& [id, slot] : pages_) {
    if (slot.withheld) out.emplace_back(id, slot.fence);
  }
  return out;
}

void PageBank::release_withheld(std::uint64_t id) {
  Slot& slot = pages_.at(id);
  if (!slot.withheld) return;
  slot.withheld = false;
  slot.fence = nullptr;
  slot.freed_at = Clock::now();
  free_.push_back(id);
  --withheld_;
}

std::vector<ChunkHandle> PageBank::take_idle(Clock::time_point now, Clock::duration idle) {
  std::vector<ChunkHandle> out;
  // free_ is in the order the pages came back, so the idle ones lead it (a fenced one among them
  // is kept in its place).
  std::size_t kept = 0;
  std::size_t i = 0;
  for (; i < free_.size(); ++i) {
    auto it = pages_.find(free_[i]);
    if (now - it->second.freed_at < idle) break;
    if (it->second.fence) {
      free_[kept++] = free_[i];
      continue;
    }
    out.push_back(it->second.chunk);
    pages_.erase(it);
  }
  free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(kept),
              free_.begin() + static_cast<std::ptrdiff_t>(i));
  released_idle_ += out.size();
  return out;
}

std::size_t PageBank::fenced_pages() const {
  return static_cast<std::size_t>(std::count_if(
      pages_.begin(), pages_.end(), [](const auto& entry) { return entry.second.fence != nullptr; }));
}

std::size_t PageBank::held_by(SessionId owner) const {
  return static_cast<std::size_t>(std::count_if(
      pages_.begin(), pages_.end(), [&](const auto& entry) { return entry.second.owner == owner; }));
}

std::vector<ChunkHandle> PageBank::chunks_held_by(SessionId owner) const {
  std::vector<ChunkHandle> chunks;
  for (const auto& [id, slot] : pages_) {
    if (slot.owner == owner) chunks.push_back(slot.chunk);
  }
  return chunks;
}

std::string PageBank::inconsistency() const {
  std::vector<std::uint64_t> free = free_;
  std::sort(free.begin(), free.end());
  if (std::adjacent_find(free.begin(), free.end()) != free.end()) return "a page is free twice";
  for (const std::uint64_t id : free) {
    auto it = pages_.find(id);
    if (it == pages_.end()) return fmt::format("free page {:#x} does not exist", id);
    if (it->second.owner != 0) return fmt::format("page {:#x} is free and held", id);
  }
  const auto held = static_cast<std::size_t>(std::count_if(
      pages_.begin(), pages_.end(), [](const auto& entry) { return entry.second.owner != 0; }));
  if (held != granted_) return fmt::format("{} pages held, {} counted granted", held, granted_);
  const auto withheld = static_cast<std::size_t>(std::count_if(
      pages_.begin(), pages_.end(), [](const auto& entry) { return entry.second.withheld; }));
  if (withheld != withheld_) {
    return fmt::format("{} pages withheld, {} counted", withheld, withheld_);
  }
  if (held + free_.size() + withheld != pages_.size()) {
    return fmt::format("{} held + {} free + {} withheld != {} pages", held, free_.size(), withheld,
                       pages_.size());
  }
  return "";
}

// One descriptor per page, never shared between pages. The descriptors of one simulated device
// are slices of one memfd, and sending each once would save descriptors; but a descriptor's file
// (fstat's device and inode) does not tell which memory it names: the CUDA driver's exports
// are all one file (seen on an H100, driver 580: four exports, one inode), so merging
// descriptors by file handed a process one physical page for a whole batch. The importing process keeps one duplicate per file where the backend maps files
// (the simulated backend's import), so the count it keeps stays small either way.
PageBank::Batch PageBank::export_pages(const std::vector<std::uint64_t>& ids) {
  Batch batch;
  batch.entries.reserve(ids.size());
  batch.fds.reserve(ids.size());
  std::vector<const Fence*> fences;  // distinct, in batch.fences' order
  for (const std::uint64_t id : ids) {
    const Slot& slot = pages_.at(id);
    const SharedChunk shared = backend_.export_chunk(slot.chunk);
    batch.fds.emplace_back(shared.fd);
    const auto index = static_cast<std::uint32_t>(batch.fds.size() - 1);
    std::uint32_t fence = 0;
    if (slot.fence) {
      const auto at = std::find(fences.begin(), fences.end(), slot.fence.get());
      fence = static_cast<std::uint32_t>(at - fences.begin()) + 1;
      if (at == fences.end()) fences.push_back(slot.fence.get());
    }
    batch.entries.push_back({id, shared.offset, index, fence});
  }
  for (const Fence* f : fences) {
    remote::FenceEntry entry = f->entry;
    entry.fd_index = -1;
    if (f->fd.get() >= 0) {
      const int fd = ::fcntl(f->fd.get(), F_DUPFD_CLOEXEC, 0);
      if (fd < 0) {
        throw DeviceError("fcntl", "SALUSD_FDS", errno,
                          fmt::format("salusd could not duplicate a fence's descriptor: errno {}",
                                      errno));
      }
      batch.fds.emplace_back(fd);
      entry.fd_index = static_cast<std::int32_t>(batch.fds.size() - 1);
    }
    batch.fences.push_back(entry);
  }
  return batch;
}

}  // namespace salus::daemon
