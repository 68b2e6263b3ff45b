// kiln_cuda.h: the runtime's CUDA side (internal to kiln_runtime.cpp and kiln_cuda.cpp).
//
// Nothing here links against CUDA: the driver API (libcuda.so.1) is opened with dlopen when a
// cuda model is created, and torch's CUDA entry points (libtorch_cuda) are looked up with dlsym,
// so a cuda model.so builds and links on a machine with no GPU and no driver, and a missing
// driver is a clear error at kiln_model_create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
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

// Whether `stream` is being captured into a CUDA graph (by the caller: torch.cuda.graph, say).
bool capturing(Device& device, void* stream);

// A run's start on the device's current stream (ordered behind the end of the last run, on
// whatever stream that ran) and its end (recorded for the next one). Under the model's lock.
void begin_run(Device& device);
void end_run(Device& device);
// Waits for the last run to finish on the GPU, before the model's memory goes; never throws.
void finish(Device& device);

// Copies `bytes` between two places of device memory on the device's stream.
void copy_on_device(Device& device, void* dst, const void* src, size_t bytes);

// CUDA graphs (kiln_replay.cpp). Capture happens on the process's capture stream (made on first
// use), held by one recording at a time (recording_lock); each ended capture is instantiated
// and kept by its index until the model is closed.
std::mutex& recording_lock();
void* capture_stream(Device& device);
// Makes stream `waiting` wait for the work queued on stream `on` so far.
void wait_for(Device& device, void* waiting, void* on);
// Begins capturing the device's current stream (set_stream), thread-locally: an unsafe CUDA call
// of this thread (a cudaMalloc) fails the capture instead of being recorded.
void begin_capture(Device& device);
// Ends the capture, instantiates it and returns its index.
size_t end_capture(Device& device);
// Ends a capture that failed, keeping nothing; never throws.
void abandon_capture(Device& device);
// Launches graph `index` on the device's current stream.
void launch_graph(Device& device, size_t index);
// Waits for the device's current stream, then destroys every graph.
void drop_graphs(Device& device);

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
