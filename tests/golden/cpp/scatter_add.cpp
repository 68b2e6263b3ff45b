#include "kiln_cpu.h"

extern "C" void kiln_k0(float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 8LL; ++i0)
  #pragma omp simd
  for (int64_t i1 = 0; i1 < 3LL; ++i1)
  {
    const float n1_0 = static_cast<float>(0x0.0p+0);
    out0[i0 * 3LL + i1] = n1_0;
  }
}

#include "kiln_cpu.h"

extern "C" void kiln_k1(const int64_t* __restrict in0, const float* __restrict in1, float* __restrict out0) {
  for (int64_t i0 = 0; i0 < 5LL; ++i0)
  for (int64_t i1 = 0; i1 < 3LL; ++i1)
  {
    const int64_t n1_0 = i0;
    const int64_t n1_1 = i1;
    const int64_t n1_2 = in0[n1_0 * 3LL + n1_1];
    const int64_t n1_3 = static_cast<int64_t>(0LL);
    const bool n1_4 = static_cast<bool>((n1_2 < n1_3));
    const int64_t n1_5 = static_cast<int64_t>(8LL);
    const int64_t n1_6 = (n1_2 + n1_5);
    const int64_t n1_7 = (n1_4 ? n1_6 : n1_2);
    const float n1_8 = in1[n1_0 * 33LL + n1_1];
    out0[n1_7 * 3LL + n1_1] += n1_8;
  }
}
