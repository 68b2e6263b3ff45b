// kiln_boxed_call (kiln_boxed.h): an aten op called boxed, with IValues built from kiln's
// tagged words. The one runtime unit built against ATen's headers (it takes seconds, where the
// rest take a fraction of one), so tasks/link builds it only for a model that calls it, and
// caches it as a runtime item of its own.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>
#include <c10/core/Scalar.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "kiln_boxed.h"

namespace {

double double_of(int64_t word) {
  double value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

at::Tensor tensor_of(int64_t word) {
  AtenTensorHandle handle;
  std::memcpy(&handle, &word, sizeof(handle));
  return *reinterpret_cast<at::Tensor*>(handle);  // a new reference; the caller keeps its own
}

class Reader {
 public:
  Reader(const int32_t* tags, const int64_t* words, size_t n) : tags_(tags), words_(words), n_(n) {}

  bool done() const { return at_ >= n_; }

  c10::IValue value() {
    if (done()) throw std::runtime_error("kiln_boxed_call: fewer values than the schema takes");
    const int32_t tag = tags_[at_];
    const int64_t word = words_[at_++];
    switch (tag) {
      case KILN_BOXED_TENSOR: return tensor_of(word);
      case KILN_BOXED_INT: return word;
      case KILN_BOXED_DOUBLE: return double_of(word);
      case KILN_BOXED_BOOL: return word != 0;
      case KILN_BOXED_NONE: return c10::IValue();
      case KILN_BOXED_SCALAR_INT: return c10::Scalar(word);
      case KILN_BOXED_SCALAR_DOUBLE: return c10::Scalar(double_of(word));
      case KILN_BOXED_SCALAR_BOOL: return c10::Scalar(word != 0);
      case KILN_BOXED_STRING: {
        const char* text;
        std::memcpy(&text, &word, sizeof(text));
        return std::string(text);
      }
      case KILN_BOXED_DEVICE: {
        const auto type = static_cast<c10::DeviceType>(static_cast<int32_t>(static_cast<uint64_t>(word) >> 32));
        const auto index = static_cast<int32_t>(static_cast<uint32_t>(word));
        return c10::Device(type, static_cast<c10::DeviceIndex>(index));
      }
      case KILN_BOXED_LIST_BEGIN: return list(static_cast<int32_t>(word));
      default: throw std::runtime_error("kiln_boxed_call: unknown tag " + std::to_string(tag));
    }
  }

 private:
  c10::IValue list(int32_t kind) {
    switch (kind) {
      case KILN_LIST_INT: return items<int64_t>([](const c10::IValue& v) { return v.toInt(); });
      case KILN_LIST_DOUBLE: return items<double>([](const c10::IValue& v) { return v.toDouble(); });
      case KILN_LIST_BOOL: return items<bool>([](const c10::IValue& v) { return v.toBool(); });
      case KILN_LIST_TENSOR: return items<at::Tensor>([](const c10::IValue& v) { return v.toTensor(); });
      case KILN_LIST_OPTIONAL_TENSOR:
        return items<std::optional<at::Tensor>>([](const c10::IValue& v) {
          return v.isNone() ? std::optional<at::Tensor>() : std::optional<at::Tensor>(v.toTensor());
        });
      default: throw std::runtime_error("kiln_boxed_call: unknown list kind " + std::to_string(kind));
    }
  }

  template <typename T, typename Convert>
  c10::IValue items(Convert convert) {
    c10::List<T> out;
    while (!done() && tags_[at_] != KILN_BOXED_LIST_END) out.push_back(convert(value()));
    if (done()) throw std::runtime_error("kiln_boxed_call: a list without its end");
    ++at_;
    return out;
  }

  const int32_t* tags_;
  const int64_t* words_;
  size_t n_;
  size_t at_ = 0;
};

AtenTensorHandle handle_of(const at::Tensor& t) { return reinterpret_cast<AtenTensorHandle>(new at::Tensor(t)); }

}  // namespace

extern "C" int kiln_boxed_call(const char* op, const char* overload, const int32_t* tags, const int64_t* words,
                               size_t n, AtenTensorHandle* rets, size_t rets_cap, int64_t* counts, size_t n_returns,
                               char* error, size_t error_cap) {
  size_t taken = 0;
  try {
    const c10::OperatorHandle handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, overload);
    torch::jit::Stack stack;
    Reader reader(tags, words, n);
    while (!reader.done()) stack.push_back(reader.value());
    handle.callBoxed(stack);
    if (stack.size() != n_returns) {
      throw std::runtime_error("returned " + std::to_string(stack.size()) + " values, kiln expected " +
                               std::to_string(n_returns));
    }
    for (size_t r = 0; r < n_returns; ++r) {
      std::vector<at::Tensor> tensors;
      if (stack[r].isTensor()) {
        tensors.push_back(stack[r].toTensor());
      } else if (stack[r].isTensorList()) {
        for (const at::Tensor& t : stack[r].toTensorVector()) tensors.push_back(t);
      } else {
        throw std::runtime_error("return " + std::to_string(r) + " is not a tensor or a tensor list");
      }
      if (taken + tensors.size() > rets_cap) throw std::runtime_error("more returned tensors than kiln holds");
      for (const at::Tensor& t : tensors) rets[taken++] = handle_of(t);
      counts[r] = static_cast<int64_t>(tensors.size());
    }
    return 0;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const size_t length = std::min(what.size(), error_cap - 1);
    std::memcpy(error, what.data(), length);
    error[length] = '\0';
    return 1;
  }
}
