// ImportedFiles: one descriptor per file that imported chunks map from.
#include "cuda/sim_imported_files.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

namespace salus::sim {

std::shared_ptr<ImportedFiles::File> ImportedFiles::hold(int fd, std::uint64_t device,
                                                         std::uint64_t inode) {
  std::weak_ptr<File>& slot = files_[{device, inode}];
  if (std::shared_ptr<File> held = slot.lock()) return held;
  // The caller's descriptor stays the caller's: the chunks keep a duplicate.
  UniqueFd own{::fcntl(fd, F_DUPFD_CLOEXEC, 0)};
  if (own.get() < 0) {
    const int err = errno;
    files_.erase({device, inode});
    throw_errno("fcntl", err, "cuMemImportFromShareableHandle");
  }
  auto file = std::make_shared<File>(File{std::move(own), device, inode});
  slot = file;
  return file;
}

void ImportedFiles::drop(std::shared_ptr<File> file) {
  const std::pair key{file->device, file->inode};
  file.reset();  // closes the descriptor when this was its last chunk
  if (auto it = files_.find(key); it != files_.end() && it->second.expired()) files_.erase(it);
}

std::size_t ImportedFiles::open_files() const {
  return static_cast<std::size_t>(std::count_if(
      files_.begin(), files_.end(), [](const auto& entry) { return !entry.second.expired(); }));
}

}  // namespace salus::sim
