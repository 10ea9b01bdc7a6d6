// Which processes map a file's pages now, read from /proc/<pid>/maps. On the simulated device a
// page is a range of a memory file, mapped as ordinary memory, so a forked child keeps its
// parent's pages mapped after the parent has exited; salusd hands such a page on only once no
// process maps it (ExitWatch::wait_until_unmapped). A CUDA page is mapped by the driver in a
// context that no forked child has, and shows in no maps file.
//
// What this cannot see: processes whose maps file the daemon may not read (another user's, when
// the daemon is not root; one that made itself non-dumpable) and processes in another pid
// namespace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace salus::daemon {

// A range of a file, by the file's identity (fstat's st_dev and st_ino).
struct FileRange {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

// The processes other than this one with a mapping that overlaps any of `ranges`.
[[nodiscard]] std::vector<pid_t> processes_mapping(const std::vector<FileRange>& ranges);

}  // namespace salus::daemon
