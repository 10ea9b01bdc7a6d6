// The fake driver's model of queued GPU work: streams as in-order queues of items (kernels the test
// enqueues, copies, stream waits, event records), completion, and the violations that releasing
// memory under unfinished work makes. See the top of fake_driver.hpp for the rules.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <set>
#include <stdexcept>

#include "support/fake_driver_state.hpp"

namespace salus::test {

namespace {

std::uintptr_t key(CUstream stream) {
  return std::bit_cast<std::uintptr_t>(stream);
}

std::string stream_name(CUstream stream) {
  return stream == nullptr ? std::string("the legacy stream")
                           : fmt::format("stream {:#x}", key(stream));
}

bool overlaps(CUdeviceptr a, std::size_t a_bytes, CUdeviceptr b, std::size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

}  // namespace

// --- the queue (lock held) ---------------------------------------------------------------------

std::uint64_t FakeDriver::State::enqueue(ItemKind kind, CUstream stream, std::vector<Span> spans,
                                         std::uint64_t also, bool held,
                                         std::vector<CopyPiece> pieces) {
  Item item{kind, stream, {}, std::move(spans), held, std::move(pieces)};
  const auto follow = [&](std::uintptr_t queue) {
    const auto tail = tails_.find(queue);
    if (tail != tails_.end() && !finished(tail->second)) item.after.push_back(tail->second);
  };
  follow(key(stream));
  // The legacy stream and blocking streams wait for each other's earlier work.
  if (stream == nullptr) {
    for (const std::uintptr_t blocking : blocking_streams_) follow(blocking);
  } else if (blocking_streams_.contains(key(stream))) {
    follow(0);
  }
  if (also != 0 && !finished(also)) item.after.push_back(also);
  if (kind == ItemKind::kernel || kind == ItemKind::copy) check_views(item);
  const std::uint64_t id = next_item_++;
  items_.emplace(id, std::move(item));
  tails_[key(stream)] = id;
  settle();
  return id;
}

void FakeDriver::State::settle() {
  // An item only follows items with smaller ids, so one pass in id order settles every chain.
  // A ready host function goes to the host-function thread, which finishes it once it has run.
  for (auto it = items_.begin(); it != items_.end();) {
    Item& item = it->second;
    const bool ready = std::all_of(item.after.begin(), item.after.end(),
                                   [&](std::uint64_t id) { return finished(id); });
    if (ready && item.kind == ItemKind::host) {
      dispatch(it->first, item);
      ++it;
    } else if (ready && item.kind != ItemKind::kernel && !item.held) {
      it = retire(it);
    } else {
      ++it;
    }
  }
}

void FakeDriver::State::complete(std::uint64_t id) {
  // Everything `id` follows, transitively; then finished in id order (each after what it
  // follows). A host function cannot be finished here: it is dispatched, and what follows it
  // stays pending until it has run (wait_finished).
  std::set<std::uint64_t> closure;
  std::vector<std::uint64_t> todo{id};
  while (!todo.empty()) {
    const std::uint64_t next = todo.back();
    todo.pop_back();
    const auto it = items_.find(next);
    if (it == items_.end() || !closure.insert(next).second) continue;
    todo.insert(todo.end(), it->second.after.begin(), it->second.after.end());
  }
  for (const std::uint64_t next : closure) {
    const auto it = items_.find(next);
    if (it == items_.end()) continue;
    Item& item = it->second;
    if (!std::all_of(item.after.begin(), item.after.end(),
                     [&](std::uint64_t before) { return finished(before); })) {
      continue;
    }
    if (item.kind == ItemKind::host) {
      dispatch(next, item);
    } else {
      retire(it);
    }
  }
  settle();
}

std::map<std::uint64_t, FakeDriver::State::Item>::iterator FakeDriver::State::retire(
    std::map<std::uint64_t, Item>::iterator it) {
  if (it->second.kind == ItemKind::record) record_times_[it->first] = clock_ms_;
  if (it->second.kind == ItemKind::copy) carry_words(it->second.pieces);
  return items_.erase(it);
}

void FakeDriver::State::complete_stream(CUstream stream) {
  std::vector<std::uintptr_t> queues{key(stream)};
  if (stream == nullptr)
    queues.insert(queues.end(), blocking_streams_.begin(), blocking_streams_.end());
  for (const std::uintptr_t queue : queues) {
    if (const auto tail = tails_.find(queue); tail != tails_.end()) complete(tail->second);
  }
}

FakeDriver::State::Span FakeDriver::State::span_of(CUdeviceptr va, std::size_t bytes) const {
  Span span{va, bytes, {}};
  for (CUdeviceptr page = va - va % page_; page < va + bytes; page += page_) {
    auto it = mappings_.upper_bound(page);
    if (it == mappings_.begin()) continue;
    --it;
    if (page >= it->first + it->second.size) continue;
    if (std::find(span.chunks.begin(), span.chunks.end(), it->second.handle) == span.chunks.end()) {
      span.chunks.push_back(it->second.handle);
      span.via.push_back(it->second.via);
    }
  }
  return span;
}

std::string FakeDriver::State::describe(std::uint64_t id) const {
  const Item& item = items_.at(id);
  const auto range = [](const Span& s) { return fmt::format("[{:#x}, +{:#x})", s.va, s.bytes); };
  switch (item.kind) {
    case ItemKind::kernel:
      return fmt::format("kernel #{} on {} over {}", id, stream_name(item.stream),
                         range(item.spans.at(0)));
    case ItemKind::copy:
      return fmt::format("copy #{} on {} from {} to {}", id, stream_name(item.stream),
                         range(item.spans.at(1)), range(item.spans.at(0)));
    case ItemKind::wait:
      return fmt::format("stream wait #{} on {}", id, stream_name(item.stream));
    case ItemKind::record:
      return fmt::format("event record #{} on {}", id, stream_name(item.stream));
    case ItemKind::host:
      return fmt::format("host function #{} on {}", id, stream_name(item.stream));
  }
  return fmt::format("item #{}", id);
}

void FakeDriver::State::check_range(std::string_view call, CUdeviceptr ptr, std::size_t size) {
  for (const auto& [id, item] : items_) {
    for (const Span& span : item.spans) {
      if (!overlaps(ptr, size, span.va, span.bytes)) continue;
      violations_.push_back(fmt::format("{} of [{:#x}, +{:#x}) while unfinished {} references it",
                                        call, ptr, size, describe(id)));
      break;
    }
  }
}

void FakeDriver::State::check_views(const Item& item) {
  // What the new item follows, transitively (only unfinished items are listed).
  std::set<std::uint64_t> before;
  std::vector<std::uint64_t> todo = item.after;
  while (!todo.empty()) {
    const std::uint64_t next = todo.back();
    todo.pop_back();
    const auto it = items_.find(next);
    if (it == items_.end() || !before.insert(next).second) continue;
    todo.insert(todo.end(), it->second.after.begin(), it->second.after.end());
  }
  for (const Span& mine : item.spans) {
    for (std::size_t c = 0; c < mine.chunks.size(); ++c) {
      for (const auto& [id, other] : items_) {
        if (before.contains(id)) continue;
        if (other.kind != ItemKind::kernel && other.kind != ItemKind::copy) continue;
        for (const Span& theirs : other.spans) {
          for (std::size_t o = 0; o < theirs.chunks.size(); ++o) {
            if (theirs.chunks[o] != mine.chunks[c] || theirs.via[o] == mine.via[c]) continue;
            violations_.push_back(fmt::format(
                "work on {} reaches allocation {:#x} through handle {:#x} while unfinished {} "
                "reaches it through handle {:#x} and is not ordered before it: a page used "
                "before its interprocess fence",
                stream_name(item.stream), mine.chunks[c], mine.via[c], describe(id),
                theirs.via[o]));
          }
        }
      }
    }
  }
}

void FakeDriver::State::check_chunk(CUmemGenericAllocationHandle handle) {
  for (const auto& [id, item] : items_) {
    for (const Span& span : item.spans) {
      if (std::find(span.chunks.begin(), span.chunks.end(), handle) == span.chunks.end()) continue;
      violations_.push_back(
          fmt::format("cuMemRelease of chunk {:#x} while unfinished {} references it (it was "
                      "mapped there when the work was enqueued)",
                      handle, describe(id)));
      break;
    }
  }
}

// --- the test's side ---------------------------------------------------------------------------

std::uint64_t FakeDriver::State::enqueue_work(CUstream stream, CUdeviceptr va, std::size_t bytes) {
  const std::scoped_lock lock(mutex_);
  if (!valid_stream(stream)) {
    throw std::invalid_argument(fmt::format("enqueue_work: unknown {}", stream_name(stream)));
  }
  if (bytes == 0 || !range_mapped(va, bytes)) {
    throw std::invalid_argument(
        fmt::format("enqueue_work: [{:#x}, +{:#x}) is empty or not all mapped", va, bytes));
  }
  check_access("kernel", device_of_stream(stream), va, bytes, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  return enqueue(ItemKind::kernel, stream, {span_of(va, bytes)});
}

void FakeDriver::State::finish_work(std::uint64_t id) {
  const std::scoped_lock lock(mutex_);
  complete(id);
}

void FakeDriver::State::finish_all_work() {
  {
    // Host functions run on their thread; the rest finishes now.
    const std::scoped_lock lock(mutex_);
    for (auto it = items_.begin(); it != items_.end();) {
      if (it->second.kind == ItemKind::host) {
        dispatch(it->first, it->second);
        ++it;
      } else {
        it = retire(it);
      }
    }
  }
  drain_host_functions();
}

void FakeDriver::State::advance_clock(double milliseconds) {
  const std::scoped_lock lock(mutex_);
  clock_ms_ += milliseconds;
}

bool FakeDriver::State::work_finished(std::uint64_t id) const {
  const std::scoped_lock lock(mutex_);
  return finished(id);
}

std::size_t FakeDriver::State::pending_work() const {
  const std::scoped_lock lock(mutex_);
  return static_cast<std::size_t>(std::count_if(items_.begin(), items_.end(), [](const auto& e) {
    return e.second.kind == ItemKind::kernel || e.second.kind == ItemKind::copy;
  }));
}

std::vector<std::string> FakeDriver::State::violations() const {
  const std::scoped_lock lock(mutex_);
  return violations_;
}

void FakeDriver::State::clear_violations() {
  const std::scoped_lock lock(mutex_);
  violations_.clear();
}

}  // namespace salus::test
