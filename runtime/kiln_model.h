/* kiln_model.h: the C API of a model compiled by kiln (model.so).
 *
 * A model is created from its weights file, runs on input tensors into output tensors and is
 * destroyed; its inputs and outputs can be listed with names, shapes and dtypes. Tensors are
 * torch's stable C shim handles (AtenTensorHandle, torch/csrc/inductor/aoti_torch/c/shim.h);
 * a C++ program makes them with aoti_torch_empty_strided or aoti_torch_create_tensor_from_blob
 * and links libtorch_cpu, with no Python anywhere.
 *
 *   KilnModel* model = NULL;
 *   if (kiln_model_create("build/mlp/weights.safetensors", &model) != 0) {
 *     fprintf(stderr, "%s\n", kiln_last_error());
 *   }
 *   AtenTensorHandle outputs[1] = {NULL};    // NULL: the model allocates the output
 *   kiln_model_run(model, inputs, 1, outputs, 1);
 *   ...
 *   aoti_torch_delete_tensor_object(outputs[0]);
 *   kiln_model_destroy(model);
 *
 * Every function that can fail returns 0 on success and a non-zero code otherwise, with a
 * message for kiln_last_error() (per thread). No exception and no abort crosses this API.
 * One model runs one call at a time (it owns one scratch arena); create one per thread to run
 * in parallel: they share nothing but the weights file's pages.
 */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KILN_ATEN_TENSOR_HANDLE_DECLARED
#define KILN_ATEN_TENSOR_HANDLE_DECLARED
/* The same type as shim.h's AtenTensorHandle. */
struct AtenTensorOpaque;
typedef struct AtenTensorOpaque* AtenTensorHandle;
#endif

typedef struct KilnModel KilnModel;

enum KilnStatus {
  KILN_OK = 0,
  KILN_BAD_ARGUMENT = 1, /* wrong inputs or outputs: count, shape, dtype, device */
  KILN_BAD_WEIGHTS = 2,  /* the weights file is missing, unreadable or for another model */
  KILN_FAILED = 3        /* a kernel or an extern call failed */
};

/* The model's ABI version; a loader checks it before anything else. */
#define KILN_ABI_VERSION 2
int kiln_abi_version(void);

/* The last error of this thread, "" when there is none. Valid until this thread's next call. */
const char* kiln_last_error(void);

/* Maps the weights file (or copies a tensor that is not aligned), checks the whole file against
 * the xxh3-128 digest it carries (written by kiln; see kiln_verify.h), and checks every entry the
 * model needs against the model: name, dtype and shape. A damaged, truncated or edited file gives
 * KILN_BAD_WEIGHTS and a message naming it. A cuda model also loads the CUDA driver and its
 * kernels, and copies the weights to the GPU. */
int kiln_model_create(const char* weights_path, KilnModel** model);

/* kiln_model_create with flags: KILN_CREATE_NO_VERIFY skips the digest check (the file is still
 * parsed, bounds-checked and matched against the model by name, dtype and shape). */
#define KILN_CREATE_NO_VERIFY 1u
/* KILN_CREATE_NO_GRAPHS: a cuda model launches every kernel from the host at every run. Without
 * it, its first run records its launches as CUDA graphs and later runs replay them; calls into
 * torch (matmuls, convolutions, attention) join the graphs only where a pool hook is set (below),
 * else they run directly between them: kiln_model_replay says how. */
#define KILN_CREATE_NO_GRAPHS 2u
int kiln_model_create_with(const char* weights_path, unsigned flags, KilnModel** model);
void kiln_model_destroy(KilnModel* model);

/* inputs: one tensor per model input, in order, with the listed shape and dtype on the CPU
 * (any strides: a tensor with other strides than listed is copied first).
 * outputs: one slot per model output. A NULL slot receives a new tensor (the caller deletes it
 * with aoti_torch_delete_tensor_object); a tensor in a slot is written in place and must have
 * the listed shape, strides and dtype. */
int kiln_model_run(KilnModel* model, const AtenTensorHandle* inputs, size_t num_inputs,
                   AtenTensorHandle* outputs, size_t num_outputs);

