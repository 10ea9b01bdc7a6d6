// A runtime connected to salusd: its jobs take turns with the jobs of every other process
// connected to the same daemon, and its GPU pages come from that daemon. Allocation and free stay
// in this process.
#pragma once

#include <memory>
#include <string>

#include "salus/export.hpp"
#include "salus/runtime.hpp"

namespace salus {

// A runtime connected to the salusd at `socket_path` ("": $SALUS_SOCKET, else the per-user
// default), whose pages come from that daemon in batches. Every call has its in-process meaning;
// a daemon that is gone turns the next call that needs it into DeviceError. Throws DeviceError
// when the daemon cannot be reached or refuses the connection.
[[nodiscard]] SALUS_API std::shared_ptr<Runtime> connect_runtime(const std::string& socket_path = {});

}  // namespace salus
