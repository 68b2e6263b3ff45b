// kiln_runtime.h: what a generated wrapper (wrapper.cpp) is built on.
//
// Declarations only, and the shim's C headers: a wrapper compiles in a fraction of a second.
// The definitions, and the C API of kiln_model.h over the tables a wrapper defines, are in
// kiln_runtime.cpp, compiled once per compiler and torch version and linked into every model.
// Extern kernels (mm, addmm, convolution, attention) are called through torch's stable C shim.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "kiln_model.h"

namespace kiln {

constexpr int kMaxDims = 12;

enum class DType : int { B8, U8, I8, I16, I32, I64, F16, BF16, F32, F64, C64, C128 };

struct TensorSpec {
  const char* name;
  DType dtype;
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

// A Triton kernel of a cuda model: its cubin (linked into model.so) and how to launch it.
struct CubinKernel {
  const char* name;            // k12_red_native_layer_norm, for errors
  const unsigned char* image;  // the cubin
  const char* function;        // its entry point
  unsigned num_warps;
  unsigned shared;  // bytes of dynamic shared memory
};

struct Context;
using GraphFn = void (*)(Context&, void* const* args, void* const* results);

// An input or buffer the model mutates in forward(): the main graph computes its new value as
// a result after the outputs, which the runtime copies into the caller's input tensor or the
// model's own copy of the weight once the run is done.
struct Write {
  TensorSpec value;  // the result's layout
  int into_weight;   // 0: user input `target`; 1: weight `target`
  size_t target;
};

struct Program {
  const TensorSpec* inputs;  // user inputs, in order
  size_t num_inputs;
  const TensorSpec* weights;  // `name` is the weights-file entry; strides are contiguous
  size_t num_weights;
  const TensorSpec* outputs;
  size_t num_outputs;
  const size_t* arena_bytes;  // one arena per graph (main first, then every subgraph)
  size_t num_arenas;
  const size_t* scratch_bytes;  // staging for control flow (carried values, restrided operands)
  size_t num_scratch;
  size_t num_views;  // view slots: tensors for shim calls, kept while their memory stays put
  GraphFn main;  // args: inputs then weights; results: outputs, then the writes' values
  const char* target;
  const char* isa;  // the x86-64 level the kernels were compiled for: "x86-64" or "x86-64-v3"
  const CubinKernel* kernels;  // cuda: every kernel the graphs launch; cpu: none
  size_t num_kernels;
  const Write* writes;  // values the model writes into its inputs or buffers, as eager does
  size_t num_writes;
};

// Defined by the generated wrapper.
extern const Program program;

char* arena(Context& ctx, size_t index);
char* scratch(Context& ctx, size_t index);

inline char* at(void* base, int64_t offset, size_t itemsize) {
  return static_cast<char*>(base) + offset * static_cast<int64_t>(itemsize);
}

// Copies a strided n-d array into another layout of the same shape and dtype.
void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                  const int64_t* sizes, int ndim, size_t itemsize);

// Copies bytes between two buffers of the model (on the GPU for a cuda model).
void copy_bytes(void* dst, const void* src, size_t bytes);

bool truthy(const void* p, DType d);

// cuda: launches program.kernels[kernel] on the model's stream; `args` holds the address of each
// argument in the kernel's signature order (pointers, then xnumel and rnumel).
void launch(Context& ctx, size_t kernel, unsigned grid, void** args, size_t num_args);

// Throws (with `what` in the message) when a shim call failed.
void check(AOTITorchError err, const char* what);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(AtenTensorHandle h) : h_(h) {}
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Tensor& operator=(Tensor&& o) noexcept {
    reset();
    h_ = std::exchange(o.h_, nullptr);
    return *this;
  }
  ~Tensor() { reset(); }
  AtenTensorHandle get() const { return h_; }
  AtenTensorHandle release() { return std::exchange(h_, nullptr); }

 private:
  void reset() {
    if (h_ != nullptr) aoti_torch_delete_tensor_object(h_);
    h_ = nullptr;
  }
  AtenTensorHandle h_ = nullptr;
};

// A CPU tensor over memory kiln owns (arena, weights, user tensors); it frees nothing.
Tensor view(void* data, DType dtype, std::initializer_list<int64_t> sizes, std::initializer_list<int64_t> strides);

// The tensor of view slot `slot`, made again only when `data` moved (a new input tensor, say):
// views of the arena and the weights are made once per model, not once per call.
const Tensor& view(Context& ctx, size_t slot, void* data, DType dtype, std::initializer_list<int64_t> sizes,
                   std::initializer_list<int64_t> strides);

void mm(const Tensor& out, const Tensor& a, const Tensor& b, const char* what);
void bmm(const Tensor& out, const Tensor& a, const Tensor& b, const char* what);
void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b, double beta, double alpha,
           const char* what);
void baddbmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b, double beta, double alpha,
             const char* what);
void convolution(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                 std::initializer_list<int64_t> stride, std::initializer_list<int64_t> padding,
                 std::initializer_list<int64_t> dilation, bool transposed,
                 std::initializer_list<int64_t> output_padding, int64_t groups, const char* what);
// A GPU convolution with no bias, not transposed, where eager's would run on cuDNN: written
// into out by cudnn_convolution's .out overload, with eager's default cuDNN flags.
void cudnn_convolution(const Tensor& out, const Tensor& x, const Tensor& w, std::initializer_list<int64_t> stride,
                       std::initializer_list<int64_t> padding, std::initializer_list<int64_t> dilation,
                       int64_t groups, const char* what);
void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
               double dropout_p, bool is_causal, const double* scale, const char* what);

}  // namespace kiln
