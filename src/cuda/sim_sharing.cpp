// SimBackend: sharing physical chunks between processes (export_chunk, import_chunk).
//
// A simulated device's memory is one memfd, so a chunk is shared as a duplicate of that memfd plus
// the chunk's offset in it: another process maps the same file pages, and bytes written on one
// side show on the other. The importer keeps one descriptor per distinct file however many chunks
// of it it imports (ImportedFile), and releasing an imported chunk only lets go of it.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "cuda/sim_backend.hpp"

namespace salus::sim {
namespace {

// What import_chunk needs to know of the descriptor it was handed; InvalidArgument when it cannot
// hold exported memory.
struct stat describe_shared(const SharedChunk& shared) {
  struct stat st {};
  if (::fstat(shared.fd, &st) != 0) {
    const int err = errno;
    if (err == EBADF) {
      throw InvalidArgument(fmt::format("import_chunk: file descriptor {} is not open", shared.fd));
    }
    throw_errno("fstat", err, "cuMemImportFromShareableHandle");
  }
  if (!S_ISREG(st.st_mode)) {
    throw InvalidArgument(fmt::format(
        "import_chunk: file descriptor {} is no exported memory (not a memory file)", shared.fd));
  }
  // A read-only descriptor would map, but the first set_access granting writes would fail.
  const int flags = ::fcntl(shared.fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    throw InvalidArgument(fmt::format(
        "import_chunk: file descriptor {} is not open for reading and writing", shared.fd));
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (shared.offset > size || shared.bytes > size - shared.offset) {
    throw InvalidArgument(
        fmt::format("import_chunk: [{:#x}, +{}) lies outside the shared file of {} bytes",
                    shared.offset, shared.bytes, size));
  }
  return st;
}

}  // namespace

SharedChunk SimBackend::do_export_chunk(ChunkHandle chunk) {
  check_process("this simulated GPU's memory");
  std::lock_guard lock(mem_mutex_);
  auto it = chunks_.find(chunk.value);
  if (it == chunks_.end() || it->second.released) {
    throw InvalidArgument(fmt::format(
        "export_chunk: unknown chunk {:#x} (never created or already released)", chunk.value));
  }
  const Chunk& c = it->second;
  const Pool& pool = pools_[c.pool];
  if (pool.where.is_host()) {
    // As on CUDA, whose host chunks are no IPC memory: both backends share alike.
    throw NotSupported(
        fmt::format("export_chunk: chunk {:#x} lies in host memory; only device chunks are shared",
                    chunk.value));
  }
  // Re-exporting an imported chunk hands on the file it came from.
  const int source = c.imported ? c.imported->fd.get() : pool.fd.get();
  const int fd = ::fcntl(source, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw_errno("fcntl", errno, "cuMemExportToShareableHandle");
  return SharedChunk{fd, c.offset, c.bytes};
}

ChunkHandle SimBackend::do_import_chunk(Location where, const SharedChunk& shared) {
  // A forked child imports through a SimBackend of its own (this one's locks may be held).
  check_process("this simulated GPU's memory");
  const struct stat st = describe_shared(shared);
  std::lock_guard lock(mem_mutex_);
  std::shared_ptr<ImportedFile> file = imported_file(
      shared.fd, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino));
  const std::uint64_t id = next_chunk_++;
  // Counted in no pool's usage: this backend's capacity is what it created itself.
  chunks_.emplace(id,
                  Chunk{pool_index(where), shared.offset, shared.bytes, 0, false, std::move(file)});
  return ChunkHandle{id};
}

std::shared_ptr<SimBackend::ImportedFile> SimBackend::imported_file(int fd, std::uint64_t device,
                                                                    std::uint64_t inode) {
  std::weak_ptr<ImportedFile>& slot = imported_files_[{device, inode}];
  if (std::shared_ptr<ImportedFile> held = slot.lock()) return held;
  // The caller's descriptor stays the caller's: the chunks keep a duplicate.
  UniqueFd own{::fcntl(fd, F_DUPFD_CLOEXEC, 0)};
  if (own.get() < 0) {
    const int err = errno;
    imported_files_.erase({device, inode});
    throw_errno("fcntl", err, "cuMemImportFromShareableHandle");
  }
  auto file = std::make_shared<ImportedFile>(ImportedFile{std::move(own), device, inode});
  slot = file;
  return file;
}

void SimBackend::drop_import(std::shared_ptr<ImportedFile> file) {
  const std::pair key{file->device, file->inode};
  file.reset();  // closes the descriptor when this was its last chunk
  if (auto it = imported_files_.find(key); it != imported_files_.end() && it->second.expired()) {
    imported_files_.erase(it);
  }
}

}  // namespace salus::sim
