#include "daemon/mappings.hpp"

#include <sys/sysmacros.h>
#include <unistd.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace salus::daemon {
namespace {

// Whether a maps line (`start-end perms offset major:minor inode path`) overlaps a range.
bool overlaps(const std::string& line, const std::vector<FileRange>& ranges) {
  std::uint64_t start = 0, end = 0, offset = 0, inode = 0;
  unsigned major_number = 0, minor_number = 0;
  char perms[8] = {};
  if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64, &start,
                  &end, perms, &offset, &major_number, &minor_number, &inode) != 7 ||
      inode == 0) {
    return false;
  }
  const std::uint64_t device = makedev(major_number, minor_number);
  const std::uint64_t length = end - start;
  for (const FileRange& r : ranges) {
    if (r.device == device && r.inode == inode && offset < r.offset + r.bytes &&
        r.offset < offset + length) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<pid_t> processes_mapping(const std::vector<FileRange>& ranges) {
  std::vector<pid_t> found;
  if (ranges.empty()) return found;
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name.front()))) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == self) continue;
    std::ifstream maps(entry.path() / "maps");  // unreadable (gone, not ours): skipped
    for (std::string line; std::getline(maps, line);) {
      if (overlaps(line, ranges)) {
        found.push_back(pid);
        break;
      }
    }
  }
  return found;
}

}  // namespace salus::daemon
