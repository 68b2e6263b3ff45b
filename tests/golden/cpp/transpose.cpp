#include "kiln_cpu.h"

extern "C" void kiln_k0(const float* __restrict in0, float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 33LL; ++i0)
  #pragma omp simd
  for (int64_t i1 = 0; i1 < 8LL; ++i1)
  {
    const int64_t n1_0 = i1;
    const int64_t n1_1 = i0;
    const float n1_2 = in0[n1_0 * 33LL + n1_1];
    const float n1_3 = static_cast<float>(0x1.0000000000000p+1);
    const float n1_4 = static_cast<float>((n1_2 * n1_3));
    const float n1_5 = static_cast<float>(0x1.0000000000000p+0);
    const float n1_6 = static_cast<float>((n1_4 + n1_5));
    out0[i0 * 8LL + i1] = n1_6;
  }
}