/* A cuda model: inputs and outputs are CUDA tensors on device 0 (a data pointer that is not
 * 16-byte aligned is copied for an input, refused for an output). kiln_model_run uses torch's
 * current stream; this takes the stream (a cudaStream_t / CUstream) every kernel, extern and
 * copy of the run is queued on. The call returns once the work is queued (a cond or while_loop
 * waits for its predicate). On a cpu model, stream must be NULL. */
int kiln_model_run_on_stream(KilnModel* model, const AtenTensorHandle* inputs, size_t num_inputs,
                             AtenTensorHandle* outputs, size_t num_outputs, void* stream);

/* Inputs and outputs: names, shapes, strides and dtypes ("float32", "int64", ...).
 * Pointers stay valid while the model lives. An index out of range gives NULL / 0. */
size_t kiln_model_num_inputs(const KilnModel* model);
size_t kiln_model_num_outputs(const KilnModel* model);
const char* kiln_model_input_name(const KilnModel* model, size_t index);
const char* kiln_model_output_name(const KilnModel* model, size_t index);
const char* kiln_model_input_dtype(const KilnModel* model, size_t index);
const char* kiln_model_output_dtype(const KilnModel* model, size_t index);
size_t kiln_model_input_ndim(const KilnModel* model, size_t index);
size_t kiln_model_output_ndim(const KilnModel* model, size_t index);
const int64_t* kiln_model_input_sizes(const KilnModel* model, size_t index);
const int64_t* kiln_model_output_sizes(const KilnModel* model, size_t index);
const int64_t* kiln_model_input_strides(const KilnModel* model, size_t index);
const int64_t* kiln_model_output_strides(const KilnModel* model, size_t index);

/* The target the model was compiled for: "cpu" or "cuda". */
const char* kiln_model_target(void);

/* A cuda model's calls into torch (matmul, convolution, attention) allocate through torch's
 * caching allocator and use torch's cuBLAS workspace. In a CUDA graph, every such byte must stay
 * the graph's for as long as the graph lives, which needs the allocator's private pools (what
 * torch.cuda.graph uses), out of reach of torch's C shim. A host that reaches them sets a hook,
 * called on the thread of the recording run:
 *   KILN_POOL_BEGIN   before the recording run: this thread's allocations go to a pool of the
 *                     model's own from now on, and torch's cuBLAS workspaces are cleared (so the
 *                     run makes its own in the pool);
 *   KILN_POOL_END     after it: allocations go where they went before, and cuBLAS workspaces are
 *                     cleared again (so none in the pool is handed to a later call);
 *   KILN_POOL_RELEASE when the model is destroyed, after its graphs: the pool may go.
 * BEGIN and END come in pairs, once per recording (a run that fails records again); RELEASE comes
 * once, if BEGIN ever came. The hook returns 0, or non-zero for a failure: a BEGIN that fails
 * undoes itself (no END follows) and the calls into torch then run directly; an END that fails
 * turns replay off for the model. A hook that routes nothing (this thread's allocations already
 * go to another pool, say) must fail its BEGIN. kiln's Python loader sets one (torch.cuda.MemPool
 * and use_mem_pool); a C++ host with libtorch can call
 * c10::cuda::CUDACachingAllocator::beginAllocateToPool,
 * endAllocateToPool and releasePool. Set it before the model's first run. Without a hook, calls
 * into torch run directly between the graphs. A cpu model takes no hook (KILN_BAD_ARGUMENT). */
#define KILN_POOL_BEGIN 1
#define KILN_POOL_END 2
#define KILN_POOL_RELEASE 3
typedef int (*KilnPoolHook)(void* context, int event);
int kiln_model_set_pool_hook(KilnModel* model, KilnPoolHook hook, void* context);

/* How the model's runs launch their work: "off: <why>" (a cpu model, KILN_CREATE_NO_GRAPHS,
 * control flow, a capture that failed), or "on: ..." with its CUDA graphs and the calls that run
 * directly. Valid until the model's next call. */
const char* kiln_model_replay(const KilnModel* model);

#ifdef __cplusplus
}
#endif

#endif /* KILN_MODEL_H */
