// kiln_replay.cpp: recording and replaying a cuda model's launches as CUDA graphs (kiln_replay.h).
#include "kiln_replay.h"

#include <exception>
#include <mutex>
#include <string>

namespace kiln {

[[noreturn]] void fail(const std::string& message);  // kiln_runtime.cpp: throws kiln::Error

namespace {

thread_local Replay* active = nullptr;  // the replay of the run on this thread

// Sets the replay of this thread's run for a scope.
struct Active {
  explicit Active(Replay* replay) : before(active) { active = replay; }
  ~Active() { active = before; }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;
  Replay* before;
};

// The caller's stream ordered behind the model's own at the end of a scope, however it ends.
struct Join {
  Join(cuda::Device& device, void* caller, void* own) : device(device), caller(caller), own(own) {}
  ~Join() {
    try {
      cuda::wait_for(device, caller, own);
    } catch (...) {  // a destructor must not throw; the run's own error, if any, is the one to say
    }
  }
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;
  cuda::Device& device;
  void* caller;
  void* own;
};

// The device's current stream, and torch's, set to `stream` for a scope.
struct OnStream {
  OnStream(cuda::Device& device, void* stream) : device(device), before(cuda::stream(device)), guard(stream, 0) {
    cuda::set_stream(device, stream);
  }
  ~OnStream() {
    try {
      cuda::set_stream(device, before);
    } catch (...) {  // a destructor must not throw; the context was current a moment ago
    }
  }
  OnStream(const OnStream&) = delete;
  OnStream& operator=(const OnStream&) = delete;
  cuda::Device& device;
  void* before;
  cuda::StreamGuard guard;
};

}  // namespace

bool replayed(bool capturable, const char* what) { return active != nullptr && active->replayed(capturable, what); }
bool replayed_torch(const char* what) {
  return active != nullptr && active->replayed(active->captures_torch(), what);
}

void PoolHook::call(int event) {
  if (hook_ == nullptr) return;
  if (event == KILN_POOL_BEGIN) begun_ = true;  // whatever the hook did, the pool is released at the end
  if (hook_(context_, event) != 0)
    fail(std::string("the pool hook returned a failure at ") +
         (event == KILN_POOL_BEGIN ? "KILN_POOL_BEGIN" : "KILN_POOL_END"));
}

PoolHook::~PoolHook() {
  if (hook_ != nullptr && begun_) hook_(context_, KILN_POOL_RELEASE);  // a failure here has no one to tell
}

namespace {
// The pool hook's BEGIN for a scope (begin(), which throws; a BEGIN that fails is not ended);
// its END when the scope ends, or at end() (which throws).
class PoolScope {
 public:
  PoolScope() = default;
  void begin(PoolHook* pool) {
    pool->call(KILN_POOL_BEGIN);
    pool_ = pool;
  }
  ~PoolScope() {
    try {
      end();
    } catch (...) {  // a destructor must not throw; the run's own error, if any, is the one to say
    }
  }
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;
  void end() {
    PoolHook* pool = pool_;
    pool_ = nullptr;
    if (pool != nullptr) pool->call(KILN_POOL_END);
  }

 private:
  PoolHook* pool_ = nullptr;
};
}  // namespace

namespace {
// The message of the exception being handled.
std::string what_failed() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}
}  // namespace

void Replay::turn_off(const std::string& why) {
  why_off_ = why.empty() ? "off" : why;
  description_.clear();
}

void Replay::run(cuda::Device& device, const std::function<void()>& main) {
  if (!on()) return main();
  device_ = &device;
  Active scope(this);
  if (recorded_) {
    mode_ = Mode::kReplay;
    cursor_ = 0;
    main();
    if (cursor_ != calls_.size()) fail("the model made fewer GPU calls than its CUDA graphs hold");
    return;
  }
  record(device, main);
}

// Note: the first run records. The caller's stream may be the legacy default stream, which
// cannot be captured, so the capture runs on the process's capture stream, ordered behind the
// caller's work and the caller's behind it. A direct run on that stream comes first: it loads
// every kernel's module, which a capture cannot do.
void Replay::record(cuda::Device& device, const std::function<void()>& main) {
  std::unique_lock<std::mutex> recording(cuda::recording_lock());
  void* caller = cuda::stream(device);
  void* own = nullptr;
  try {
    own = cuda::capture_stream(device);
  } catch (const std::exception& e) {
    turn_off(std::string("no stream to capture on (") + e.what() + "); the model runs its calls directly");
    recording.unlock();
    Active none(nullptr);
    return main();
  }
  cuda::wait_for(device, own, caller);
  {
    Join join(device, caller, own);  // destroyed after on_own: the caller's stream is current again
    OnStream on_own(device, own);
    record_pooled(main);
  }
  recording.unlock();
  if (!recorded_) {
    Active none(nullptr);
    main();  // this run's results, from direct calls
  }
}

