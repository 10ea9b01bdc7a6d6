// salusd's options, as its command line sets them (main.cpp): read by the coordinator and by
// the parts it composes (PageLedger, JobTurns), each for its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "remote/protocol.hpp"

namespace salus::daemon {

struct CoordinatorOptions {
  std::string policy = "fair";
  std::size_t process_limit_bytes = 0;  // pages one process may hold; 0: no limit
  // The most of each device the daemon hands out (a GPU it shares with programs that are not its
  // clients); 0: all of it.
  std::size_t device_limit_bytes = 0;
  // What each device keeps for everything that is not a page of the daemon: its clients' own CUDA
  // contexts (about 0.5 GiB each), lazily loaded kernels, libraries' buffers outside the
  // allocator, other programs. A device's capacity is its free memory when the daemon starts less
  // this, and at most device_limit_bytes.
  std::size_t reserve_bytes = 0;
  // A free page nobody took for this long goes back to the driver; zero: never.
  std::chrono::milliseconds idle_release{30000};
  // Whether a waiting process moves its jobs' pages to its host memory when another needs them.
  remote::Spill spill = remote::Spill::none;
  // How long a short request waits once no other process can give pages back (PageLedger::take):
  // none is inside a turn, none is leaving.
  std::chrono::milliseconds reclaim_wait{2000};
  // The most a short request waits, whatever the others do (a process stopped inside its turn).
  std::chrono::milliseconds short_wait_limit{60000};
  // Whether a short request asks the other processes for pages they cache. Off, a process keeps
  // what it was given until it gives it back itself or exits, as processes sharing a GPU without
  // Salus keep what their caching allocators reserved: the baseline the benchmarks compare with.
  bool reclaim = true;
  // A process that hung up holding pages may live on and still map them: its pages wait for its
  // exit, however long. For this long after it hung up, a short request counts them as coming
  // back (it waits); after it, the log says whose exit they wait for, and short requests go on
  // without them.
  std::chrono::milliseconds exit_wait{10000};
  // How long after a page came back behind a process's work (a fence) the daemon waits for that
  // work before it hands the page to another process; a page whose work has not completed by
  // then is withheld until it does, or its process exits. An iteration's end bounds the same
  // way the wait of the lane's next turns for its work (remote::Turn::fence_wait_ms).
  std::chrono::milliseconds fence_wait{10000};
};

}  // namespace salus::daemon
