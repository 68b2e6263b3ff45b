// kiln_runtime.cpp: the definitions behind kiln_runtime.h and the C API of kiln_model.h.
//
// Compiled once per compiler and torch version (the link stage caches the object) and linked
// into every model.so; it reads the tables the generated wrapper defines (kiln::program).
#include "kiln_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln_cpu.h"
#include "kiln_cuda.h"
#include "kiln_fallback.h"
#include "kiln_replay.h"
#include "kiln_safetensors.h"
#include "kiln_verify.h"
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>

namespace kiln {

constexpr size_t kAlign = 64;

struct Error : std::runtime_error {
  int status;
  Error(int code, const std::string& what) : std::runtime_error(what), status(code) {}
};

[[noreturn]] void fail(const std::string& message) { throw Error(KILN_FAILED, message); }

// A cuda model keeps its arenas, weights and staging on the GPU, and calls torch's CUDA kernels.
bool on_gpu() {
  static const bool gpu = program.num_kernels > 0 || std::string(program.target) == "cuda";
  return gpu;
}
int32_t device_type() { return on_gpu() ? aoti_torch_device_type_cuda() : aoti_torch_device_type_cpu(); }

// The GPU state of the model that runs on this thread (its stream, for predicates).
thread_local cuda::Device* running_device = nullptr;

// Note: weak, since torch builds before 2.10 do not export it; without it the message says less.
extern "C" const char* torch_exception_get_what_without_backtrace() __attribute__((weak));

void check(AOTITorchError err, const char* what) {
  if (err == AOTI_TORCH_SUCCESS) return;
  const char* why = torch_exception_get_what_without_backtrace ? torch_exception_get_what_without_backtrace() : nullptr;
  throw Error(KILN_FAILED, std::string(what) + " failed in torch: " + (why && *why ? why : "(no message)"));
}

namespace {

struct DTypeInfo {
  const char* torch_name;
  const char* safetensors_name;
  size_t itemsize;
};

const DTypeInfo& info(DType d) {
  static const DTypeInfo table[] = {
      {"bool", "BOOL", 1},   {"uint8", "U8", 1},   {"int8", "I8", 1},      {"int16", "I16", 2},
      {"int32", "I32", 4},   {"int64", "I64", 8},  {"float16", "F16", 2},  {"bfloat16", "BF16", 2},
      {"float32", "F32", 4}, {"float64", "F64", 8}, {"complex64", "C64", 8}, {"complex128", "C128", 16},
  };
  return table[static_cast<int>(d)];
}

int32_t aoti_dtype(DType d) {
  switch (d) {
    case DType::B8: return aoti_torch_dtype_bool();
    case DType::U8: return aoti_torch_dtype_uint8();
    case DType::I8: return aoti_torch_dtype_int8();
    case DType::I16: return aoti_torch_dtype_int16();
    case DType::I32: return aoti_torch_dtype_int32();
    case DType::I64: return aoti_torch_dtype_int64();
    case DType::F16: return aoti_torch_dtype_float16();
    case DType::BF16: return aoti_torch_dtype_bfloat16();
    case DType::F32: return aoti_torch_dtype_float32();
    case DType::F64: return aoti_torch_dtype_float64();
    case DType::C64: return aoti_torch_dtype_complex64();
    case DType::C128: return aoti_torch_dtype_complex128();
  }
  return -1;
}

void row_major_strides(const TensorSpec& s, int64_t* strides) {
  int64_t step = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    strides[d] = s.sizes[d] == 1 ? s.strides[d] : step;  // a size-1 dim's stride is no one's business
    step *= s.sizes[d];
  }
}

size_t nbytes(const TensorSpec& s) {
  size_t span = 1;
  for (int d = 0; d < s.ndim; ++d) {
    if (s.sizes[d] == 0) return 0;
    span += static_cast<size_t>((s.sizes[d] - 1) * s.strides[d]);
  }
  return span * info(s.dtype).itemsize;
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using Block = std::unique_ptr<char, FreeDeleter>;

Block allocate(size_t bytes) {
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  char* p = static_cast<char*>(std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded));
  if (p == nullptr) throw Error(KILN_FAILED, "out of memory allocating " + std::to_string(bytes) + " bytes");
  return Block(p);
}

}  // namespace

// -- memory ----------------------------------------------------------------------------------

void copy_on_gpu(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                 const int64_t* sizes, int ndim, size_t itemsize);

void copy_on_host(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                  const int64_t* sizes, int ndim, size_t itemsize);

void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                         const int64_t* sizes, int ndim, size_t itemsize) {
  if (on_gpu()) return copy_on_gpu(dst, dst_strides, src, src_strides, sizes, ndim, itemsize);
  copy_on_host(dst, dst_strides, src, src_strides, sizes, ndim, itemsize);
}

