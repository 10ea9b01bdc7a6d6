// Sharing chunks on the CUDA backend, over the fake driver: which driver calls export_chunk and
// import_chunk make, what the backend refuses before the driver sees anything (devices without
// POSIX file descriptor handles, host chunks, a driver without the entry points, offsets), and
// the fake's own rules for shareable handles (fake_driver.hpp, "Sharing chunks"). What both
// backends share: contract/test_chunk_sharing_contract.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <string>

#include "cuda/cuda_backend.hpp"
#include "support/expect_throw.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using salus::test_support::expect_throw_with;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

DevicePtr map_rw(DeviceBackend& backend, ChunkHandle chunk) {
  const DevicePtr va = backend.reserve_address(kPage, 0);
  backend.map(va, kPage, chunk, 0);
  const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
  backend.set_access(va, kPage, grant);
  return va;
}

void unmap_free(DeviceBackend& backend, DevicePtr va) {
  backend.unmap(va, kPage);
  backend.free_address(va, kPage);
}

TEST(CudaSharingFake, ExportAndImportAskTheDriverForPosixDescriptors) {
  FakeDriver fake(FakeDriverConfig::uniform(2, 1 * GiB));
  cuda::CudaBackend backend(fake.api());
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(1), kPage);
  fake.clear_calls();
  const SharedChunk shared = backend.export_chunk(chunk);
  EXPECT_GE(shared.fd, 0);
  EXPECT_EQ(shared.offset, 0u);
  EXPECT_EQ(shared.bytes, kPage);
  const ChunkHandle imported = backend.import_chunk(Location::gpu(1), shared);
  EXPECT_NE(imported, chunk) << "the fake gives every import a handle of its own";
  EXPECT_GE(::fcntl(shared.fd, F_GETFD), 0) << "the caller's descriptor stays open";
  ::close(shared.fd);

  const auto exports = fake.calls("cuMemExportToShareableHandle");
  ASSERT_EQ(exports.size(), 1u);
  EXPECT_EQ(exports[0].args,
            (std::vector<std::uint64_t>{chunk.value, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0}));
  EXPECT_EQ(exports[0].context_device, 1) << "exported in the chunk's device's context";
  const auto imports = fake.calls("cuMemImportFromShareableHandle");
  ASSERT_EQ(imports.size(), 1u);
  EXPECT_EQ(imports[0].args.at(0), static_cast<std::uint64_t>(shared.fd));
  EXPECT_EQ(imports[0].args.at(1), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(imports[0].context_device, 1);

  // Both handles are one allocation: the fake maps them to cuMemCreate's handle.
  const DevicePtr a = map_rw(backend, chunk);
  const DevicePtr b = map_rw(backend, imported);
  EXPECT_EQ(fake.chunk_at(a)->handle, chunk.value);
  EXPECT_EQ(fake.chunk_at(b)->handle, chunk.value);
  fake.write_word(b + 64, 0xfeed);
  EXPECT_EQ(fake.read_word(a + 64), 0xfeedu);
  EXPECT_EQ(fake.used_bytes(Location::gpu(1)), kPage) << "one allocation, not two";
  backend.release_chunk(chunk);
  backend.release_chunk(imported);
  EXPECT_EQ(fake.live_chunks(), 0u);
  EXPECT_EQ(fake.used_bytes(Location::gpu(1)), kPage) << "still mapped";
  unmap_free(backend, a);
  unmap_free(backend, b);
  EXPECT_EQ(fake.used_bytes(Location::gpu(1)), 0u);
  EXPECT_EQ(fake.count("cuMemRelease"), 2u);
  EXPECT_TRUE(fake.violations().empty());
}

