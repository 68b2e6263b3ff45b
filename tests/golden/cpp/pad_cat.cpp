#include "kiln_cpu.h"

extern "C" void kiln_k0(const float* __restrict in0, float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 11LL; ++i0)
  #pragma omp simd
  for (int64_t i1 = 0; i1 < 69LL; ++i1)
  {
    const int64_t n1_0 = i1;
    const int64_t n1_1 = static_cast<int64_t>(1LL);
    const bool n1_2 = static_cast<bool>((n1_0 >= n1_1));
    const int64_t n1_3 = static_cast<int64_t>(67LL);
    const bool n1_4 = static_cast<bool>((n1_0 < n1_3));
    const bool n1_5 = static_cast<bool>((static_cast<bool>(n1_2) && static_cast<bool>(n1_4)));
    const int64_t n1_6 = i0;
    const int64_t n1_7 = static_cast<int64_t>(8LL);
    const bool n1_8 = static_cast<bool>((n1_6 < n1_7));
    const bool n1_9 = static_cast<bool>((static_cast<bool>(n1_5) && static_cast<bool>(n1_8)));
    const int64_t n1_10 = static_cast<int64_t>(-1LL);
    const int64_t n1_11 = (n1_0 + n1_10);
    const int64_t n1_12 = static_cast<int64_t>(33LL);
    const bool n1_13 = static_cast<bool>((n1_11 < n1_12));
    const float n1_14 = (((n1_9 && n1_13)) ? in0[n1_6 * 33LL + n1_11] : float(0));
    const bool n1_15 = static_cast<bool>((n1_11 >= n1_12));
    const int64_t n1_16 = static_cast<int64_t>(-34LL);
    const int64_t n1_17 = (n1_0 + n1_16);
    const float n1_18 = (((n1_9 && n1_15)) ? in0[n1_6 * 33LL + n1_17] : float(0));
    const float n1_19 = static_cast<float>(0x1.0000000000000p+1);
    const float n1_20 = static_cast<float>((n1_18 * n1_19));
    const float n1_21 = static_cast<float>(0x0.0p+0);
    const float n1_22 = (n1_15 ? n1_20 : n1_21);
    const float n1_23 = (n1_13 ? n1_14 : n1_22);
    const float n1_24 = static_cast<float>(-0x1.0000000000000p+0);
    const float n1_25 = (n1_9 ? n1_23 : n1_24);
    const float n1_26 = static_cast<float>(0x1.0000000000000p+0);
    const float n1_27 = static_cast<float>((n1_25 + n1_26));
    out0[i0 * 69LL + i1] = n1_27;
  }
}
