// Runs a model compiled by kiln from C++, with no Python: float32 inputs filled with a ramp,
// then the first values and the sum of each output. A cuda model gets its inputs on the GPU.
//   usage: run_model BUILD_DIR
#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kiln_model.h"

// A copy of `t` on the device type given (the CPU, or the GPU for a cuda model).
AtenTensorHandle copy_to(AtenTensorHandle t, int32_t device) {
  int64_t ndim = 0;
  int64_t *sizes = nullptr, *strides = nullptr;
  aoti_torch_get_dim(t, &ndim);
  aoti_torch_get_sizes(t, &sizes);
  aoti_torch_get_strides(t, &strides);
  AtenTensorHandle out = nullptr;
  aoti_torch_empty_strided(ndim, sizes, strides, aoti_torch_dtype_float32(), device, 0, &out);
  aoti_torch_copy_(out, t, 0);
  return out;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BUILD_DIR\n", argv[0]);
    return 2;
  }
  KilnModel* model = nullptr;
  std::string weights = std::string(argv[1]) + "/weights.safetensors";
  if (kiln_model_create(weights.c_str(), &model) != 0) {
    std::fprintf(stderr, "kiln: %s\n", kiln_last_error());
    return 1;
  }
  bool on_gpu = std::string(kiln_model_target()) == "cuda";
  std::vector<AtenTensorHandle> inputs;
  for (size_t i = 0; i < kiln_model_num_inputs(model); ++i) {
    size_t ndim = kiln_model_input_ndim(model, i);
    const int64_t* sizes = kiln_model_input_sizes(model, i);
    AtenTensorHandle t = nullptr;
    aoti_torch_empty_strided(ndim, sizes, kiln_model_input_strides(model, i), aoti_torch_dtype_float32(),
                             aoti_torch_device_type_cpu(), 0, &t);
    void* data = nullptr;
    aoti_torch_get_data_ptr(t, &data);
    int64_t numel = 1;
    for (size_t d = 0; d < ndim; ++d) numel *= sizes[d];
    for (int64_t k = 0; k < numel; ++k) static_cast<float*>(data)[k] = 0.01f * static_cast<float>(k % 100);
    if (on_gpu) {
      AtenTensorHandle host = t;
      t = copy_to(host, aoti_torch_device_type_cuda());
      aoti_torch_delete_tensor_object(host);
    }
    inputs.push_back(t);
  }
  std::vector<AtenTensorHandle> outputs(kiln_model_num_outputs(model), nullptr);  // NULL: allocated by run
  if (kiln_model_run(model, inputs.data(), inputs.size(), outputs.data(), outputs.size()) != 0) {
    std::fprintf(stderr, "kiln: %s\n", kiln_last_error());
    return 1;
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (on_gpu) {  // read back on the host (copy_ waits for the GPU)
      AtenTensorHandle device = outputs[i];
      outputs[i] = copy_to(device, aoti_torch_device_type_cpu());
      aoti_torch_delete_tensor_object(device);
    }
    void* data = nullptr;
    int64_t numel = 0;
    aoti_torch_get_data_ptr(outputs[i], &data);
    aoti_torch_get_numel(outputs[i], &numel);
    const float* out = static_cast<const float*>(data);
    double sum = 0;
    for (int64_t k = 0; k < numel; ++k) sum += out[k];
    std::printf("%s: %g %g %g ... sum %.6f\n", kiln_model_output_name(model, i), out[0], out[1], out[2], sum);
    aoti_torch_delete_tensor_object(outputs[i]);
  }
  for (AtenTensorHandle t : inputs) aoti_torch_delete_tensor_object(t);
  kiln_model_destroy(model);
  return 0;
}
