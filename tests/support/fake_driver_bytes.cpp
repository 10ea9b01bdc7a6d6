// The fake driver's bytes: sparse 64-bit words per physical chunk, written and read by the test
// through a mapped address, and carried by copies when they complete. Enough to tell whether a
// block's bytes survived every remap and page move, without holding gigabytes of fake memory.
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "support/fake_driver_state.hpp"

namespace salus::test {

std::optional<std::pair<CUmemGenericAllocationHandle, std::size_t>> FakeDriver::State::resolve(
    CUdeviceptr va) const {
  auto it = mappings_.upper_bound(va);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (va >= it->first + it->second.size) return std::nullopt;
  return std::pair{it->second.handle, it->second.offset + (va - it->first)};
}

std::vector<FakeDriver::State::CopyPiece> FakeDriver::State::copy_pieces(CUdeviceptr dst,
                                                                          CUdeviceptr src,
                                                                          std::size_t bytes) const {
  // Pieces end where either side crosses a page, since each page may map another chunk.
  std::vector<CopyPiece> pieces;
  for (std::size_t done = 0; done < bytes;) {
    const std::size_t step = std::min({bytes - done,
                                       static_cast<std::size_t>(page_ - (src + done) % page_),
                                       static_cast<std::size_t>(page_ - (dst + done) % page_)});
    const auto from = resolve(src + done);
    const auto to = resolve(dst + done);
    if (from && to) pieces.push_back({from->first, from->second, to->first, to->second, step});
    done += step;
  }
  return pieces;
}

void FakeDriver::State::carry_words(const std::vector<CopyPiece>& pieces) {
  for (const CopyPiece& piece : pieces) {
    // A source chunk released under the copy is a violation already recorded; nothing to carry.
    std::vector<std::pair<std::size_t, std::uint64_t>> moved;
    if (const auto src = words_.find(piece.src); src != words_.end()) {
      for (auto w = src->second.lower_bound(piece.src_offset);
           w != src->second.end() && w->first < piece.src_offset + piece.bytes; ++w) {
        moved.emplace_back(w->first - piece.src_offset + piece.dst_offset, w->second);
      }
    }
    if (!chunks_.contains(piece.dst)) continue;
    std::map<std::size_t, std::uint64_t>& dst = words_[piece.dst];
    dst.erase(dst.lower_bound(piece.dst_offset), dst.lower_bound(piece.dst_offset + piece.bytes));
    dst.insert(moved.begin(), moved.end());
  }
}

void FakeDriver::State::write_word(CUdeviceptr va, std::uint64_t value) {
  const std::scoped_lock lock(mutex_);
  const auto at = va % 8 == 0 ? resolve(va) : std::nullopt;
  if (!at) throw std::invalid_argument(fmt::format("write_word: {:#x} is unaligned or unmapped", va));
  words_[at->first][at->second] = value;
}

std::uint64_t FakeDriver::State::read_word(CUdeviceptr va) const {
  const std::scoped_lock lock(mutex_);
  const auto at = va % 8 == 0 ? resolve(va) : std::nullopt;
  if (!at) throw std::invalid_argument(fmt::format("read_word: {:#x} is unaligned or unmapped", va));
  const auto chunk = words_.find(at->first);
  if (chunk == words_.end()) return 0;
  const auto word = chunk->second.find(at->second);
  return word != chunk->second.end() ? word->second : 0;
}

}  // namespace salus::test
