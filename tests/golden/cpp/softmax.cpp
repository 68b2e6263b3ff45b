#include "kiln_cpu.h"

extern "C" void kiln_k0(const float* __restrict in0, float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 8LL; ++i0)
  {
    float tmp0;
    float tmp1;
    {
      float acc0_l[8];
      for (int l = 0; l < 8; ++l) acc0_l[l] = -std::numeric_limits<float>::infinity();
      {
        for (int64_t r0_base = 0; r0_base < 32LL; r0_base += 8)
        #pragma omp simd
        for (int64_t r0_lane = 0; r0_lane < 8; ++r0_lane)
        {
          const int64_t r0 = r0_base + r0_lane;
          const int64_t n1_0 = i0;
          const int64_t n1_1 = r0;
          const float n1_2 = in0[n1_0 * 33LL + n1_1];
          acc0_l[r0_lane] = kiln::maximum(acc0_l[r0_lane], n1_2);
        }
        for (int64_t r0 = 32LL; r0 < 33LL; ++r0)
        {
          const int64_t r0_lane = 0;
          const int64_t n1_0 = i0;
          const int64_t n1_1 = r0;
          const float n1_2 = in0[n1_0 * 33LL + n1_1];
          acc0_l[r0_lane] = kiln::maximum(acc0_l[r0_lane], n1_2);
        }
      }
      float acc0 = -std::numeric_limits<float>::infinity();
      for (int l = 0; l < 8; ++l) { acc0 = kiln::maximum(acc0, acc0_l[l]); }
      tmp0 = acc0;
    }
    {
      float acc1_l[8];
      for (int l = 0; l < 8; ++l) acc1_l[l] = 0;
      {
        for (int64_t r0_base = 0; r0_base < 32LL; r0_base += 8)
        #pragma omp simd
        for (int64_t r0_lane = 0; r0_lane < 8; ++r0_lane)
        {
          const int64_t r0 = r0_base + r0_lane;
          const int64_t n2_0 = i0;
          const int64_t n2_1 = r0;
          const float n2_2 = in0[n2_0 * 33LL + n2_1];
          const float n2_3 = tmp0;
          const float n2_4 = static_cast<float>((n2_2 - n2_3));
          const float n2_5 = static_cast<float>(kiln::exp(n2_4));
          acc1_l[r0_lane] += n2_5;
        }
        for (int64_t r0 = 32LL; r0 < 33LL; ++r0)
        {
          const int64_t r0_lane = 0;
          const int64_t n2_0 = i0;
          const int64_t n2_1 = r0;
          const float n2_2 = in0[n2_0 * 33LL + n2_1];
          const float n2_3 = tmp0;
          const float n2_4 = static_cast<float>((n2_2 - n2_3));
          const float n2_5 = static_cast<float>(kiln::exp(n2_4));
          acc1_l[r0_lane] += n2_5;
        }
      }
      float acc1 = 0;
      for (int l = 0; l < 8; ++l) { acc1 += acc1_l[l]; }
      tmp1 = acc1;
    }
    {
      #pragma omp simd
      for (int64_t r0 = 0; r0 < 33LL; ++r0)
      {
        const int64_t n3_0 = i0;
        const int64_t n3_1 = r0;
        const float n3_2 = in0[n3_0 * 33LL + n3_1];
        const float n3_3 = tmp0;
        const float n3_4 = static_cast<float>((n3_2 - n3_3));
        const float n3_5 = static_cast<float>(kiln::exp(n3_4));
        const float n3_6 = tmp1;
        const float n3_7 = static_cast<float>((n3_5 / n3_6));
        out0[i0 * 33LL + r0] = n3_7;
      }
    }
  }
}