TEST(CudaSharingFake, RefusedBeforeTheDriverWhereNothingCanBeShared) {
  FakeDriverConfig config = FakeDriverConfig::uniform(2, 1 * GiB);
  config.devices[1].posix_fd = false;
  FakeDriver fake(config);
  cuda::CudaBackend backend(fake.api());
  const ChunkHandle plain = backend.create_chunk(Location::gpu(1), kPage);
  const ChunkHandle host = backend.create_chunk(Location::host(), kPage);
  fake.clear_calls();
  expect_throw_with<NotSupported>([&] { (void)backend.export_chunk(plain); }, "device 1");
  expect_throw_with<NotSupported>([&] { (void)backend.export_chunk(host); }, "host memory");
  // A descriptor shares one whole allocation: an offset into it means nothing to the driver.
  const SharedChunk offset{0, kPage, kPage};
  expect_throw_with<InvalidArgument>([&] { (void)backend.import_chunk(Location::gpu(0), offset); },
                                     "offset 0x200000");
  EXPECT_EQ(fake.count("cuMemExportToShareableHandle"), 0u);
  EXPECT_EQ(fake.count("cuMemImportFromShareableHandle"), 0u);
  backend.release_chunk(plain);
  backend.release_chunk(host);
}

TEST(CudaSharingFake, ADriverWithoutTheEntryPointsCannotShare) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  cuda::DriverApi api = fake.api();
  api.cuMemExportToShareableHandle = nullptr;
  api.cuMemImportFromShareableHandle = nullptr;
  cuda::CudaBackend backend(api);  // loads: sharing is all that is missing
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(0), kPage);
  expect_throw_with<NotSupported>([&] { (void)backend.export_chunk(chunk); },
                                  "cuMemExportToShareableHandle");
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  expect_throw_with<NotSupported>(
      [&] { (void)backend.import_chunk(Location::gpu(0), {fd, 0, kPage}); },
      "cuMemImportFromShareableHandle");
  ::close(fd);
  backend.release_chunk(chunk);
}

TEST(CudaSharingFake, ADescriptorOfNoExportIsTheDriversInvalidValue) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  cuda::CudaBackend backend(fake.api());
  const int fd = ::memfd_create("not-an-export", MFD_CLOEXEC);
  try {
    (void)backend.import_chunk(Location::gpu(0), {fd, 0, kPage});
    ADD_FAILURE() << "imported a descriptor nobody exported";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), "cuMemImportFromShareableHandle");
    EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_VALUE");
  }
  ::close(fd);
  // Nothing stays held, and sharing still works.
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(0), kPage);
  const SharedChunk shared = backend.export_chunk(chunk);
  backend.release_chunk(backend.import_chunk(Location::gpu(0), shared));
  ::close(shared.fd);
  backend.release_chunk(chunk);
  EXPECT_EQ(fake.live_chunks(), 0u);
}

// The driver does not promise a new handle per import; one it already gave comes back with one
// more reference, which the backend releases once per import.
TEST(CudaSharingFake, AHandleImportedAgainNeedsOneReleasePerImport) {
  FakeDriverConfig config = FakeDriverConfig::uniform(1, 1 * GiB);
  config.import_returns_held_handle = true;
  FakeDriver fake(config);
  cuda::CudaBackend backend(fake.api());
  const ChunkHandle chunk = backend.create_chunk(Location::gpu(0), kPage);
  const SharedChunk shared = backend.export_chunk(chunk);
  const ChunkHandle imported = backend.import_chunk(Location::gpu(0), shared);
  ::close(shared.fd);
  EXPECT_EQ(imported, chunk);
  backend.release_chunk(imported);
  const DevicePtr va = map_rw(backend, chunk);  // the creator's reference still holds
  backend.release_chunk(chunk);
  EXPECT_THROW(backend.release_chunk(chunk), InvalidArgument) << "both references are gone";
  unmap_free(backend, va);
  EXPECT_EQ(fake.count("cuMemRelease"), 2u);
  EXPECT_EQ(fake.live_chunks(), 0u);
  EXPECT_EQ(fake.used_bytes(Location::gpu(0)), 0u);
}

