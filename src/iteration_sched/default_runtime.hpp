// The process's one default Runtime, shared by Runtime::default_runtime() and the C ABI. The C
// ABI holds it by shared_ptr so that salus_default_runtime_shutdown can end it.
#pragma once

#include <memory>

#include "salus/runtime.hpp"

namespace salus {

// Made on first use (the CUDA backend where a GPU is present, else one simulated GPU).
std::shared_ptr<Runtime> default_runtime_shared();
// Throws InvalidArgument when the default exists already.
std::shared_ptr<Runtime> make_default_runtime(std::shared_ptr<DeviceBackend> backend,
                                              RuntimeOptions options);
// Ends the default's life as the default: the next use makes a new one. Returns the old one
// (null if none) so that the caller decides where it is destroyed.
std::shared_ptr<Runtime> take_default_runtime();

}  // namespace salus
