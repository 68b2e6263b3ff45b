// runtime/kiln_replay.cpp against a fake of kiln's CUDA layer (kiln_cuda.h): every driver call
// is a line of a log, so tests/test_replay_logic.py can check what a record and a replay do
// without a GPU. Each scenario prints its log, a line per event, and "END".
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln_replay.h"

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& message) { throw Error(message); }

namespace cuda {

struct Device {
  void* stream = reinterpret_cast<void*>(0x1);  // the caller's
  size_t graphs = 0;
  bool fail_capture = false;  // begin_capture throws
};

namespace {
std::vector<std::string> events;
std::string name(void* s) { return s == reinterpret_cast<void*>(0x1) ? "caller" : "own"; }
void note(const std::string& e) { events.push_back(e); }
}  // namespace

void set_stream(Device& d, void* s) { d.stream = s; }
void* stream(Device& d) { return d.stream; }
StreamGuard::StreamGuard(void* s, int32_t) : handle(s) {}
StreamGuard::~StreamGuard() = default;
std::mutex& recording_lock() {
  static std::mutex lock;
  return lock;
}
void* capture_stream(Device&) { return reinterpret_cast<void*>(0x2); }
void wait_for(Device&, void* waiting, void* on) { note("wait " + name(waiting) + " on " + name(on)); }
void begin_capture(Device& d) {
  if (d.fail_capture) throw std::runtime_error("capture refused");
  note("begin capture on " + name(d.stream));
}
size_t end_capture(Device& d) {
  note("end capture");
  return d.graphs++;
}
void abandon_capture(Device&) { note("abandon capture"); }
void launch_graph(Device& d, size_t i) { note("graph " + std::to_string(i) + " on " + name(d.stream)); }
void drop_graphs(Device& d) {
  note("drop graphs");
  d.graphs = 0;
}

}  // namespace cuda
}  // namespace kiln

