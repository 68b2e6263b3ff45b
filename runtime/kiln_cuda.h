// kiln_cuda.h: the runtime's CUDA side (internal to kiln_runtime.cpp and kiln_cuda.cpp).
//
// Nothing here links against CUDA: the driver API (libcuda.so.1) is opened with dlopen when a
// cuda model is created, and torch's CUDA entry points (libtorch_cuda) are looked up with dlsym,
// so a cuda model.so builds and links on a machine with no GPU and no driver, and a missing
// driver is a clear error at kiln_model_create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln_runtime.h"

namespace kiln {
namespace cuda {

struct Device;  // the driver, the model's loaded cubins and the stream it runs on

// Loads the driver and every cubin of the program (cuModuleLoadData); throws kiln::Error.
Device* open(const Program& program);
// Unloads the cubins and frees the device (null: nothing).
void close(Device* device);

// The stream launches go to: the caller's (kiln_model_run_on_stream) or torch's current one.
void set_stream(Device& device, void* stream);
void* stream(Device& device);

// Launches kernel `index` of the program with `num_args` argument addresses (signature order);
// the two trailing scratch pointers Triton kernels take are appended here.
void launch(Device& device, size_t index, unsigned grid, void** args, size_t num_args);

// Throws if an earlier CUDA error left the model unusable.
void check_usable(Device& device);

// Copies `bytes` from device memory to the host on the device's stream and waits for them.
void copy_to_host(Device& device, void* host, const void* src, size_t bytes);

// torch's CUDA stream guard, so aten work (externs, copies) runs on the model's stream.
struct StreamGuard {
  StreamGuard(void* stream, int32_t device_index);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  void* handle = nullptr;
};

// torch's current CUDA stream on device 0.
void* torch_current_stream();

// A function of torch's CUDA shim (libtorch_cuda), found at run time; throws if torch has no CUDA.
void* shim_function(const char* name);

}  // namespace cuda
}  // namespace kiln