// The recording: a direct run, then the captured one, both inside the pool hook's BEGIN and END
// where there is a hook. Note: the direct run allocates in the pool too, so the capture finds
// the blocks it needs already there (no cudaMalloc inside it), cuBLAS's workspace among them.
void Replay::record_pooled(const std::function<void()>& main) {
  // Note: a hook that fails at its BEGIN costs only the calls into torch: they run directly,
  // and kiln's kernels are recorded as without a hook.
  PoolScope pool;
  began_ = true;
  pool_failure_.clear();
  torch_captured_ = pool_ != nullptr && pool_->set();
  try {
    if (torch_captured_) pool.begin(pool_);
  } catch (...) {
    pool_failure_ = what_failed();
    torch_captured_ = false;
  }
  mode_ = Mode::kDirect;
  main();  // a failure here is the run's own: it propagates, and the next run records again
  mode_ = Mode::kRecord;
  try {
    main();
    close_segment();
    in_graph_call_ = true;  // a pool hook that fails at its end leaves graphs of unknown memory
    pool.end();
    in_graph_call_ = false;
    recorded_ = true;
    // with nothing captured, replay would only add the copies of inputs and outputs
    if (graphs_ == 0) turn_off("nothing to capture: every GPU call of the model runs directly");
  } catch (...) {
    // Note: only a failure inside a capture turns replay off for good; one of a call run
    // directly (out of memory in attention, say) is this run's, and the next run records again.
    const bool in_capture = capturing_ || in_graph_call_;
    in_graph_call_ = false;
    if (in_capture) cuda::abandon_capture(*device_);
    forget();
    if (!in_capture) throw;
    turn_off("a capture failed (" + what_failed() + "); the model runs its calls directly");
  }
}

bool Replay::replayed(bool capturable, const char* what) {
  if (mode_ == Mode::kDirect) return false;
  if (mode_ == Mode::kRecord) {
    if (!capturable) {
      close_segment();
      calls_.push_back(Call{-1, false});
      ++direct_[what];
      return false;
    }
    if (!capturing_) {
      in_graph_call_ = true;
      cuda::begin_capture(*device_);
      in_graph_call_ = false;
    }
    calls_.push_back(Call{static_cast<long>(graphs_), !capturing_});
    capturing_ = true;
    return false;
  }
  if (cursor_ >= calls_.size()) fail("the model made more GPU calls than its CUDA graphs hold");
  const Call call = calls_[cursor_++];
  if ((call.segment >= 0) != capturable)
    fail(std::string("the model's GPU calls differ from those its CUDA graphs hold (at ") + what + ")");
  if (call.first) cuda::launch_graph(*device_, static_cast<size_t>(call.segment));
  return call.segment >= 0;
}

// Ends the open capture, if any, and launches its graph: the recording run's results need it.
void Replay::close_segment() {
  if (!capturing_) return;
  in_graph_call_ = true;
  capturing_ = false;
  size_t index = cuda::end_capture(*device_);
  ++graphs_;
  cuda::launch_graph(*device_, index);
  in_graph_call_ = false;
}

void Replay::forget() {
  capturing_ = false;
  calls_.clear();
  direct_.clear();
  graphs_ = 0;
  cuda::drop_graphs(*device_);
}

const std::string& Replay::describe() const {
  if (!on()) {
    description_ = "off: " + why_off_;
    return description_;
  }
  if (!recorded_) {
    description_ = "on: the first run records its CUDA graphs";
    return description_;
  }
  size_t captured = 0;
  for (const Call& c : calls_) captured += c.segment >= 0 ? 1 : 0;
  description_ = "on: " + std::to_string(graphs_) + " CUDA graph" + (graphs_ == 1 ? "" : "s") + " of " +
                 std::to_string(captured) + " calls; inputs and outputs copied to and from the model's own buffers";
  if (captures_torch()) description_ += "; calls into torch captured, their memory in the model's pool";
  if (!direct_.empty()) {
    description_ += captures_torch()         ? "; run directly (fallback ops, reads on the host):"
                    : pool_failure_.empty() ? "; run directly (no pool hook for torch's allocations):"
                                            : "; run directly (" + pool_failure_ + "):";
    const char* separator = " ";
    for (const auto& [what, n] : direct_) {
      description_ += separator + what + " x" + std::to_string(n);
      separator = ", ";
    }
  }
  return description_;
}

}  // namespace kiln
