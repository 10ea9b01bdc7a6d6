// Internal: the files chunks imported into a SimMemory map from (other processes' pools).
//
// A file is held open once for all its imported chunks, whatever descriptor each import came
// with: importing hundreds of pages of one pool costs one descriptor, not hundreds. Each chunk
// holds its file; the file closes when the last of them lets go (drop). Not locked: SimMemory's
// lock guards every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>

#include "cuda/os_handles.hpp"

namespace salus::sim {

class ImportedFiles {
 public:
  struct File {
    UniqueFd fd;
    std::uint64_t device = 0;  // st_dev and st_ino: what tells two descriptors of one file apart
    std::uint64_t inode = 0;
  };

  // The File for the file `fd` refers to (fstat's st_dev and st_ino), opened on first use with a
  // duplicate of `fd` (which stays the caller's). Throws when the duplicate cannot be made.
  [[nodiscard]] std::shared_ptr<File> hold(int fd, std::uint64_t device, std::uint64_t inode);
  // Drops a chunk's hold on its file, and the table entry once nothing holds it.
  void drop(std::shared_ptr<File> file);
  // Files some chunk still holds.
  [[nodiscard]] std::size_t open_files() const;

 private:
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::weak_ptr<File>> files_;
};

}  // namespace salus::sim