void copy_on_host(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                  const int64_t* sizes, int ndim, size_t itemsize) {
  if (ndim == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  for (int d = 0; d < ndim; ++d)
    if (sizes[d] == 0) return;
  if (ndim == 1 && dst_strides[0] == 1 && src_strides[0] == 1) {
    std::memcpy(dst, src, static_cast<size_t>(sizes[0]) * itemsize);
    return;
  }
  for (int64_t i = 0; i < sizes[0]; ++i) {
    copy_on_host(static_cast<char*>(dst) + i * dst_strides[0] * static_cast<int64_t>(itemsize), dst_strides + 1,
                 static_cast<const char*>(src) + i * src_strides[0] * static_cast<int64_t>(itemsize),
                 src_strides + 1, sizes + 1, ndim - 1, itemsize);
  }
}

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (!on_gpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const int64_t size = static_cast<int64_t>(bytes), stride = 1;
  copy_on_gpu(dst, &stride, src, &stride, &size, 1, 1);
}

bool truthy(const void* p, DType d) {
  uint64_t host = 0;  // on the GPU: the predicate's one element, copied once per decision
  if (on_gpu()) {
    replayed(false, "a control-flow predicate");
    cuda::copy_to_host(*running_device, &host, p, info(d).itemsize);
    p = &host;
  }
  switch (d) {
    case DType::B8: return *static_cast<const bool*>(p);
    case DType::U8: return *static_cast<const uint8_t*>(p) != 0;
    case DType::I8: return *static_cast<const int8_t*>(p) != 0;
    case DType::I16: return *static_cast<const int16_t*>(p) != 0;
    case DType::I32: return *static_cast<const int32_t*>(p) != 0;
    case DType::I64: return *static_cast<const int64_t*>(p) != 0;
    case DType::F16: return half_to_float(*static_cast<const uint16_t*>(p)) != 0.0f;
    case DType::BF16: return bf16_to_float(*static_cast<const uint16_t*>(p)) != 0.0f;
    case DType::F32: return *static_cast<const float*>(p) != 0.0f;
    case DType::F64: return *static_cast<const double*>(p) != 0.0;
  }
  return false;
}

// -- tensors for the shim --------------------------------------------------------------------

// A CPU tensor over memory kiln owns (arena, weights, user tensors); it frees nothing.
Tensor view(void* data, DType dtype, std::initializer_list<int64_t> sizes,
                   std::initializer_list<int64_t> strides) {
  AtenTensorHandle h = nullptr;
  check(aoti_torch_create_tensor_from_blob(data, static_cast<int64_t>(sizes.size()), sizes.begin(),
                                           strides.begin(), 0, aoti_dtype(dtype), device_type(), 0, &h),
        "creating a tensor view");
  return Tensor(h);
}

// -- extern kernels --------------------------------------------------------------------------

// torch's CUDA shim function `fn` by name, looked up in the process (libtorch_cuda is not linked:
// a cuda model must link on a machine whose torch has no CUDA).
// (looked up once per call site, on first use).
#define gpu_fn(fn) \
  ([] { static const auto found = reinterpret_cast<decltype(&fn)>(cuda::shim_function(#fn)); return found; }())

// Note: a call into torch joins a CUDA graph only where the host set a pool hook (replayed_torch;
// kiln_replay.h): its allocations and cuBLAS's workspace must stay the model's while the graph lives.
void mm(const Tensor& out, const Tensor& a, const Tensor& b, const char* what) {
  if (on_gpu()) {
    if (replayed_torch("mm")) return;
    return check(gpu_fn(aoti_torch_cuda_mm_out)(out.get(), a.get(), b.get()), what);
  }
  check(aoti_torch_cpu_mm_out(out.get(), a.get(), b.get()), what);
}

void bmm(const Tensor& out, const Tensor& a, const Tensor& b, const char* what) {
  if (on_gpu()) {
    if (replayed_torch("bmm")) return;
    return check(gpu_fn(aoti_torch_cuda_bmm_out)(out.get(), a.get(), b.get()), what);
  }
  check(aoti_torch_cpu_bmm_out(out.get(), a.get(), b.get()), what);
}

void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b, double beta, double alpha,
                  const char* what) {
  if (on_gpu()) {
    if (replayed_torch("addmm")) return;
    return check(gpu_fn(aoti_torch_cuda_addmm_out)(out.get(), bias.get(), a.get(), b.get(), beta, alpha), what);
  }
  check(aoti_torch_cpu_addmm_out(out.get(), bias.get(), a.get(), b.get(), beta, alpha), what);
}

void baddbmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b, double beta,
                    double alpha, const char* what) {
  if (on_gpu()) {
    if (replayed_torch("baddbmm")) return;
    return check(gpu_fn(aoti_torch_cuda_baddbmm_out)(out.get(), bias.get(), a.get(), b.get(), beta, alpha), what);
  }
  check(aoti_torch_cpu_baddbmm_out(out.get(), bias.get(), a.get(), b.get(), beta, alpha), what);
}

// Copies a result torch allocated into the buffer kiln planned for it, then frees the result.
void take(const Tensor& out, Tensor result, const char* what) {
  check(aoti_torch_copy_(out.get(), result.get(), 0), what);
}

void convolution(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor* bias,
                        std::initializer_list<int64_t> stride, std::initializer_list<int64_t> padding,
                        std::initializer_list<int64_t> dilation, bool transposed,
                        std::initializer_list<int64_t> output_padding, int64_t groups, const char* what) {
  if (on_gpu() && replayed_torch("convolution")) return;
  AtenTensorHandle b = bias != nullptr ? bias->get() : nullptr;
  AtenTensorHandle ret = nullptr;
  auto conv = on_gpu() ? gpu_fn(aoti_torch_cuda_convolution) : aoti_torch_cpu_convolution;
  check(conv(x.get(), w.get(), bias != nullptr ? &b : nullptr, stride.begin(),
                                   static_cast<int64_t>(stride.size()), padding.begin(),
                                   static_cast<int64_t>(padding.size()), dilation.begin(),
                                   static_cast<int64_t>(dilation.size()), transposed ? 1 : 0,
                                   output_padding.begin(), static_cast<int64_t>(output_padding.size()), groups,
                                   &ret),
        what);
  take(out, Tensor(ret), what);
}

// Note: through the dispatcher, as a fallback op is called (kiln_fallback.h), since the shim
// has no cudnn_convolution; but captured as the other calls into torch are, where the run's
// replay has a pool hook (`replayed_torch`), not run directly as a fallback is. The flags are
// eager's defaults (benchmark off, deterministic off, TF32 allowed: read by cuDNN for float32
// only, which lowering keeps on at::convolution).
void cudnn_convolution(const Tensor& out, const Tensor& x, const Tensor& w, std::initializer_list<int64_t> stride,
                       std::initializer_list<int64_t> padding, std::initializer_list<int64_t> dilation,
                       int64_t groups, const char* what) {
  if (replayed_torch("convolution")) return;
  FallbackCall call("aten::cudnn_convolution", "out", what);
  call.replay_decided();
  call.push_tensor(x.get());
  call.push_tensor(w.get());
  call.push_int_list(padding);
  call.push_int_list(stride);
  call.push_int_list(dilation);
  call.push_int(groups);
  call.push_bool(false);
  call.push_bool(false);
  call.push_bool(true);
  call.push_tensor(out.get());
  call.run({Ret::kTensor});  // the out tensor itself, which the call's end lets go of
}

// Note: attention runs torch's own kernels through the shim, each taking an additive float
// mask (lowering turns a boolean one into that): on the GPU the memory-efficient kernel (its
// logsumexp and RNG state results are freed unread), on the CPU the flash kernel eager picks
// for these inputs (its logsumexp freed unread).
namespace {

struct Shape {
  int64_t ndim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
};

Shape shape_of(const Tensor& t, const char* what) {
  Shape s;
  check(aoti_torch_get_dim(t.get(), &s.ndim), what);
  check(aoti_torch_get_sizes(t.get(), &s.sizes), what);
  check(aoti_torch_get_strides(t.get(), &s.strides), what);
  return s;
}

constexpr int64_t kBiasAlignment = 16;  // elements: what every dtype of the GPU kernel accepts

// Note: torch's memory-efficient attention kernel takes its bias ([B, H, M, N], last dim
// contiguous, other strides a multiple of its alignment) the way scaled_dot_product_attention
// hands it over: broadcast to [B, H, M, N] (stride 0 where the mask has a 1), and padded on the
// last dim when its rows are not aligned. This does the same to kiln's mask.
Tensor attention_bias(const Tensor& mask, const Tensor& q, const Tensor& k, const char* what) {
  Shape m = shape_of(mask, what), qs = shape_of(q, what), ks = shape_of(k, what);
  if (m.ndim > 4 || qs.ndim != 4 || ks.ndim != 4)
    fail(std::string(what) + ": attention on the GPU takes 4-d query, key and mask (at most 4-d)");
  const int64_t want[4] = {qs.sizes[0], qs.sizes[1], qs.sizes[2], ks.sizes[2]};
  Tensor source;
  const Tensor* from = &mask;
  bool aligned = m.ndim >= 1 && m.strides[m.ndim - 1] == 1;
  for (int64_t d = 0; d + 1 < m.ndim; ++d) aligned &= m.sizes[d] == 1 || m.strides[d] % kBiasAlignment == 0;
  if (!aligned) {  // a contiguous copy whose rows are padded to the alignment
    std::vector<int64_t> strides(static_cast<size_t>(m.ndim));
    int64_t acc = 1;
    for (int64_t d = m.ndim - 1; d >= 0; --d) {
      strides[static_cast<size_t>(d)] = acc;
      acc *= d == m.ndim - 1 ? (m.sizes[d] + kBiasAlignment - 1) / kBiasAlignment * kBiasAlignment : m.sizes[d];
    }
    int32_t dtype = 0;
    check(aoti_torch_get_dtype(mask.get(), &dtype), what);
    AtenTensorHandle h = nullptr;
    check(aoti_torch_empty_strided(m.ndim, m.sizes, strides.data(), dtype, aoti_torch_device_type_cuda(), 0, &h), what);
    source = Tensor(h);
    check(aoti_torch_copy_(source.get(), mask.get(), 0), what);
    from = &source;
    m = shape_of(source, what);
  }
  int64_t sizes[4], strides[4];
  for (int64_t d = 0; d < 4; ++d) {
    int64_t md = d - (4 - m.ndim);  // the mask's dim, aligned from the right
    bool real = md >= 0 && m.sizes[md] != 1;
    sizes[d] = want[d];
    strides[d] = real ? m.strides[md] : 0;
  }
  AtenTensorHandle expanded = nullptr;
  check(aoti_torch__reinterpret_tensor(from->get(), 4, sizes, strides, 0, &expanded), what);
  return Tensor(expanded);
}

}  // namespace

void attention_on_gpu(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
                      double dropout_p, bool is_causal, const double* scale, const char* what) {
  if (replayed_torch("attention")) return;
  Tensor bias;
  if (mask != nullptr) bias = attention_bias(*mask, q, k, what);
  AtenTensorHandle m = mask != nullptr ? bias.get() : nullptr;
  AtenTensorHandle ret[4] = {nullptr, nullptr, nullptr, nullptr};
  double s = scale != nullptr ? *scale : 0.0;
  check(gpu_fn(aoti_torch_cuda__scaled_dot_product_efficient_attention)(
            q.get(), k.get(), v.get(), mask != nullptr ? &m : nullptr, 0, dropout_p, is_causal ? 1 : 0,
            scale != nullptr ? &s : nullptr, &ret[0], &ret[1], &ret[2], &ret[3]),
        what);
  Tensor lse(ret[1]), seed(ret[2]), offset(ret[3]);
  take(out, Tensor(ret[0]), what);
}

void attention(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
                      double dropout_p, bool is_causal, const double* scale, const char* what) {
  if (on_gpu()) return attention_on_gpu(out, q, k, v, mask, dropout_p, is_causal, scale, what);
  AtenTensorHandle m = mask != nullptr ? mask->get() : nullptr;
  AtenTensorHandle ret0 = nullptr;
  AtenTensorHandle ret1 = nullptr;
  double s = scale != nullptr ? *scale : 0.0;
  check(aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(q.get(), k.get(), v.get(), dropout_p,
                                                                    is_causal ? 1 : 0, mask != nullptr ? &m : nullptr,
                                                                    scale != nullptr ? &s : nullptr, &ret0, &ret1),
        what);
  Tensor lse(ret1);
  take(out, Tensor(ret0), what);
}

// -- a model instance ------------------------------------------------------------------------

struct Context {
  SafetensorsFile weights_file;
  std::vector<void*> weights;  // per program.weights entry: into the mapping, or an aligned copy
  std::vector<Block> owned;    // the copies, arenas and scratch
  std::vector<char*> arenas;
  std::vector<char*> scratch_blocks;
  std::vector<Block> input_staging;  // per input: where an input with other strides is copied
  std::vector<std::pair<void*, Tensor>> views;  // per view slot: the data it was made for
  std::mutex running;
  // cuda: the driver's view of the model (its cubins), and GPU memory held as torch tensors.
  struct CloseDevice {
    void operator()(cuda::Device* d) const { cuda::close(d); }
  };
  PoolHook pool;  // before gpu: destroyed after it (and its graphs), it releases the pool last
  std::unique_ptr<cuda::Device, CloseDevice> gpu;
  std::vector<Tensor> gpu_blocks;  // weights, arenas, scratch and input staging on the GPU
  std::vector<char*> gpu_staging;  // per input, or null until needed
  std::vector<void*> write_blocks;  // per program.writes entry: where the main graph leaves its value
  Replay replay;  // cuda: the model's launches as CUDA graphs (kiln_replay.h), using `pool`
  std::vector<char*> graph_outputs;  // per output: where the graphs write it (made on the first run)
};

void launch(Context& ctx, size_t kernel, unsigned grid, void** args, size_t num_args) {
  if (replayed(true, "kernel")) return;
  cuda::launch(*ctx.gpu, kernel, grid, args, num_args);
}

// A tensor on the GPU (allocated by torch's caching allocator) that the model keeps.
char* gpu_alloc(Context& ctx, const TensorSpec* like, size_t bytes) {
  AtenTensorHandle h = nullptr;
  int64_t n = static_cast<int64_t>(bytes == 0 ? 1 : bytes), one = 1;
  if (like != nullptr)
    check(aoti_torch_empty_strided(like->ndim, like->sizes, like->strides, aoti_dtype(like->dtype),
                                   aoti_torch_device_type_cuda(), 0, &h),
          "allocating GPU memory");
  else
    check(aoti_torch_empty_strided(1, &n, &one, aoti_torch_dtype_uint8(), aoti_torch_device_type_cuda(), 0, &h),
          "allocating GPU memory");
  ctx.gpu_blocks.emplace_back(h);
  void* data = nullptr;
  check(aoti_torch_get_data_ptr(h, &data), "reading GPU memory's address");
  return static_cast<char*>(data);
}

// Copies a weight from the host (its mapping) into a GPU tensor; returns the GPU address.
// The file's bytes are row-major; the GPU tensor takes the program's layout (the copy lays the
// weight out where the two differ: a channels-last convolution weight, say).
void* upload(Context& ctx, const TensorSpec& w, void* host) {
  char* dst = gpu_alloc(ctx, &w, 0);
  AtenTensorHandle src = nullptr;
  int64_t row_major[kMaxDims];
  row_major_strides(w, row_major);
  check(aoti_torch_create_tensor_from_blob(host, w.ndim, w.sizes, row_major, 0, aoti_dtype(w.dtype),
                                           aoti_torch_device_type_cpu(), 0, &src),
        "viewing a weight on the host");
  Tensor from(src);
  check(aoti_torch_copy_(ctx.gpu_blocks.back().get(), from.get(), 0), "copying a weight to the GPU");
  return dst;
}

DType same_size_dtype(size_t itemsize) {
  switch (itemsize) {
    case 1: return DType::U8;
    case 2: return DType::I16;
    case 4: return DType::I32;
    case 16: return DType::C128;
    default: return DType::I64;
  }
}

// Note: strided copies on the GPU go through torch (aten's copy_ on two views, on the model's
// stream); they only restride control-flow operands and odd inputs.
void copy_on_gpu(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                 const int64_t* sizes, int ndim, size_t itemsize) {
  if (replayed(true, "copy")) return;  // aten's copy_ of one GPU view into another allocates nothing
  AtenTensorHandle d = nullptr, s = nullptr;
  int32_t dtype = aoti_dtype(same_size_dtype(itemsize));
  int32_t cuda_type = aoti_torch_device_type_cuda();
  check(aoti_torch_create_tensor_from_blob(dst, ndim, sizes, dst_strides, 0, dtype, cuda_type, 0, &d),
        "viewing GPU memory");
  Tensor dst_view(d);
  check(aoti_torch_create_tensor_from_blob(const_cast<void*>(src), ndim, sizes, src_strides, 0, dtype, cuda_type, 0,
                                           &s),
        "viewing GPU memory");
  Tensor src_view(s);
  check(aoti_torch_copy_(dst_view.get(), src_view.get(), 0), "a strided copy on the GPU");
}

char* arena(Context& ctx, size_t i) { return ctx.arenas[i]; }

const Tensor& view(Context& ctx, size_t slot, void* data, DType dtype, std::initializer_list<int64_t> sizes,
                   std::initializer_list<int64_t> strides) {
  auto& [made_for, tensor] = ctx.views[slot];
  if (tensor.get() == nullptr || made_for != data) {
    tensor = view(data, dtype, sizes, strides);
    made_for = data;
  }
  return tensor;
}
char* scratch(Context& ctx, size_t i) { return ctx.scratch_blocks[i]; }

std::string shape_text(const int64_t* sizes, int ndim) {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(sizes[d]);
  return s + "]";
}

bool is_written_weight(size_t index) {
  for (size_t j = 0; j < program.num_writes; ++j)
    if (program.writes[j].into_weight != 0 && program.writes[j].target == index) return true;
  return false;
}

void bind_weights(Context& ctx, const char* path, bool verify) {
  std::string why;
  if (!ctx.weights_file.open(path, &why)) throw Error(KILN_BAD_WEIGHTS, why);
  if (verify && !(why = digest_mismatch(ctx.weights_file, path)).empty()) throw Error(KILN_BAD_WEIGHTS, why);
  for (size_t i = 0; i < program.num_weights; ++i) {
    const TensorSpec& w = program.weights[i];
    const TensorEntry* e = ctx.weights_file.find(w.name);
    std::string where = std::string("weights file ") + path + ": entry '" + w.name + "'";
    if (e == nullptr) throw Error(KILN_BAD_WEIGHTS, where + " is missing (a weights file of another model?)");
    if (e->dtype != info(w.dtype).safetensors_name)
      throw Error(KILN_BAD_WEIGHTS, where + " is " + e->dtype + ", the model needs " + info(w.dtype).safetensors_name);
    bool same = static_cast<int>(e->shape.size()) == w.ndim;
    for (int d = 0; same && d < w.ndim; ++d) same = e->shape[d] == w.sizes[d];
    if (!same)
      throw Error(KILN_BAD_WEIGHTS, where + " has shape " + shape_text(e->shape.data(), static_cast<int>(e->shape.size())) +
                                        ", the model needs " + shape_text(w.sizes, w.ndim));
    size_t itemsize = info(w.dtype).itemsize;
    void* host = const_cast<void*>(e->data);
    // Note: a weight the model writes (a buffer it mutates) is copied out of the mapping: the
    // file's pages are read-only and shared by every model made from it. So is one the
    // program lays out otherwise than the file's row-major bytes (a permutation of them: a
    // convolution's weight in channels-last, a transposed parameter), once, here.
    int64_t row_major[kMaxDims];
    row_major_strides(w, row_major);
    bool relaid = !on_gpu() && !std::equal(row_major, row_major + w.ndim, w.strides);
    if (relaid) {
      ctx.owned.push_back(allocate(e->nbytes));
      copy_on_host(ctx.owned.back().get(), w.strides, e->data, row_major, w.sizes, w.ndim, itemsize);
      host = ctx.owned.back().get();
    } else if (reinterpret_cast<uintptr_t>(e->data) % itemsize != 0 || (!on_gpu() && is_written_weight(i))) {
      ctx.owned.push_back(allocate(e->nbytes));
      std::memcpy(ctx.owned.back().get(), e->data, e->nbytes);
      host = ctx.owned.back().get();
    }
    ctx.weights.push_back(on_gpu() ? upload(ctx, w, host) : host);
  }
}

void check_cpu() {
#if defined(__x86_64__)
  if (std::string(program.isa) == "x86-64-v3") {
    __builtin_cpu_init();
    bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
    if (!ok)
      throw Error(KILN_FAILED, "this model was compiled for x86-64-v3 (AVX2, FMA) and this CPU lacks them; "
                               "recompile it on a machine like this one");
  }
#endif
}

void allocate_memory(Context& ctx) {
  ctx.input_staging.resize(program.num_inputs);
  ctx.gpu_staging.resize(program.num_inputs, nullptr);
  ctx.views.resize(program.num_views);
  for (size_t j = 0; j < program.num_writes; ++j) {
    const TensorSpec& spec = program.writes[j].value;
    if (on_gpu()) {
      ctx.write_blocks.push_back(gpu_alloc(ctx, &spec, 0));
    } else {
      ctx.owned.push_back(allocate(nbytes(spec)));
      ctx.write_blocks.push_back(ctx.owned.back().get());
    }
  }
  if (on_gpu()) {
    for (size_t i = 0; i < program.num_arenas; ++i) ctx.arenas.push_back(gpu_alloc(ctx, nullptr, program.arena_bytes[i]));
    for (size_t i = 0; i < program.num_scratch; ++i)
      ctx.scratch_blocks.push_back(gpu_alloc(ctx, nullptr, program.scratch_bytes[i]));
    return;
  }
  for (size_t i = 0; i < program.num_arenas; ++i) {
    ctx.owned.push_back(allocate(program.arena_bytes[i]));
    ctx.arenas.push_back(ctx.owned.back().get());
  }
  for (size_t i = 0; i < program.num_scratch; ++i) {
    ctx.owned.push_back(allocate(program.scratch_bytes[i]));
    ctx.scratch_blocks.push_back(ctx.owned.back().get());
  }
}

// torch's name of an aoti dtype code ("int64"); the code itself for one kiln has no DType for.
std::string dtype_text(int32_t code) {
  for (int d = 0; d <= static_cast<int>(DType::C128); ++d)
    if (aoti_dtype(static_cast<DType>(d)) == code) return info(static_cast<DType>(d)).torch_name;
  return "dtype code " + std::to_string(code);
}

// The data of a checked tensor; `role` names it in errors ("input 'x'", "output 0").
void* checked_data(AtenTensorHandle h, const TensorSpec& spec, const std::string& role, bool any_strides,
                          const int64_t** strides_out) {
  if (h == nullptr) throw Error(KILN_BAD_ARGUMENT, role + " is a null tensor");
  int32_t device = 0;
  int32_t dtype = 0;
  int64_t ndim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  void* data = nullptr;
  check(aoti_torch_get_device_type(h, &device), "reading a tensor's device");
  check(aoti_torch_get_dtype(h, &dtype), "reading a tensor's dtype");
  check(aoti_torch_get_dim(h, &ndim), "reading a tensor's rank");
  check(aoti_torch_get_sizes(h, &sizes), "reading a tensor's sizes");
  check(aoti_torch_get_strides(h, &strides), "reading a tensor's strides");
  check(aoti_torch_get_data_ptr(h, &data), "reading a tensor's data");
  if (device != device_type())
    throw Error(KILN_BAD_ARGUMENT, role + (on_gpu() ? " is not on the GPU; this model was compiled for the cuda target"
                                                    : " is not on the CPU; this model was compiled for the cpu target"));
  if (dtype != aoti_dtype(spec.dtype))
    throw Error(KILN_BAD_ARGUMENT, role + " is " + dtype_text(dtype) + ", the model needs " + info(spec.dtype).torch_name);
  bool same = ndim == spec.ndim;
  for (int d = 0; same && d < spec.ndim; ++d) same = sizes[d] == spec.sizes[d];
  if (!same)
    throw Error(KILN_BAD_ARGUMENT, role + " has shape " + shape_text(sizes, static_cast<int>(ndim)) +
                                       ", the model needs " + shape_text(spec.sizes, spec.ndim));
  bool laid_out = true;
  for (int d = 0; d < spec.ndim; ++d) laid_out &= spec.sizes[d] <= 1 || strides[d] == spec.strides[d];
  if (!laid_out && !any_strides)
    throw Error(KILN_BAD_ARGUMENT, role + " has strides " + shape_text(strides, spec.ndim) + ", the model needs " +
                                       shape_text(spec.strides, spec.ndim));
  // Note: cubins assume 16-byte aligned pointers (their loads are vectorized): an unaligned input
  // is staged like a restrided one; an unaligned output is refused.
  bool aligned = !on_gpu() || reinterpret_cast<uintptr_t>(data) % 16 == 0;
  if (!aligned && !any_strides)
    throw Error(KILN_BAD_ARGUMENT, role + " is not 16-byte aligned (a slice?); pass a tensor of its own");
  *strides_out = laid_out && aligned ? nullptr : strides;
  return data;
}

void* input_data(Context& ctx, size_t i, AtenTensorHandle h) {
  const TensorSpec& spec = program.inputs[i];
  const int64_t* strides = nullptr;
  void* data = checked_data(h, spec, std::string("input '") + spec.name + "'", true, &strides);
  if (strides == nullptr) return data;
  void* staging = nullptr;
  if (on_gpu()) {
    if (ctx.gpu_staging[i] == nullptr) ctx.gpu_staging[i] = gpu_alloc(ctx, &spec, 0);
    staging = ctx.gpu_staging[i];
  } else {
    if (!ctx.input_staging[i]) ctx.input_staging[i] = allocate(nbytes(spec));
    staging = ctx.input_staging[i].get();
  }
  copy_strided(staging, spec.strides, data, strides, spec.sizes, spec.ndim, info(spec.dtype).itemsize);
  return staging;
}

// Note: a CUDA graph holds the addresses it was captured with, so with replay on (kiln_replay.h)
// the graphs read inputs from, and write outputs to, buffers of the model's own, which the
// caller's tensors are copied into and out of on the run's stream (a contiguous copy each).
void* graph_input(Context& ctx, size_t i, AtenTensorHandle h) {
  const TensorSpec& spec = program.inputs[i];
  void* data = input_data(ctx, i, h);  // the caller's, or its restrided copy in the staging buffer
  if (ctx.gpu_staging[i] == nullptr) ctx.gpu_staging[i] = gpu_alloc(ctx, &spec, 0);
  if (data != ctx.gpu_staging[i]) cuda::copy_on_device(*ctx.gpu, ctx.gpu_staging[i], data, nbytes(spec));
  return ctx.gpu_staging[i];
}

void* graph_output(Context& ctx, size_t i) {
  if (ctx.graph_outputs.empty()) ctx.graph_outputs.resize(program.num_outputs, nullptr);
  if (ctx.graph_outputs[i] == nullptr) ctx.graph_outputs[i] = gpu_alloc(ctx, &program.outputs[i], 0);
  return ctx.graph_outputs[i];
}

Tensor new_output(const TensorSpec& spec) {
  AtenTensorHandle h = nullptr;
  check(aoti_torch_empty_strided(spec.ndim, spec.sizes, spec.strides, aoti_dtype(spec.dtype), device_type(), 0, &h),
        "allocating an output");
  return Tensor(h);
}

void run_graphs(Context& ctx, const AtenTensorHandle* inputs, size_t num_inputs, AtenTensorHandle* outputs,
                size_t num_outputs, bool captured = false);
void write_back(Context& ctx, const AtenTensorHandle* inputs);

// A run on the GPU: every kernel, extern and copy on one stream (the caller's, or torch's current).
void run(Context& ctx, const AtenTensorHandle* inputs, size_t num_inputs, AtenTensorHandle* outputs,
         size_t num_outputs, void* stream, bool stream_given) {
  if (!on_gpu()) {
    if (stream_given && stream != nullptr) throw Error(KILN_BAD_ARGUMENT, "a cpu model takes no CUDA stream");
    std::lock_guard<std::mutex> lock(ctx.running);
    return run_graphs(ctx, inputs, num_inputs, outputs, num_outputs);
  }
  // Note: the whole run holds the model, its stream and its order behind the last run included.
  std::lock_guard<std::mutex> lock(ctx.running);
  cuda::check_usable(*ctx.gpu);
  if (!stream_given) stream = cuda::torch_current_stream();
  cuda::StreamGuard guard(stream, 0);
  cuda::set_stream(*ctx.gpu, stream);
  // a caller capturing its stream (torch.cuda.graph) captures the run's launches as they are
  const bool captured = cuda::capturing(*ctx.gpu, stream);
  if (!captured) cuda::begin_run(*ctx.gpu);
  running_device = ctx.gpu.get();
  try {
    run_graphs(ctx, inputs, num_inputs, outputs, num_outputs, captured);
  } catch (...) {
    running_device = nullptr;
    if (!captured) {
      try {
        cuda::end_run(*ctx.gpu);
      } catch (...) {  // the run's own error is the one to report
      }
    }
    throw;
  }
  running_device = nullptr;
  try {
    if (!captured) cuda::end_run(*ctx.gpu);
  } catch (...) {  // the run is queued and its outputs handed over; the next run says what broke
  }
}

// captured: the caller captures its stream, so the run launches directly (into its graph).
void run_graphs(Context& ctx, const AtenTensorHandle* inputs, size_t num_inputs, AtenTensorHandle* outputs,
                size_t num_outputs, bool captured) {
  if (num_inputs != program.num_inputs)
    throw Error(KILN_BAD_ARGUMENT, "the model takes " + std::to_string(program.num_inputs) + " inputs, got " +
                                       std::to_string(num_inputs));
  if (num_outputs != program.num_outputs)
    throw Error(KILN_BAD_ARGUMENT, "the model has " + std::to_string(program.num_outputs) + " outputs, got " +
                                       std::to_string(num_outputs) + " output slots");
  if (num_inputs > 0 && inputs == nullptr) throw Error(KILN_BAD_ARGUMENT, "inputs is NULL");
  if (num_outputs > 0 && outputs == nullptr) throw Error(KILN_BAD_ARGUMENT, "outputs is NULL");
  const bool graphs = on_gpu() && ctx.replay.on() && !captured;
  std::vector<void*> args(program.num_inputs + program.num_weights);
  for (size_t i = 0; i < num_inputs; ++i) args[i] = graphs ? graph_input(ctx, i, inputs[i]) : input_data(ctx, i, inputs[i]);
  for (size_t i = 0; i < program.num_weights; ++i) args[num_inputs + i] = ctx.weights[i];
  std::vector<Tensor> fresh(num_outputs);
  std::vector<void*> results(num_outputs + program.num_writes);
  std::vector<void*> callers(num_outputs);  // the caller's outputs' data
  for (size_t j = 0; j < program.num_writes; ++j) results[num_outputs + j] = ctx.write_blocks[j];
  for (size_t i = 0; i < num_outputs; ++i) {
    const int64_t* strides = nullptr;
    std::string role = "output " + std::to_string(i);
    if (outputs[i] == nullptr) fresh[i] = new_output(program.outputs[i]);
    AtenTensorHandle h = outputs[i] != nullptr ? outputs[i] : fresh[i].get();
    callers[i] = checked_data(h, program.outputs[i], role, false, &strides);
    results[i] = graphs ? graph_output(ctx, i) : callers[i];
  }
  if (graphs) {
    ctx.replay.run(*ctx.gpu, [&] { program.main(ctx, args.data(), results.data()); });
    for (size_t i = 0; i < num_outputs; ++i)
      cuda::copy_on_device(*ctx.gpu, callers[i], results[i], nbytes(program.outputs[i]));
  } else {
    program.main(ctx, args.data(), results.data());
  }
  write_back(ctx, inputs);
  for (size_t i = 0; i < num_outputs; ++i)
    if (outputs[i] == nullptr) outputs[i] = fresh[i].release();
}

// The values of the inputs and buffers the model mutates, into them: an input through torch
// (the caller's tensor, whatever its strides and device), a weight into the model's own copy.
void write_back(Context& ctx, const AtenTensorHandle* inputs) {
  for (size_t j = 0; j < program.num_writes; ++j) {
    const Write& w = program.writes[j];
    const TensorSpec& v = w.value;
    if (w.into_weight != 0) {
      const TensorSpec& weight = program.weights[w.target];
      copy_strided(ctx.weights[w.target], weight.strides, ctx.write_blocks[j], v.strides, v.sizes, v.ndim,
                   info(v.dtype).itemsize);
      continue;
    }
    AtenTensorHandle h = nullptr;
    check(aoti_torch_create_tensor_from_blob(ctx.write_blocks[j], v.ndim, v.sizes, v.strides, 0, aoti_dtype(v.dtype),
                                             device_type(), 0, &h),
          "viewing a value to write back");
    Tensor value(h);
    check(aoti_torch_copy_(inputs[w.target], value.get(), 0), "writing a mutated input back");
  }
}

void configure_replay(Context& ctx, unsigned flags) {
  if (!on_gpu())
    ctx.replay.turn_off("a cpu model");
  else if ((flags & KILN_CREATE_NO_GRAPHS) != 0)
    ctx.replay.turn_off("KILN_CREATE_NO_GRAPHS");
  else if (program.num_arenas > 1)
    ctx.replay.turn_off("the model's control flow (cond, while_loop) decides on the host");
  ctx.replay.use_pool(&ctx.pool);
}

std::string& last_error() {
  thread_local std::string message;
  return message;
}

// Runs `body`, turning every exception into a status and the thread's last error.
template <class F>
int guarded(F&& body) {
  try {
    last_error().clear();
    body();
    return KILN_OK;
  } catch (const Error& e) {
    last_error() = e.what();
    return e.status;
  } catch (const std::bad_alloc&) {
    last_error() = "out of memory";
    return KILN_FAILED;
  } catch (const std::exception& e) {
    last_error() = e.what();
    return KILN_FAILED;
  } catch (...) {
    last_error() = "unknown error";
    return KILN_FAILED;
  }
}

const TensorSpec* io_spec(bool input, size_t index) {
  size_t n = input ? program.num_inputs : program.num_outputs;
  if (index >= n) return nullptr;
  return input ? &program.inputs[index] : &program.outputs[index];
}

}  // namespace kiln

struct KilnModel {
  kiln::Context ctx;
};

extern "C" {

int kiln_abi_version(void) { return KILN_ABI_VERSION; }

const char* kiln_last_error(void) { return kiln::last_error().c_str(); }

int kiln_model_create(const char* weights_path, KilnModel** model) {
  return kiln_model_create_with(weights_path, 0, model);
}

int kiln_model_create_with(const char* weights_path, unsigned flags, KilnModel** model) {
  return kiln::guarded([&] {
    if (model == nullptr) throw kiln::Error(KILN_BAD_ARGUMENT, "model is NULL");
    *model = nullptr;
    if (weights_path == nullptr) throw kiln::Error(KILN_BAD_ARGUMENT, "weights_path is NULL");
    kiln::check_cpu();
    auto made = std::make_unique<KilnModel>();
    if (kiln::on_gpu()) made->ctx.gpu.reset(kiln::cuda::open(kiln::program));  // the driver first: its error is clearest
    kiln::bind_weights(made->ctx, weights_path, (flags & KILN_CREATE_NO_VERIFY) == 0);
    kiln::allocate_memory(made->ctx);
    kiln::configure_replay(made->ctx, flags);
    *model = made.release();
  });
}

void kiln_model_destroy(KilnModel* model) {
  if (model == nullptr) return;
  // Note: the model's GPU memory goes back to torch's caching allocator, which hands it out at
  // once: the last run, queued on whatever stream, must be done with it first.
  if (model->ctx.gpu) {
    std::lock_guard<std::mutex> lock(model->ctx.running);  // a run on another thread ends first
    kiln::cuda::finish(*model->ctx.gpu);
  }
  delete model;
}

int kiln_model_run(KilnModel* model, const AtenTensorHandle* inputs, size_t num_inputs, AtenTensorHandle* outputs,
                   size_t num_outputs) {
  return kiln::guarded([&] {
    if (model == nullptr) throw kiln::Error(KILN_BAD_ARGUMENT, "model is NULL");
    kiln::run(model->ctx, inputs, num_inputs, outputs, num_outputs, nullptr, false);
  });
}

int kiln_model_run_on_stream(KilnModel* model, const AtenTensorHandle* inputs, size_t num_inputs,
                             AtenTensorHandle* outputs, size_t num_outputs, void* stream) {
  return kiln::guarded([&] {
    if (model == nullptr) throw kiln::Error(KILN_BAD_ARGUMENT, "model is NULL");
    kiln::run(model->ctx, inputs, num_inputs, outputs, num_outputs, stream, true);
  });
}

size_t kiln_model_num_inputs(const KilnModel*) { return kiln::program.num_inputs; }
size_t kiln_model_num_outputs(const KilnModel*) { return kiln::program.num_outputs; }

const char* kiln_model_input_name(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(true, i);
  return s ? s->name : nullptr;
}
const char* kiln_model_output_name(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(false, i);
  return s ? s->name : nullptr;
}
const char* kiln_model_input_dtype(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(true, i);
  return s ? kiln::info(s->dtype).torch_name : nullptr;
}
const char* kiln_model_output_dtype(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(false, i);
  return s ? kiln::info(s->dtype).torch_name : nullptr;
}
size_t kiln_model_input_ndim(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(true, i);
  return s ? static_cast<size_t>(s->ndim) : 0;
}
size_t kiln_model_output_ndim(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(false, i);
  return s ? static_cast<size_t>(s->ndim) : 0;
}
const int64_t* kiln_model_input_sizes(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(true, i);
  return s ? s->sizes : nullptr;
}
const int64_t* kiln_model_output_sizes(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(false, i);
  return s ? s->sizes : nullptr;
}
const int64_t* kiln_model_input_strides(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(true, i);
  return s ? s->strides : nullptr;
}
const int64_t* kiln_model_output_strides(const KilnModel*, size_t i) {
  const kiln::TensorSpec* s = kiln::io_spec(false, i);
  return s ? s->strides : nullptr;
}

const char* kiln_model_target(void) { return kiln::program.target; }

int kiln_model_set_pool_hook(KilnModel* model, KilnPoolHook hook, void* context) {
  return kiln::guarded([&] {
    if (model == nullptr) throw kiln::Error(KILN_BAD_ARGUMENT, "model is NULL");
    if (!kiln::on_gpu()) throw kiln::Error(KILN_BAD_ARGUMENT, "a cpu model has no CUDA graphs to take a pool hook");
    std::lock_guard<std::mutex> lock(model->ctx.running);
    if (model->ctx.replay.began())
      throw kiln::Error(KILN_BAD_ARGUMENT, "a pool hook is set before the model's first run");
    model->ctx.pool.set(hook, context);
  });
}

const char* kiln_model_replay(const KilnModel* model) {
  thread_local std::string said;  // the caller's copy, as kiln_last_error's
  if (model == nullptr) return "";
  std::lock_guard<std::mutex> lock(const_cast<KilnModel*>(model)->ctx.running);  // not during a run
  said = model->ctx.replay.describe();
  return said.c_str();
}

}  // extern "C"
