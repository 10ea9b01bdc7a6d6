// SimMemory: sharing physical chunks between processes (export_chunk, import_chunk).
//
// A simulated device's memory is one memfd, so a chunk is shared as a duplicate of that memfd plus
// the chunk's offset in it: another process maps the same file pages, and bytes written on one
// side show on the other. The importer keeps one descriptor per distinct file however many chunks
// of it it imports (ImportedFiles), and releasing an imported chunk only lets go of it.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "cuda/sim_memory.hpp"
#include "salus/error.hpp"

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

SharedChunk SimMemory::export_chunk(ChunkHandle chunk) {
  std::lock_guard lock(mutex_);
  auto it = chunks_.find(chunk.value);
  if (it == chunks_.end() || it->second.released) {
    throw InvalidArgument(fmt::format(
        "export_chunk: unknown chunk {:#x} (never created or already released)", chunk.value));
  }
  const Chunk& c = it->second;
  const SimPool& pool = pools_[c.pool];
  if (pool.where().is_host()) {
    // As on CUDA, whose host chunks are no IPC memory: both backends share alike.
    throw NotSupported(
        fmt::format("export_chunk: chunk {:#x} lies in host memory; only device chunks are shared",
                    chunk.value));
  }
  // Re-exporting an imported chunk hands on the file it came from.
  const int source = c.imported ? c.imported->fd.get() : pool.fd();
  const int fd = ::fcntl(source, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw_errno("fcntl", errno, "cuMemExportToShareableHandle");
  return SharedChunk{fd, c.offset, c.bytes};
}

ChunkHandle SimMemory::import_chunk(Location where, const SharedChunk& shared) {
  const struct stat st = describe_shared(shared);
  std::lock_guard lock(mutex_);
  std::shared_ptr<ImportedFiles::File> file = imported_files_.hold(
      shared.fd, static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino));
  const std::uint64_t id = next_chunk_++;
  // Counted in no pool's usage: this backend's capacity is what it created itself.
  chunks_.emplace(id,
                  Chunk{pool_index(where), shared.offset, shared.bytes, 0, false, std::move(file)});
  return ChunkHandle{id};
}

}  // namespace salus::sim
