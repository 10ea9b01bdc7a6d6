// The fake driver's shareable handles (see "Sharing chunks" at the top of fake_driver.hpp): every
// exported descriptor is an open of one memfd of the fake's, an exported allocation is stood for
// by one open description whose position is its serial, every export is a duplicate of that
// description, and an import finds the allocation again by the position. So descriptors travel as
// real ones do (dup, SCM_RIGHTS, fork), name their allocation, and all look like one file.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <string>

#include "support/fake_driver_state.hpp"

namespace salus::test {

namespace {

// A descriptor's file, as exports_ knows it; nullopt for no open descriptor.
std::optional<std::pair<std::uint64_t, std::uint64_t>> file_of(int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return std::nullopt;
  return std::pair{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

}  // namespace

CUresult FakeDriver::State::mem_export_to_shareable_handle(void* shareable,
                                                           CUmemGenericAllocationHandle handle,
                                                           CUmemAllocationHandleType type,
                                                           unsigned long long flags) {
  return run("cuMemExportToShareableHandle", {handle, static_cast<std::uint64_t>(type), flags},
             [&] {
               if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
               if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
                 return CUDA_ERROR_NOT_SUPPORTED;  // Windows or fabric handles: not modelled
               }
               const CUmemGenericAllocationHandle allocation = allocation_of(handle);
               if (allocation == 0) return CUDA_ERROR_INVALID_VALUE;
               Chunk& chunk = chunks_.at(allocation);
               // Only a handle type asked for at cuMemCreate can be exported.
               if (!chunk.exportable) return CUDA_ERROR_INVALID_VALUE;
               if (chunk.export_fd < 0) {
                 const int fd = open_export();
                 if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
                 const std::uint64_t serial = next_export_serial_++;
                 if (::lseek(fd, static_cast<off_t>(serial), SEEK_SET) < 0) {
                   ::close(fd);
                   return CUDA_ERROR_OUT_OF_MEMORY;
                 }
                 chunk.export_fd = fd;
                 chunk.export_serial = serial;
                 exports_[serial] = allocation;
               }
               const int fd = ::fcntl(chunk.export_fd, F_DUPFD_CLOEXEC, 0);
               if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
               *static_cast<int*>(shareable) = fd;
               return CUDA_SUCCESS;
             });
}

CUresult FakeDriver::State::mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle,
                                                             void* os_handle,
                                                             CUmemAllocationHandleType type) {
  // The descriptor travels in the pointer's bits, as with the driver.
  const auto fd = static_cast<int>(std::bit_cast<std::uintptr_t>(os_handle));
  return run("cuMemImportFromShareableHandle",
             {static_cast<std::uint64_t>(fd), static_cast<std::uint64_t>(type)}, [&] {
               if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
               if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
                 return CUDA_ERROR_NOT_SUPPORTED;
               }
               const auto id = file_of(fd);
               if (!id || export_file_ < 0 || *id != export_file_id_) {
                 return CUDA_ERROR_INVALID_VALUE;  // not one of ours
               }
               const off_t serial = ::lseek(fd, 0, SEEK_CUR);
               const auto found =
                   serial > 0 ? exports_.find(static_cast<std::uint64_t>(serial)) : exports_.end();
               if (found == exports_.end()) return CUDA_ERROR_INVALID_VALUE;
               const CUmemGenericAllocationHandle allocation = found->second;
               Chunk& chunk = chunks_.at(allocation);
               if (config_.import_returns_held_handle && !chunk.released()) {
                 ++chunk.references;
                 *handle = allocation;
                 return CUDA_SUCCESS;
               }
               *handle = next_handle_++;
               aliases_.emplace(*handle, allocation);
               ++chunk.imports;
               return CUDA_SUCCESS;
             });
}

// A new open description of the export file (made at the first export), or -1.
int FakeDriver::State::open_export() {
  if (export_file_ < 0) {
    const int fd = ::memfd_create("salus-fake-nvidiactl", MFD_CLOEXEC);
    const auto id = file_of(fd);
    if (!id) {
      if (fd >= 0) ::close(fd);
      return -1;
    }
    export_file_ = fd;
    export_file_id_ = *id;
  }
  // Opening the memfd again through /proc gives a description of its own (its own position),
  // of the same file.
  const std::string path = "/proc/self/fd/" + std::to_string(export_file_);
  return ::open(path.c_str(), O_RDWR | O_CLOEXEC);
}

void FakeDriver::State::forget_export(Chunk& chunk) {
  if (chunk.export_fd < 0) return;
  // Descriptors exported earlier stay open where they went, but name no allocation any more.
  exports_.erase(chunk.export_serial);
  ::close(chunk.export_fd);
  chunk.export_fd = -1;
}

}  // namespace salus::test
