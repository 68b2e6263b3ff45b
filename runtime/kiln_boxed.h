// Calling an aten op whose schema takes a Scalar (NumberType), which torch's stable dispatcher
// cannot pass: the generated block pushes the arguments onto a kiln::BoxedCall, which hands
// them to kiln_boxed_call (kiln_boxed.cpp, the one runtime unit built against ATen, compiled
// only for models that need it) as tagged 64-bit words. That builds torch's IValues and calls
// the op boxed. The generated code sees the same push API as kiln::FallbackCall.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln_fallback.h"  // kiln::Ret

extern "C" {
// Tags of the words kiln_boxed_call reads: one per value; a list is LIST_BEGIN (word: the
// element kind, a kiln_boxed_list) ... LIST_END.
enum kiln_boxed_tag : int32_t {
  KILN_BOXED_TENSOR = 0,  // word: a borrowed AtenTensorHandle
  KILN_BOXED_INT = 1,
  KILN_BOXED_DOUBLE = 2,  // word: the double's bits
  KILN_BOXED_BOOL = 3,
  KILN_BOXED_NONE = 4,
  KILN_BOXED_SCALAR_INT = 5,
  KILN_BOXED_SCALAR_DOUBLE = 6,
  KILN_BOXED_SCALAR_BOOL = 7,
  KILN_BOXED_STRING = 8,  // word: a const char*, alive for the call
  KILN_BOXED_DEVICE = 9,  // word: shim device type in the high 32 bits, index in the low
  KILN_BOXED_LIST_BEGIN = 10,
  KILN_BOXED_LIST_END = 11,
};
enum kiln_boxed_list : int32_t {
  KILN_LIST_INT = 0,
  KILN_LIST_DOUBLE = 1,
  KILN_LIST_BOOL = 2,
  KILN_LIST_TENSOR = 3,
  KILN_LIST_OPTIONAL_TENSOR = 4,
};
// Calls op.overload ("" for the default) with the values; its returns, each a tensor or a
// tensor list, are flattened into rets (new handles the caller deletes) and counted per return
// in counts. 0 on success; otherwise the error text is in error (NUL-terminated).
int kiln_boxed_call(const char* op, const char* overload, const int32_t* tags, const int64_t* words, size_t n,
                    AtenTensorHandle* rets, size_t rets_cap, int64_t* counts, size_t n_returns, char* error,
                    size_t error_cap);
}

namespace kiln {

class BoxedCall {
 public:
  BoxedCall(const char* op, const char* overload, const char* what) : op_(op), overload_(overload), what_(what) {}
  BoxedCall(const BoxedCall&) = delete;
  BoxedCall& operator=(const BoxedCall&) = delete;
  ~BoxedCall() {
    for (AtenTensorHandle h : rets_) aoti_torch_delete_tensor_object(h);
  }

  void push_tensor(AtenTensorHandle borrowed) { push(KILN_BOXED_TENSOR, detail::bits_of(borrowed)); }
  void push_int(int64_t v) { push(KILN_BOXED_INT, v); }
  void push_double(double v) { push(KILN_BOXED_DOUBLE, detail::bits_of(v)); }
  void push_bool(bool v) { push(KILN_BOXED_BOOL, v ? 1 : 0); }
  void push_none() { push(KILN_BOXED_NONE, 0); }
  void push_scalar_int(int64_t v) { push(KILN_BOXED_SCALAR_INT, v); }
  void push_scalar_double(double v) { push(KILN_BOXED_SCALAR_DOUBLE, detail::bits_of(v)); }
  void push_scalar_bool(bool v) { push(KILN_BOXED_SCALAR_BOOL, v ? 1 : 0); }
  // dtype, layout and memory format codes of the shim are c10's enum values, held as ints.
  void push_dtype(int32_t shim_dtype) { push_int(shim_dtype); }
  void push_enum(int32_t shim_code) { push_int(shim_code); }
  void push_device(int32_t shim_device_type, int32_t index) {
    push(KILN_BOXED_DEVICE, static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(shim_device_type)) << 32) |
                                                 static_cast<uint32_t>(index)));
  }
  void push_string(const char* text) { push(KILN_BOXED_STRING, detail::bits_of(text)); }
  void wrap_optional() {}  // an IValue holds a present optional as the value itself
  void begin_list(kiln_boxed_list kind) { push(KILN_BOXED_LIST_BEGIN, kind); }
  void end_list() { push(KILN_BOXED_LIST_END, 0); }
  void push_int_list(std::initializer_list<int64_t> values) {
    begin_list(KILN_LIST_INT);
    for (int64_t v : values) push_int(v);
    end_list();
  }

  void run(std::initializer_list<Ret> returns) {
    runs_directly(what_);  // kiln_fallback.h
    kinds_.assign(returns.begin(), returns.end());
    counts_.assign(kinds_.size(), 0);
    std::vector<AtenTensorHandle> got(kMaxReturned, nullptr);
    char error[1024] = {0};
    const int failed = kiln_boxed_call(op_, overload_, tags_.data(), words_.data(), tags_.size(), got.data(),
                                       got.size(), counts_.data(), counts_.size(), error, sizeof(error));
    size_t total = 0;
    for (int64_t c : counts_) total += static_cast<size_t>(c);
    rets_.assign(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(std::min(total, got.size())));
    if (failed != 0) throw std::runtime_error(std::string(what_) + " failed: " + error);
  }

  void copy_tensor(size_t index, AtenTensorHandle out) { copy_tensor_list(index, {out}); }
  void copy_tensor_list(size_t index, std::initializer_list<AtenTensorHandle> outs) {
    if (index >= counts_.size() || static_cast<size_t>(counts_[index]) != outs.size()) {
      throw std::runtime_error(std::string(what_) + " failed: return " + std::to_string(index) +
                               " holds another number of tensors than kiln expected");
    }
    size_t first = 0;
    for (size_t i = 0; i < index; ++i) first += static_cast<size_t>(counts_[i]);
    for (AtenTensorHandle out : outs) {
      if (aoti_torch_copy_(out, rets_[first++], 0) != AOTI_TORCH_SUCCESS) {
        throw std::runtime_error(std::string(what_) + " failed: copying return " + std::to_string(index));
      }
    }
  }

 private:
  static constexpr size_t kMaxReturned = 4096;  // tensors in all returns together

  void push(int32_t tag, int64_t word) {
    tags_.push_back(tag);
    words_.push_back(word);
  }

  const char* op_;
  const char* overload_;
  const char* what_;
  std::vector<int32_t> tags_;
  std::vector<int64_t> words_;
  std::vector<Ret> kinds_;
  std::vector<int64_t> counts_;
  std::vector<AtenTensorHandle> rets_;
};

}  // namespace kiln
