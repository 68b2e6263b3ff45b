// Calling an aten op kiln does not compile (a Fallback node) through torch's stable C shim:
// the generated block pushes the op's arguments in schema order, calls the dispatcher, and
// copies each returned tensor into kiln's preallocated output. Only the C shims are included
// (no ATen, no torch/csrc/stable C++ headers), so a wrapper still compiles in well under a second.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>  // the generated code spells inf and nan with it
#include <stdexcept>
#include <string>
#include <vector>

// Note: torch_call_dispatcher, stable lists and strings came in torch 2.10; a version macro a
// torch does not define reads as 0 in #if, hence `defined` before each comparison.
#if !defined(TORCH_VERSION_2_10_0) || TORCH_FEATURE_VERSION < TORCH_VERSION_2_10_0
#error "kiln_fallback.h needs torch >= 2.10 (torch_call_dispatcher and stable lists)"
#endif
#if defined(TORCH_VERSION_2_13_0) && TORCH_FEATURE_VERSION >= TORCH_VERSION_2_13_0
#define KILN_TORCH_2_13 1
#else
#define KILN_TORCH_2_13 0
#endif

namespace kiln {

// Note: how a StableIValue (a uint64_t) carries each schema type, as torch's own
// stableivalue_conversions.h and the dispatcher's to_ivalue/from_ivalue (shim_common.cpp) do:
//   int, SymInt: the int64_t's bits; float: the double's bits; bool: 0 or 1 in the low byte.
//   ScalarType, Layout, MemoryFormat: the shim's int32_t code (aoti_torch_dtype_float32() ...)
//     in the low 4 bytes, never c10's enum value: the shim translates.
//   Device: device index in the low 32 bits, shim device type in the high 32 bits.
//   Tensor: an AtenTensorHandle that the dispatcher takes over and deletes (so we pass a new
//     reference, never the caller's); a returned tensor is a new handle we must delete.
//   T? : 0 for None, else a pointer to a heap StableIValue holding the T, which the dispatcher
//     frees (torch_new_stable_ivalue / torch_delete_stable_ivalue from 2.13, new / delete before).
//   T[] : a StableListHandle (torch_new_list_reserve_size, torch_list_push_back), freed with
//     its elements by the dispatcher; a returned Tensor[] is a list we free ourselves.
//   str: a StringHandle (torch_new_string_handle), freed by the dispatcher (which, in 2.10 to
//     2.13, leaks a std::string copy of it per call: pytorch/pytorch#191340).
// `Scalar` (NumberType) and Generator (before 2.13) have no conversion: the dispatcher fails.
using StableValue = uint64_t;

// kiln_replay.h: an aten op allocates its results, so it runs directly, never in a CUDA graph.
// Weak: a program of this header alone, without kiln's runtime, has no graphs to tell.
[[gnu::weak]] bool replayed(bool capturable, const char* what);
inline void runs_directly(const char* what) {
  if (replayed != nullptr) replayed(false, what);
}

namespace detail {

template <typename T>
inline StableValue bits_of(T value) {
  static_assert(sizeof(T) <= sizeof(StableValue), "a stack slot holds 64 bits");
  StableValue bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}

template <typename T>
inline T value_of(StableValue bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace detail

// The kind of each value a call returns, as the generator reads it from the schema.
enum class Ret : uint8_t { kTensor, kTensorList };

class FallbackCall {
 public:
  // op: "aten::cumsum"; overload: "" for default; what: "aten.cumsum.default", for errors.
  FallbackCall(const char* op, const char* overload, const char* what)
      : op_(op), overload_(overload), what_(what) {}
  FallbackCall(const FallbackCall&) = delete;
  FallbackCall& operator=(const FallbackCall&) = delete;
  ~FallbackCall() {
    for (const Owned& o : owned_) release(o);
  }

  // The caller already asked the replay whether this call runs (a call into torch the runtime
  // makes, kiln_runtime.cpp): run() does not end the graph segment as a fallback op's does.
  void replay_decided() { direct_ = false; }

  void push_tensor(AtenTensorHandle borrowed) {
    AtenTensorHandle fresh = nullptr;
    check(aoti_torch_new_tensor_handle(borrowed, &fresh), "aoti_torch_new_tensor_handle");
    push_owned(Kind::kTensor, detail::bits_of(fresh));
  }
  void push_int(int64_t v) { values_.push_back(detail::bits_of(v)); }
  void push_double(double v) { values_.push_back(detail::bits_of(v)); }
  void push_bool(bool v) { values_.push_back(detail::bits_of(v)); }
  void push_none() { values_.push_back(0); }
  // shim codes, never c10's: aoti_torch_dtype_float32(), aoti_torch_layout_strided() ...
  void push_dtype(int32_t shim_dtype) { values_.push_back(detail::bits_of(shim_dtype)); }
  void push_enum(int32_t shim_code) { values_.push_back(detail::bits_of(shim_code)); }
  void push_device(int32_t shim_device_type, int32_t index) {
    values_.push_back(static_cast<StableValue>(static_cast<uint32_t>(index)) |
                      (static_cast<StableValue>(static_cast<uint32_t>(shim_device_type)) << 32));
  }
  void push_string(const char* text) {
    StringHandle handle = nullptr;
    check(torch_new_string_handle(text, std::strlen(text), &handle), "torch_new_string_handle");
    push_owned(Kind::kString, detail::bits_of(handle));
  }

  // The value pushed last becomes the present value of an optional (`T?`) argument.
  void wrap_optional() {
    const size_t frame = list_starts_.empty() ? 0 : list_starts_.back();  // the open list's first value
    if (values_.size() <= frame) fail("wrap_optional() with no value to wrap");
    owned_.reserve(owned_.size() + 1);  // so owning the box cannot throw
    StableValue* box = new_box();
    *box = values_.back();
    owned_.push_back(Owned{Kind::kBox, detail::bits_of(box)});
    values_.back() = detail::bits_of(box);
  }

  // The values pushed between begin_list() and end_list() become one list argument.
  void begin_list() { list_starts_.push_back(values_.size()); }
  void end_list() {
    if (list_starts_.empty()) fail("end_list() without begin_list()");
    const size_t start = list_starts_.back();
    StableListHandle list = nullptr;
    owned_.reserve(owned_.size() + 1);
    check(torch_new_list_reserve_size(values_.size() - start, &list), "torch_new_list_reserve_size");
    owned_.push_back(Owned{Kind::kList, detail::bits_of(list)});
    for (size_t i = start; i < values_.size(); ++i) {
      check(torch_list_push_back(list, values_[i]), "torch_list_push_back");
    }
    values_.resize(start);
    values_.push_back(detail::bits_of(list));
    list_starts_.pop_back();
  }
  void push_int_list(std::initializer_list<int64_t> values) {
    begin_list();
    for (int64_t v : values) push_int(v);
    end_list();
  }

  // Calls the op; its returns (ret0 first) then wait for copy_tensor / copy_tensor_list.
  void run(std::initializer_list<Ret> returns) {
    if (ran_) fail("run() twice");
    if (!list_starts_.empty()) fail("a list was begun and never ended");
    ran_ = true;
    if (direct_) runs_directly(what_);
    std::vector<StableValue> stack(std::max(values_.size(), returns.size()), 0);
    std::copy(values_.begin(), values_.end(), stack.begin());
    owned_.reserve(std::max(owned_.size(), returns.size()));  // so taking the returns cannot throw
    rets_.reserve(returns.size());
    // Note: the dispatcher owns every argument from here on, whether or not it succeeds: it
    // converts them all into IValues (deleting our handles, boxes and lists) before it can fail
    // in the op itself. A failure before that (an op name torch does not know, a schema type
    // with no conversion) leaks them; the generator checks both against torch's schema.
    owned_.clear();
    // Note: torch_call_dispatcher is aoti_torch_call_dispatcher plus the version of the headers
    // we were built with, which lets torch adapt the stack to a schema that changed since.
    if (torch_call_dispatcher(op_, overload_, stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
      fail(last_error());
    }
    size_t slot = 0;
    for (Ret r : returns) {
      const StableValue value = stack[slot++];
      owned_.push_back(Owned{r == Ret::kTensor ? Kind::kTensor : Kind::kList, value});
      rets_.push_back(Returned{r, value, 0, 0});
    }
    for (Returned& ret : rets_) {
      if (ret.kind == Ret::kTensorList) read_tensor_list(ret);
    }
  }

  // Copies return `index` into `out` (borrowed, already of the right shape and dtype).
  void copy_tensor(size_t index, AtenTensorHandle out) {
    copy(index, out, returned(index, Ret::kTensor).value);
  }

  // Copies the tensors of a returned Tensor[] into `outs`, one each.
  void copy_tensor_list(size_t index, std::initializer_list<AtenTensorHandle> outs) {
    const Returned& ret = returned(index, Ret::kTensorList);
    if (ret.count != outs.size()) {
      fail("return " + std::to_string(index) + " holds " + std::to_string(ret.count) + " tensors, kiln expected " +
           std::to_string(outs.size()));
    }
    size_t i = ret.first;
    for (AtenTensorHandle out : outs) copy(index, out, items_[i++]);
  }

 private:
  // What the call owns until it is destroyed (returns included: the block ends right after).
  enum class Kind : uint8_t { kTensor, kString, kBox, kList };
  struct Owned {
    Kind kind;
    StableValue value;
  };
  struct Returned {
    Ret kind;
    StableValue value;
    size_t first;  // a Tensor[]'s tensors: items_[first, first + count)
    size_t count;
  };

  void push_owned(Kind kind, StableValue value) {
    owned_.push_back(Owned{kind, value});  // on bad_alloc the value leaks: nothing better to do
    values_.push_back(value);
  }

  StableValue* new_box() const {
#if KILN_TORCH_2_13
    StableValue* box = nullptr;
    check(torch_new_stable_ivalue(&box), "torch_new_stable_ivalue");
    return box;
#else
    return new StableValue(0);
#endif
  }

  // A returned Tensor[]: its tensors become ours one by one (a failed read leaks only the rest).
  void read_tensor_list(Returned& ret) {
    const auto list = detail::value_of<StableListHandle>(ret.value);
    size_t size = 0;
    check(torch_list_size(list, &size), "torch_list_size");
    ret.first = items_.size();
    owned_.reserve(owned_.size() + size);
    items_.reserve(items_.size() + size);
    for (size_t i = 0; i < size; ++i) {
      StableValue item = 0;
      check(torch_list_get_item(list, i, &item), "torch_list_get_item");
      owned_.push_back(Owned{Kind::kTensor, item});
      items_.push_back(item);
      ++ret.count;
    }
  }

  const Returned& returned(size_t index, Ret kind) const {
    if (index >= rets_.size() || rets_[index].kind != kind) {
      fail("return " + std::to_string(index) + " is missing or of another kind");
    }
    return rets_[index];
  }

  void copy(size_t index, AtenTensorHandle out, StableValue tensor) const {
    if (aoti_torch_copy_(out, detail::value_of<AtenTensorHandle>(tensor), 0) != AOTI_TORCH_SUCCESS) {
      fail("copying return " + std::to_string(index) + ": " + last_error());
    }
  }

  // Error codes are ignored: this runs in the destructor.
  static void release(const Owned& o) noexcept {
    switch (o.kind) {
      case Kind::kTensor:
        aoti_torch_delete_tensor_object(detail::value_of<AtenTensorHandle>(o.value));
        break;
      case Kind::kString:
        torch_delete_string(detail::value_of<StringHandle>(o.value));
        break;
      case Kind::kBox:
#if KILN_TORCH_2_13
        torch_delete_stable_ivalue(detail::value_of<StableValue*>(o.value));
#else
        delete detail::value_of<StableValue*>(o.value);
#endif
        break;
      case Kind::kList:  // its elements are owned entries of their own
        torch_delete_list(detail::value_of<StableListHandle>(o.value));
        break;
    }
  }

  static std::string last_error() {
#if KILN_TORCH_2_13
    const char* what = torch_exception_get_what_without_backtrace();
    return what != nullptr ? what : "unknown error";
#else
    return "an error in torch (torch printed it to stderr)";
#endif
  }

  void check(AOTITorchError err, const char* call) const {
    if (err != AOTI_TORCH_SUCCESS) fail(std::string(call) + " failed: " + last_error());
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(std::string(what_) + " failed: " + why);
  }

  const char* op_;
  const char* overload_;
  const char* what_;
  bool ran_ = false;
  bool direct_ = true;  // run() tells the replay it runs directly (see replay_decided)
  std::vector<StableValue> values_;  // the argument stack, being built
  std::vector<size_t> list_starts_;  // where each open list's elements begin in values_
  std::vector<Owned> owned_;  // handles, boxes and lists to free
  std::vector<Returned> rets_;
  std::vector<StableValue> items_;  // the tensors of returned lists
};

}  // namespace kiln
