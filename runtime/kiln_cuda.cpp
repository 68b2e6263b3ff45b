// kiln_cuda.cpp: the CUDA driver API through dlopen, the model's cubins, and kernel launches.
#include "kiln_cuda.h"

#include <dlfcn.h>

#include <memory>
#include <mutex>
#include <vector>

namespace kiln {

[[noreturn]] void fail(const std::string& message);  // kiln_runtime.cpp: throws kiln::Error

namespace cuda {
namespace {

// The few driver types kiln uses, declared here so no cuda.h is needed to build a model.
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's own type
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
constexpr unsigned kStreamNonBlocking = 1;      // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 2;     // CU_EVENT_DISABLE_TIMING
constexpr int kCaptureModeThreadLocal = 1;      // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
constexpr int kCaptureModeRelaxed = 2;          // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr CUresult kCaptureImplicit = 906;      // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
constexpr int kMaxDynamicSharedBytes = 8;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
constexpr unsigned kDefaultSharedLimit = 48 * 1024;

struct Driver {
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  // CUDA graphs (kiln_replay.cpp)
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;  // NOLINT
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, int*) = nullptr;
};

// Note: looked up by the names cuda.h's macros expand to (cuMemcpyDtoHAsync_v2, ...): the bare
// names are the old 32-bit entry points.
template <class F>
void resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) fail(std::string("the CUDA driver lacks ") + name + "; update the NVIDIA driver");
}

