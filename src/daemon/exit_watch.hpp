// What a hung-up process's pages wait for before they go to another process: its exit, and then
// no other process mapping them (a forked child of it may: daemon/mappings.hpp). One that hung up
// may live on with its mappings (and, on CUDA, work queued on them), so the wait has no fixed
// end; only stop() (the daemon is stopping: the pages go with it) ends every wait at once.
//
// Lock rule: none needed: its state is an eventfd (stop() writes it, the waits poll it) and what
// is fixed at construction; it calls only the kernel and the backend (export_chunk).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <vector>

#include "daemon/page_bank.hpp"
#include "remote/channel.hpp"
#include "salus/device.hpp"

namespace salus::daemon {

class ExitWatch {
 public:
  // `exit_wait`: after this long the log says whose exit the pages wait for.
  ExitWatch(std::shared_ptr<DeviceBackend> backend, std::chrono::milliseconds exit_wait);
  ExitWatch(const ExitWatch&) = delete;
  ExitWatch& operator=(const ExitWatch&) = delete;

  // Every wait, now and later, returns at once.
  void stop();
  // Returns once process `pid` (`pidfd`: held since its first record; empty: asked by pid) of
  // session `id` has exited, or stop() was called. The daemon's own process (a coordinator in a
  // test, whose clients' mappings are its own) has nothing to wait for.
  void wait_for_exit(SessionId id, pid_t pid, const remote::UniqueFd& pidfd) const;
  // Returns once no process maps a page of `chunks` (those session `id`, of pid `pid`, held), or
  // stop() was called.
  void wait_until_unmapped(SessionId id, pid_t pid, const std::vector<ChunkHandle>& chunks) const;

 private:
  const std::shared_ptr<DeviceBackend> backend_;
  const std::chrono::milliseconds exit_wait_;
  remote::UniqueFd stop_;  // an eventfd: stop() writes it, the waits poll it
};

}  // namespace salus::daemon