namespace {

using kiln::cuda::events;

enum Kind { kKernel, kTorch, kHost };  // kiln's own; a call into torch; a read on the host

struct Call {
  Kind kind;
  const char* what;
};

// The wrapper's main graph: each call asks replayed() and runs where told to.
void run_calls(const std::vector<Call>& calls, const char* fail_at = nullptr) {
  for (const Call& c : calls) {
    bool skip = c.kind == kTorch ? kiln::replayed_torch(c.what) : kiln::replayed(c.kind == kKernel, c.what);
    if (skip) continue;
    if (fail_at != nullptr && std::string(fail_at) == c.what) throw std::runtime_error(std::string(c.what) + " failed");
    events.push_back(std::string("ran ") + c.what);
  }
}

void print(const char* scenario, const std::string& tail) {
  std::printf("SCENARIO %s\n", scenario);
  for (const std::string& e : events) std::printf("%s\n", e.c_str());
  std::printf("%s\nEND\n", tail.c_str());
  events.clear();
}

const std::vector<Call> kBert = {{kKernel, "k0"}, {kKernel, "k1"}, {kTorch, "attention"}, {kKernel, "k2"},
                                  {kTorch, "mm"}};

void record_then_replay() {
  kiln::Replay replay;
  kiln::cuda::Device device;
  replay.run(device, [] { run_calls(kBert); });
  print("record", replay.describe());
  replay.run(device, [] { run_calls(kBert); });
  print("replay", replay.describe());
  try {
    replay.run(device, [] { run_calls({{kKernel, "k0"}, {kHost, "a predicate"}}); });
  } catch (const std::exception& e) {
    events.push_back(std::string("error: ") + e.what());
  }
  print("other calls", replay.describe());
}

void capture_refused() {
  kiln::Replay replay;
  kiln::cuda::Device device;
  device.fail_capture = true;
  replay.run(device, [] { run_calls(kBert); });
  print("refused", replay.describe());
  replay.run(device, [] { run_calls(kBert); });
  print("after refused", replay.describe());
}

void direct_call_fails() {
  kiln::Replay replay;
  kiln::cuda::Device device;
  int runs = 0;
  try {
    replay.run(device, [&] { run_calls(kBert, ++runs == 2 ? "attention" : nullptr); });
  } catch (const std::exception& e) {
    events.push_back(std::string("error: ") + e.what());
  }
  print("direct fails", replay.describe());
  replay.run(device, [] { run_calls(kBert); });
  print("records again", replay.describe());
}

void nothing_to_capture() {
  kiln::Replay replay;
  kiln::cuda::Device device;
  const std::vector<Call> externs = {{kTorch, "mm"}, {kTorch, "attention"}};
  replay.run(device, [&] { run_calls(externs); });
  replay.run(device, [&] { run_calls(externs); });
  print("nothing", replay.describe());
}

void turned_off() {
  kiln::Replay replay;
  kiln::cuda::Device device;
  replay.turn_off("KILN_CREATE_NO_GRAPHS");
  replay.run(device, [] { run_calls(kBert); });
  print("off", replay.describe());
}

// The host's pool hook: logs each event; fails at `fail_at` (`fail_times` times, if set).
int fail_at = 0;
int fail_times = -1;
int pool_hook(void* name, int event) {
  const char* events_[] = {"", "BEGIN", "END", "RELEASE"};
  events.push_back(std::string("pool ") + events_[event] + " of " + static_cast<const char*>(name));
  if (event != fail_at || fail_times == 0) return 0;
  if (fail_times > 0) --fail_times;
  return 1;
}

// A model's replay with the pool hook above; destroyed, it releases its pool.
struct PooledModel {
  PooledModel() {
    pool.set(pool_hook, const_cast<char*>("m"));
    replay.use_pool(&pool);
  }
  kiln::PoolHook pool;  // first: destroyed last, after the graphs
  kiln::Replay replay;
  kiln::cuda::Device device;
};

// BEGIN fails and the direct run fails too; the next run records again, and its BEGIN works.
void pooled_again() {
  const std::vector<Call> calls = {{kKernel, "k0"}, {kTorch, "mm"}};
  fail_at = KILN_POOL_BEGIN;
  fail_times = 1;
  std::string said;
  {
    PooledModel m;
    try {
      m.replay.run(m.device, [&] { run_calls(calls, "mm"); });
    } catch (const std::exception& e) {
      events.push_back(std::string("error: ") + e.what());
    }
    m.replay.run(m.device, [&] { run_calls(calls); });
    said = m.replay.describe();
  }
  print("pooled again", said);
  fail_at = 0;
  fail_times = -1;
}

// A model with a pool hook: `runs` runs of `calls`, each printed under its scenario name, then
// the model's destruction, printed under `destroyed` (its pool's release).
void run_pooled(const std::vector<Call>& calls, const std::vector<const char*>& runs, const char* destroyed) {
  std::string said;
  {
    PooledModel m;
    for (const char* scenario : runs) {
      m.replay.run(m.device, [&] { run_calls(calls); });
      said = m.replay.describe();
      if (destroyed != nullptr) print(scenario, said);
    }
  }
  print(destroyed != nullptr ? destroyed : runs.back(), destroyed != nullptr ? "" : said);
}

void pooled() {
  const std::vector<Call> calls = {{kKernel, "k0"}, {kTorch, "mm"}, {kHost, "a predicate"}, {kTorch, "conv"}};
  run_pooled(calls, {"pooled record", "pooled replay"}, "pooled destroyed");
  fail_at = KILN_POOL_BEGIN;
  run_pooled(calls, {"hook fails at begin"}, nullptr);
  fail_at = KILN_POOL_END;
  run_pooled(calls, {"hook fails at end"}, nullptr);
  fail_at = 0;
}

}  // namespace

int main() {
  record_then_replay();
  capture_refused();
  direct_call_fails();
  nothing_to_capture();
  turned_off();
  pooled();
  pooled_again();
  return 0;
}