const Driver& driver() {
  static const Driver loaded = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      fail(std::string("this model runs on a CUDA GPU, and the CUDA driver (libcuda.so.1) cannot be loaded: ") +
           dlerror() + "; run it on a machine with an NVIDIA GPU and driver, or compile it with --target cpu");
    Driver d;
    resolve(lib, d.cuInit, "cuInit");
    resolve(lib, d.cuDeviceGet, "cuDeviceGet");
    resolve(lib, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    resolve(lib, d.cuCtxGetCurrent, "cuCtxGetCurrent");
    resolve(lib, d.cuCtxSetCurrent, "cuCtxSetCurrent");
    resolve(lib, d.cuModuleLoadData, "cuModuleLoadData");
    resolve(lib, d.cuModuleUnload, "cuModuleUnload");
    resolve(lib, d.cuModuleGetFunction, "cuModuleGetFunction");
    resolve(lib, d.cuFuncSetAttribute, "cuFuncSetAttribute");
    resolve(lib, d.cuLaunchKernel, "cuLaunchKernel");
    resolve(lib, d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    resolve(lib, d.cuStreamSynchronize, "cuStreamSynchronize");
    resolve(lib, d.cuGetErrorString, "cuGetErrorString");
    resolve(lib, d.cuStreamCreate, "cuStreamCreate");
    resolve(lib, d.cuStreamDestroy, "cuStreamDestroy_v2");
    resolve(lib, d.cuEventCreate, "cuEventCreate");
    resolve(lib, d.cuEventDestroy, "cuEventDestroy_v2");
    resolve(lib, d.cuEventRecord, "cuEventRecord");
    resolve(lib, d.cuEventSynchronize, "cuEventSynchronize");
    resolve(lib, d.cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    resolve(lib, d.cuStreamWaitEvent, "cuStreamWaitEvent");
    resolve(lib, d.cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    resolve(lib, d.cuStreamEndCapture, "cuStreamEndCapture");
    resolve(lib, d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    resolve(lib, d.cuGraphLaunch, "cuGraphLaunch");
    resolve(lib, d.cuGraphExecDestroy, "cuGraphExecDestroy");
    resolve(lib, d.cuGraphDestroy, "cuGraphDestroy");
    resolve(lib, d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    resolve(lib, d.cuStreamIsCapturing, "cuStreamIsCapturing");
    return d;
  }();
  return loaded;
}

void check(CUresult r, const std::string& what) {
  if (r == 0) return;
  const char* text = nullptr;
  driver().cuGetErrorString(r, &text);
  fail(what + ": CUDA error " + std::to_string(r) + " (" + (text ? text : "unknown") + ")");
}

}  // namespace

struct Device {
  std::vector<CUmodule> modules;
  std::vector<CUfunction> functions;
  CUstream stream = nullptr;
  CUcontext context = nullptr;  // device 0's primary context, the one torch uses
  std::string broken;  // set by an error that leaves the CUDA context unusable
  // CUDA graphs: their instances, and an event that orders streams around a recording
  CUevent joined = nullptr;  // orders one stream behind another's work so far
  std::vector<CUgraphExec> graphs;
  // the end of the last run, and its stream: a run on another stream waits for it
  CUevent finished = nullptr;
  bool ran = false;
};

namespace {

// Note: these errors poison the whole CUDA context (every later call fails), so the model says
// it is unusable instead of failing in some unrelated place. Other errors (a launch out of
// resources, say) leave it usable.
bool sticky(CUresult r) { return r == 700 || r == 702 || (r >= 714 && r <= 719); }

void check_on(Device& device, CUresult r, const std::string& what) {
  if (r == 0) return;
  try {
    check(r, what);
  } catch (...) {
    if (sticky(r))
      device.broken = what + " left the GPU in an error state (CUDA error " + std::to_string(r) +
                      "); destroy this model and create it again in a new process";
    throw;
  }
}

void usable(const Device& device) {
  if (!device.broken.empty()) fail("this model is unusable: " + device.broken);
}

}  // namespace

Device* open(const Program& program) {
  const Driver& d = driver();
  check(d.cuInit(0), "initializing the CUDA driver");
  CUcontext ctx = nullptr;
  check(d.cuCtxGetCurrent(&ctx), "reading the current CUDA context");
  if (ctx == nullptr) {  // torch has not touched the GPU yet in this process: its primary context
    CUdevice dev = 0;
    check(d.cuDeviceGet(&dev, 0), "opening CUDA device 0");
    check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "retaining CUDA device 0's primary context");
    check(d.cuCtxSetCurrent(ctx), "making CUDA device 0's context current");
  }
  auto device = std::make_unique<Device>();
  device->context = ctx;
  for (size_t i = 0; i < program.num_kernels; ++i) {
    const CubinKernel& k = program.kernels[i];
    CUmodule module = nullptr;
    check(d.cuModuleLoadData(&module, k.image), std::string("loading kernel ") + k.name + "'s cubin");
    device->modules.push_back(module);
    CUfunction fn = nullptr;
    check(d.cuModuleGetFunction(&fn, module, k.function), std::string("finding kernel ") + k.name);
    if (k.shared > kDefaultSharedLimit)
      check(d.cuFuncSetAttribute(fn, kMaxDynamicSharedBytes, static_cast<int>(k.shared)),
            std::string("allowing kernel ") + k.name + " its shared memory");
    device->functions.push_back(fn);
  }
  return device.release();
}

void close(Device* device) {
  if (device == nullptr) return;
  const Driver& d = driver();
  for (CUgraphExec g : device->graphs) d.cuGraphExecDestroy(g);
  if (device->joined != nullptr) d.cuEventDestroy(device->joined);
  if (device->finished != nullptr) d.cuEventDestroy(device->finished);
  for (CUmodule m : device->modules) d.cuModuleUnload(m);
  delete device;
}

// Note: a context is current per thread, and a model may run on another thread than the one that
// created it: each run makes the model's context current before it launches anything.
void set_stream(Device& device, void* stream) {
  device.stream = static_cast<CUstream>(stream);
  check(driver().cuCtxSetCurrent(device.context), "making the model's CUDA context current");
}
void* stream(Device& device) { return device.stream; }

void launch(Device& device, size_t index, unsigned grid, void** args, size_t num_args) {
  usable(device);
  const CubinKernel& k = program.kernels[index];
  void* no_scratch = nullptr;  // global and profile scratch: kiln's kernels need none (checked at compile)
  constexpr size_t kMaxParams = 256;
  if (num_args + 2 > kMaxParams) fail(std::string("kernel ") + k.name + " takes too many arguments");
  void* params[kMaxParams];
  for (size_t i = 0; i < num_args; ++i) params[i] = args[i];
  params[num_args] = &no_scratch;
  params[num_args + 1] = &no_scratch;
  // Note: a fault inside a kernel surfaces at a later call unless CUDA_LAUNCH_BLOCKING=1, which
  // makes this call wait and report it with the kernel's name.
  check_on(device, driver().cuLaunchKernel(device.functions[index], grid, 1, 1, 32 * k.num_warps, 1, 1, k.shared,
                                           device.stream, params, nullptr),
           std::string("kernel ") + k.name);
}

void copy_to_host(Device& device, void* host, const void* src, size_t bytes) {
  usable(device);
  check_on(device, driver().cuMemcpyDtoHAsync(host, reinterpret_cast<CUdeviceptr>(src), bytes, device.stream),
           "copying a control-flow predicate to the host");
  check_on(device, driver().cuStreamSynchronize(device.stream), "the kernels before a control-flow predicate");
}

void check_usable(Device& device) { usable(device); }

bool capturing(Device& device, void* stream) {
  usable(device);
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  CUresult r = driver().cuStreamIsCapturing(static_cast<CUstream>(stream), &status);
  if (r == kCaptureImplicit)
    fail("this run is on the legacy default stream while another stream is being captured into a CUDA "
         "graph; run the model on a stream of its own (torch.cuda.stream, or kiln_model_run_on_stream)");
  return r == 0 && status != 0;  // a question: its failure is not the run's (a launch says more)
}

// Note: a model's buffers (arenas, staging, the graphs' inputs and outputs) are reused by its
// next run; one queued on another stream than the last must not start before the last ends.
// Every run waits (on the same stream the wait is already satisfied): a stream handle may be
// reused once its stream is destroyed, so comparing handles proves nothing.
void begin_run(Device& device) {
  if (!device.ran) return;  // (waiting on the same stream's event costs next to nothing)
  check_on(device, driver().cuStreamWaitEvent(device.stream, device.finished, 0), "ordering a run behind the last");
}

void end_run(Device& device) {
  const Driver& d = driver();
  if (device.finished == nullptr)
    check_on(device, d.cuEventCreate(&device.finished, kEventDisableTiming), "creating a CUDA event");
  check_on(device, d.cuEventRecord(device.finished, device.stream), "recording the end of a run");
  device.ran = true;
}

// Note: a model is often destroyed by a garbage collection, at any moment: perhaps while another
// thread captures a CUDA graph in global mode, where a synchronizing call would break that
// capture. Waiting on an event in relaxed mode is allowed then. The thread's context and mode
// are put back; an error has no one to tell, and the model goes anyway.
void finish(Device& device) {
  if (!device.ran || device.finished == nullptr) return;
  const Driver& d = driver();
  CUcontext before = nullptr;
  d.cuCtxGetCurrent(&before);
  d.cuCtxSetCurrent(device.context);
  int mode = kCaptureModeRelaxed;
  const bool exchanged = d.cuThreadExchangeStreamCaptureMode(&mode) == 0;
  d.cuEventSynchronize(device.finished);
  if (exchanged) d.cuThreadExchangeStreamCaptureMode(&mode);
  if (before != nullptr) d.cuCtxSetCurrent(before);
}

void copy_on_device(Device& device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_on(device, driver().cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                                              bytes, device.stream),
           "copying a model's input or output on the GPU");
}

// -- CUDA graphs -----------------------------------------------------------------------------

// Note: one capture stream for the process, never destroyed, recorded on by one model at a time
// (recording_lock). The calls a recording runs directly on it (matmuls) make torch keep a cuBLAS
// workspace for it, per thread, for as long as the process lives: a stream per model left one
// behind (tens of MB) at every model's destruction.
std::mutex& recording_lock() {
  static std::mutex lock;
  return lock;
}

void* capture_stream(Device& device) {
  const Driver& d = driver();
  static CUstream shared = nullptr;  // guarded by recording_lock()
  if (shared == nullptr) check_on(device, d.cuStreamCreate(&shared, kStreamNonBlocking), "creating the capture stream");
  if (device.joined == nullptr)
    check_on(device, d.cuEventCreate(&device.joined, kEventDisableTiming), "creating a CUDA event");
  return shared;
}

void wait_for(Device& device, void* waiting, void* on) {
  const Driver& d = driver();
  check_on(device, d.cuEventRecord(device.joined, static_cast<CUstream>(on)), "recording a CUDA event");
  check_on(device, d.cuStreamWaitEvent(static_cast<CUstream>(waiting), device.joined, 0),
           "ordering the capture stream with the caller's");
}

void begin_capture(Device& device) {
  usable(device);
  check_on(device, driver().cuStreamBeginCapture(device.stream, kCaptureModeThreadLocal), "beginning a CUDA graph capture");
}

size_t end_capture(Device& device) {
  const Driver& d = driver();
  CUgraph graph = nullptr;
  check_on(device, d.cuStreamEndCapture(device.stream, &graph), "ending a CUDA graph capture");
  CUgraphExec exec = nullptr;
  CUresult made = d.cuGraphInstantiateWithFlags(&exec, graph, 0);
  d.cuGraphDestroy(graph);  // the instance is independent of it
  check_on(device, made, "instantiating a CUDA graph");
  device.graphs.push_back(exec);
  return device.graphs.size() - 1;
}

void abandon_capture(Device& device) {
  CUgraph graph = nullptr;
  if (driver().cuStreamEndCapture(device.stream, &graph) == 0 && graph != nullptr) driver().cuGraphDestroy(graph);
}

void launch_graph(Device& device, size_t index) {
  usable(device);
  check_on(device, driver().cuGraphLaunch(device.graphs.at(index), device.stream), "replaying a CUDA graph");
}

void drop_graphs(Device& device) {
  driver().cuStreamSynchronize(device.stream);  // a graph launched on it may still run
  for (CUgraphExec g : device.graphs) driver().cuGraphExecDestroy(g);
  device.graphs.clear();
}

// Note: torch's CUDA shim lives in libtorch_cuda.so, which Python loads as a dependency of
// torch._C with RTLD_LOCAL: its symbols are not in the global scope dlsym(RTLD_DEFAULT) searches
// (they are where a C++ program links it). RTLD_NOLOAD finds the loaded library either way
// without loading anything.
namespace {
void* find_shim(const char* name) {
  static void* const torch_cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  void* fn = dlsym(RTLD_DEFAULT, name);
  if (fn == nullptr && torch_cuda != nullptr) fn = dlsym(torch_cuda, name);
  return fn;
}
}  // namespace

void* shim_function(const char* name) {
  void* fn = find_shim(name);
  if (fn == nullptr)
    fail(std::string("torch's CUDA library does not provide ") + name +
         " in this process; load a CUDA build of torch (import torch, or link libtorch_cuda) first");
  return fn;
}

namespace {
using StreamGuardCreate = AOTITorchError (*)(void*, int32_t, void**);
using StreamGuardDelete = AOTITorchError (*)(void*);
using CurrentStream = AOTITorchError (*)(int32_t, void**);
}  // namespace

StreamGuard::StreamGuard(void* stream, int32_t device_index) {
  static const auto create =
      reinterpret_cast<StreamGuardCreate>(shim_function("aoti_torch_create_cuda_stream_guard"));
  kiln::check(create(stream, device_index, &handle), "setting torch's CUDA stream");
}

StreamGuard::~StreamGuard() {
  static const auto remove =
      reinterpret_cast<StreamGuardDelete>(find_shim("aoti_torch_delete_cuda_stream_guard"));
  if (handle != nullptr && remove != nullptr) remove(handle);
}

void* torch_current_stream() {
  static const auto current = reinterpret_cast<CurrentStream>(shim_function("aoti_torch_get_current_cuda_stream"));
  void* s = nullptr;
  kiln::check(current(0, &s), "reading torch's current CUDA stream");
  return s;
}

}  // namespace cuda
}  // namespace kiln
