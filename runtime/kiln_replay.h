// kiln_replay.h: a cuda model's launches replayed as CUDA graphs (internal to the runtime).
//
// The wrapper's main graph is the same code in every mode; each GPU call it makes (a kernel, an
// extern, a copy, a fallback op) first asks `replayed(capturable, what)`:
//   - direct (replay off, or the warm-up before a capture): every call runs;
//   - record (the first run): the calls that may be captured run inside a stream capture, each
//     run of them a segment; a call that may not (a call into torch, or a read of the GPU on the
//     host) ends the segment, whose graph is instantiated and launched at once, and runs
//     itself; so the recording run computes its results too;
//   - replay (every later run): the first call of each segment launches its graph, the others
//     of the segment are skipped, and the calls that run directly run as before.
//
// Note: a call may be captured only if every byte it writes stays the model's: memory torch's
// caching allocator hands out during a capture goes back to its pool when the call frees it,
// while the graph keeps writing it at every replay, over whatever torch gave it to next; and
// cuBLAS's workspace is torch's, freed by any clearCublasWorkspaces (every torch.cuda.graph
// capture calls it). So kiln's own kernels and its copies are always captured, and calls into
// torch (matmuls, attention, convolution) only where the host set a pool hook (kiln_model.h:
// kiln_model_set_pool_hook), which routes the recording run's allocations, cuBLAS's workspace
// among them, to a pool of the model's own, as torch.cuda.graph does. Fallback ops and reads of
// the GPU on the host always run directly. One gap is left: with max_split_size_mb set, an out of
// memory in a direct call between two captured segments of the recording run may free blocks
// of the pool that the first segment's graph holds.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln_cuda.h"
#include "kiln_model.h"

namespace kiln {

// The host's pool hook (kiln_model.h), and whether it ever began: the model's destruction, after
// its graphs', releases the pool then.
class PoolHook {
 public:
  PoolHook() = default;
  ~PoolHook();
  PoolHook(const PoolHook&) = delete;
  PoolHook& operator=(const PoolHook&) = delete;
  void set(KilnPoolHook hook, void* context) {
    hook_ = hook;
    context_ = context;
  }
  bool set() const { return hook_ != nullptr; }
  // Calls the hook with KILN_POOL_BEGIN or KILN_POOL_END; throws kiln::Error where it fails.
  void call(int event);

 private:
  KilnPoolHook hook_ = nullptr;
  void* context_ = nullptr;
  bool begun_ = false;
};

class Replay {
 public:
  // The pool hook the recording run uses (owned by the model, outliving its graphs), if any.
  void use_pool(PoolHook* pool) { pool_ = pool; }
  // Whether calls into torch are captured: decided as the model records (a pool hook is set,
  // and its BEGIN worked), and kept for every replay of that recording.
  bool captures_torch() const { return torch_captured_; }
  // Whether a recording has begun (a pool hook is set before it).
  bool began() const { return began_; }
  // Replay is off for good, and says why ("KILN_CREATE_NO_GRAPHS", "control flow ...").
  void turn_off(const std::string& why);
  bool on() const { return why_off_.empty(); }
  // Runs `main` on the device's current stream as the state says (see above): the first run
  // records, later runs replay; a capture that fails turns replay off, and the run goes on
  // directly.
  void run(cuda::Device& device, const std::function<void()>& main);
  // What kiln_model_replay says.
  const std::string& describe() const;

  // The call the wrapper is about to make: true where its work is in a graph (skip it).
  bool replayed(bool capturable, const char* what);

 private:
  enum class Mode { kDirect, kRecord, kReplay };
  struct Call {
    long segment;  // the graph it is captured in; -1: it runs directly
    bool first;    // the first call of its segment: it launches the graph
  };
  void record(cuda::Device& device, const std::function<void()>& main);
  void record_pooled(const std::function<void()>& main);
  void close_segment();
  void forget();

  PoolHook* pool_ = nullptr;
  bool torch_captured_ = false;
  bool began_ = false;
  std::string pool_failure_;  // why calls into torch run directly although a hook is set
  std::string why_off_;
  mutable std::string description_;
  Mode mode_ = Mode::kDirect;
  cuda::Device* device_ = nullptr;  // during a run
  bool recorded_ = false;
  bool capturing_ = false;
  bool in_graph_call_ = false;  // in a call of the graph machinery (begin, end, launch)
  std::vector<Call> calls_;
  size_t cursor_ = 0;
  size_t graphs_ = 0;
  std::map<std::string, size_t> direct_;  // calls that run directly, by what they are
};

// The wrapper's question (see Replay::replayed) for the run on this thread: false where there
// is none (a cpu model, or replay off).
bool replayed(bool capturable, const char* what);
// The same for a call into torch (a matmul, a convolution, attention): capturable where the
// run's replay has a pool hook.
bool replayed_torch(const char* what);

}  // namespace kiln