// --- the fake's own rules, straight through the table --------------------------------------------

class FakeDriverSharing : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(api_.cuInit(0), CUDA_SUCCESS); }
  CUmemGenericAllocationHandle create(int device, bool exportable) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
    if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle handle = 0;
    EXPECT_EQ(api_.cuMemCreate(&handle, kPage, &prop, 0), CUDA_SUCCESS);
    return handle;
  }
  CUresult export_fd(CUmemGenericAllocationHandle handle, int* fd) {
    return api_.cuMemExportToShareableHandle(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                             0);
  }
  CUresult import_fd(int fd, CUmemGenericAllocationHandle* handle) {
    return api_.cuMemImportFromShareableHandle(
        handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  }

  FakeDriver fake_{FakeDriverConfig::uniform(2, 1 * GiB)};
  cuda::DriverApi api_ = fake_.api();
};

TEST_F(FakeDriverSharing, OnlyAllocationsMadeExportableExport) {
  const CUmemGenericAllocationHandle plain = create(0, false);
  int fd = -1;
  EXPECT_EQ(export_fd(plain, &fd), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fd, -1);
  const CUmemGenericAllocationHandle shared = create(0, true);
  EXPECT_EQ(api_.cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_FABRIC, 0),
            CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(
      api_.cuMemExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
      CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(export_fd(0xbad, &fd), CUDA_ERROR_INVALID_VALUE);
  // Host allocations are no IPC memory: asking for a handle type is refused at creation.
  CUmemAllocationProp host{};
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location = {CU_MEM_LOCATION_TYPE_HOST, 0};
  host.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(api_.cuMemCreate(&handle, kPage, &host, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(api_.cuMemRelease(plain), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemRelease(shared), CUDA_SUCCESS);
}

TEST_F(FakeDriverSharing, DescriptorsNameTheirAllocationWhileItLives) {
  const CUmemGenericAllocationHandle handle = create(1, true);
  int fd = -1;
  ASSERT_EQ(export_fd(handle, &fd), CUDA_SUCCESS);
  // A duplicate (as SCM_RIGHTS or fork would make) names the same allocation.
  const int copy = ::dup(fd);
  CUmemGenericAllocationHandle a = 0;
  CUmemGenericAllocationHandle b = 0;
  ASSERT_EQ(import_fd(copy, &a), CUDA_SUCCESS);
  ASSERT_EQ(import_fd(fd, &b), CUDA_SUCCESS);
  EXPECT_NE(a, b);
  EXPECT_NE(a, handle);
  EXPECT_EQ(api_.cuMemRelease(handle), CUDA_SUCCESS);
  EXPECT_EQ(fake_.live_chunks(), 1u) << "the imports hold the allocation";
  EXPECT_EQ(api_.cuMemRelease(a), CUDA_SUCCESS);
  EXPECT_EQ(api_.cuMemRelease(a), CUDA_ERROR_INVALID_VALUE) << "released twice";
  EXPECT_EQ(api_.cuMemRelease(b), CUDA_SUCCESS);
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.used_bytes(Location::gpu(1)), 0u);
  // Gone: the descriptors exported earlier name nothing any more (see fake_driver.hpp).
  CUmemGenericAllocationHandle late = 0;
  EXPECT_EQ(import_fd(fd, &late), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(import_fd(-1, &late), CUDA_ERROR_INVALID_VALUE);
  ::close(copy);
  ::close(fd);
}

TEST_F(FakeDriverSharing, InjectedFailuresReachTheNewEntryPoints) {
  const CUmemGenericAllocationHandle handle = create(0, true);
  int fd = -1;
  fake_.fail_next("cuMemExportToShareableHandle", CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(export_fd(handle, &fd), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(fd, -1) << "a failed call does nothing";
  ASSERT_EQ(export_fd(handle, &fd), CUDA_SUCCESS);
  CUmemGenericAllocationHandle imported = 0;
  fake_.fail_next("cuMemImportFromShareableHandle", CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(import_fd(fd, &imported), CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(fake_.live_chunks(), 1u);
  ::close(fd);
  EXPECT_EQ(api_.cuMemRelease(handle), CUDA_SUCCESS);
}

// --- interprocess events -------------------------------------------------------------------------

// One fake plays the exporter and the importer (ipc_open_own_events).
FakeDriverConfig two_processes(int devices) {
  FakeDriverConfig config = FakeDriverConfig::uniform(devices, 1 * GiB);
  config.ipc_open_own_events = true;
  return config;
}

TEST(CudaSharingFake, ShareableEventsAreInterprocessEventsOfTheDriver) {
  FakeDriver fake(two_processes(2));
  cuda::CudaBackend backend(fake.api());
  fake.clear_calls();
  const EventHandle made = backend.create_shareable_event(1);
  const auto creates = fake.calls("cuEventCreate");
  ASSERT_EQ(creates.size(), 1u);
  EXPECT_EQ(creates[0].args.at(0),
            static_cast<std::uint64_t>(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
  EXPECT_EQ(creates[0].context_device, 1);
  const SharedEvent shared = backend.export_event(made);
  EXPECT_EQ(shared.fd, -1) << "a CUDA event travels as bytes";
  EXPECT_EQ(fake.count("cuIpcGetEventHandle"), 1u);
  const EventHandle opened = backend.import_event(1, shared);
  EXPECT_NE(opened, made);
  const auto opens = fake.calls("cuIpcOpenEventHandle");
  ASSERT_EQ(opens.size(), 1u);
  EXPECT_EQ(opens[0].context_device, 1);
  backend.destroy_event(opened);
  backend.destroy_event(made);
  EXPECT_EQ(fake.live_events(), 0u);
}

TEST(CudaSharingFake, ADriverWithoutInterprocessEventsSaysNotSupported) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  cuda::DriverApi api = fake.api();
  api.cuIpcGetEventHandle = nullptr;
  api.cuIpcOpenEventHandle = nullptr;
  cuda::CudaBackend backend(api);
  expect_throw_with<NotSupported>([&] { (void)backend.create_shareable_event(0); },
                                  "no interprocess events");
  expect_throw_with<NotSupported>([&] { (void)backend.import_event(0, SharedEvent{}); },
                                  "no interprocess events");
}

// A device without interprocess events (CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED 0) says so before
// the driver is asked for one; salusd's clients then wait for their work on the host.
TEST(CudaSharingFake, ADeviceWithoutInterprocessEventsSaysNotSupported) {
  FakeDriverConfig config = FakeDriverConfig::uniform(2, 1 * GiB);
  config.devices[1].ipc_events = false;
  FakeDriver fake(config);
  cuda::CudaBackend backend(fake.api());
  fake.clear_calls();
  expect_throw_with<NotSupported>([&] { (void)backend.create_shareable_event(1); },
                                  "device 1 has no interprocess events");
  expect_throw_with<NotSupported>([&] { (void)backend.import_event(1, SharedEvent{}); },
                                  "IPC_EVENT_SUPPORTED");
  EXPECT_EQ(fake.count("cuEventCreate"), 0u);
  const EventHandle fine = backend.create_shareable_event(0);
  backend.destroy_event(fine);
}

// Two processes' mappings of one page (two handles of one allocation): the second's work must
// wait for the first's interprocess event, or the fake records a page used before its fence.
TEST(CudaSharingFake, APageUsedBeforeItsInterprocessFenceIsAViolation) {
  for (const bool wait : {false, true}) {
    SCOPED_TRACE(wait ? "waiting for the fence" : "not waiting");
    FakeDriver fake(two_processes(1));
    cuda::CudaBackend backend(fake.api());
    const ChunkHandle chunk = backend.create_chunk(Location::gpu(0), kPage);
    const SharedChunk exported = backend.export_chunk(chunk);
    const ChunkHandle theirs = backend.import_chunk(Location::gpu(0), exported);
    ::close(exported.fd);
    const DevicePtr a = map_rw(backend, chunk);
    const DevicePtr b = map_rw(backend, theirs);
    const StreamHandle sa = backend.create_stream(0, 0);
    const StreamHandle sb = backend.create_stream(0, 0);
    const std::uint64_t giver = fake.enqueue_work(sa, a, kPage);
    const EventHandle made = backend.create_shareable_event(0);
    backend.record_event(made, sa);
    const EventHandle opened = backend.import_event(0, backend.export_event(made));
    if (wait) backend.stream_wait_event(sb, opened, 0);
    (void)fake.enqueue_work(sb, b, kPage);
    const auto violations = fake.violations();
    if (wait) {
      EXPECT_TRUE(violations.empty()) << violations.front();
      EXPECT_FALSE(fake.work_finished(giver));
    } else {
      ASSERT_EQ(violations.size(), 1u);
      EXPECT_NE(violations[0].find("before its interprocess fence"), std::string::npos)
          << violations[0];
    }
    fake.clear_violations();
    fake.finish_all_work();
    backend.destroy_event(opened);
    backend.destroy_event(made);
    backend.destroy_stream(sa);
    backend.destroy_stream(sb);
    unmap_free(backend, a);
    unmap_free(backend, b);
    backend.release_chunk(theirs);
    backend.release_chunk(chunk);
  }
}

// CUDA refuses to open an event in the process that exported it (cuda.h: cuIpcOpenEventHandle,
// CUDA_ERROR_INVALID_CONTEXT), and so does the fake: one FakeDriver is one process.
TEST(CudaSharingFake, AnEventIsNotOpenedInTheProcessThatExportedIt) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  cuda::CudaBackend backend(fake.api());
  const EventHandle made = backend.create_shareable_event(0);
  const SharedEvent shared = backend.export_event(made);
  try {
    (void)backend.import_event(0, shared);
    FAIL() << "the exporter opened its own event";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), "cuIpcOpenEventHandle");
    EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_CONTEXT") << e.what();
  }
  backend.destroy_event(made);
  EXPECT_EQ(fake.live_events(), 0u);
}

// The driver reuses a destroyed event's handle: an interprocess handle kept past its event names
// nothing, or another event. Opening it then, or using an event opened before the source was
// destroyed, is undefined with CUDA; the fake refuses the open and records both as violations.
TEST(CudaSharingFake, AHandleKeptPastItsEventsDestructionIsAViolation) {
  FakeDriver fake(two_processes(1));
  cuda::CudaBackend backend(fake.api());
  const StreamHandle stream = backend.create_stream(0, 0);
  const EventHandle first = backend.create_shareable_event(0);
  const SharedEvent stale = backend.export_event(first);
  const EventHandle opened = backend.import_event(0, stale);
  backend.destroy_event(first);
  backend.stream_wait_event(stream, opened, 0);  // the opened event outlived its source
  auto violations = fake.violations();
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_NE(violations[0].find("after its source event was destroyed"), std::string::npos)
      << violations[0];
  fake.clear_violations();

  const EventHandle second = backend.create_shareable_event(0);
  EXPECT_EQ(second, first) << "the driver gave the destroyed event's handle to the next one";
  expect_throw_with<DeviceError>([&] { (void)backend.import_event(0, stale); },
                                 "CUDA_ERROR_INVALID_VALUE");
  violations = fake.violations();
  ASSERT_EQ(violations.size(), 1u);
  EXPECT_NE(violations[0].find("whose event was destroyed"), std::string::npos) << violations[0];
  fake.clear_violations();
  backend.destroy_event(second);
  backend.destroy_event(opened);
  backend.destroy_stream(stream);
}

}  // namespace
}  // namespace salus
