#include "kiln_cpu.h"

extern "C" void kiln_k0(const int64_t* __restrict in0, const float* __restrict in1, float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 5LL; ++i0)
  for (int64_t i1 = 0; i1 < 3LL; ++i1)
  #pragma omp simd
  for (int64_t i2 = 0; i2 < 33LL; ++i2)
  {
    const int64_t n1_0 = i0;
    const int64_t n1_1 = i1;
    const int64_t n1_2 = in0[n1_0 * 3LL + n1_1];
    const int64_t n1_3 = i2;
    const float n1_4 = in1[n1_2 * 33LL + n1_3];
    const float n1_5 = static_cast<float>(0x1.0000000000000p+1);
    const float n1_6 = static_cast<float>((n1_4 * n1_5));
    out0[i0 * 99LL + i1 * 33LL + i2] = n1_6;
  }
}
