#include "kiln_cpu.h"

extern "C" void kiln_k0(const float* __restrict in0, float* __restrict out0) {
  #pragma omp parallel for collapse(1) schedule(static)
  for (int64_t i0 = 0; i0 < 8LL; ++i0)
  {
    float tmp0;
    float tmp1;
    {
      float acc0_mean[8] = {}, acc0_m2[8] = {}, acc0_n[8] = {};
      {
        for (int64_t r0_base = 0; r0_base < 32LL; r0_base += 8)
        #pragma omp simd
        for (int64_t r0_lane = 0; r0_lane < 8; ++r0_lane)
        {
          const int64_t r0 = r0_base + r0_lane;
          const int64_t n1_0 = i0;
          const int64_t n1_1 = r0;
          const float n1_2 = in0[n1_0 * 33LL + n1_1];
          const float n1_3 = static_cast<float>(0x1.0000000000000p+1);
          const float n1_4 = static_cast<float>((n1_2 * n1_3));
          { acc0_n[r0_lane] += 1; const auto d = n1_4 - acc0_mean[r0_lane]; acc0_mean[r0_lane] += d / acc0_n[r0_lane]; acc0_m2[r0_lane] += d * (n1_4 - acc0_mean[r0_lane]); }
        }
        for (int64_t r0 = 32LL; r0 < 33LL; ++r0)
        {
          const int64_t r0_lane = 0;
          const int64_t n1_0 = i0;
          const int64_t n1_1 = r0;
          const float n1_2 = in0[n1_0 * 33LL + n1_1];
          const float n1_3 = static_cast<float>(0x1.0000000000000p+1);
          const float n1_4 = static_cast<float>((n1_2 * n1_3));
          { acc0_n[r0_lane] += 1; const auto d = n1_4 - acc0_mean[r0_lane]; acc0_mean[r0_lane] += d / acc0_n[r0_lane]; acc0_m2[r0_lane] += d * (n1_4 - acc0_mean[r0_lane]); }
        }
      }
      kiln::Welford<float> acc0;
      for (int l = 0; l < 8; ++l) {
        kiln::Welford<float> part;
        part.mean = acc0_mean[l]; part.m2 = acc0_m2[l];
        part.n = static_cast<int64_t>(acc0_n[l]);
        acc0.merge(part);
      }
      tmp0 = acc0.mean;
      tmp1 = acc0.m2;
    }
    {
      #pragma omp simd
      for (int64_t r0 = 0; r0 < 33LL; ++r0)
      {
        const int64_t n2_0 = i0;
        const int64_t n2_1 = r0;
        const float n2_2 = in0[n2_0 * 33LL + n2_1];
        const float n2_3 = static_cast<float>(0x1.0000000000000p+1);
        const float n2_4 = static_cast<float>((n2_2 * n2_3));
        const float n2_5 = tmp0;
        const float n2_6 = static_cast<float>((n2_4 - n2_5));
        const float n2_7 = tmp1;
        const float n2_8 = static_cast<float>(0x1.0800000000000p+5);
        const float n2_9 = static_cast<float>((n2_7 / n2_8));
        const float n2_10 = static_cast<float>(0x1.4f8b588e368f1p-17);
        const float n2_11 = static_cast<float>((n2_9 + n2_10));
        const float n2_12 = static_cast<float>(kiln::rsqrt(n2_11));
        const float n2_13 = static_cast<float>((n2_6 * n2_12));
        out0[i0 * 33LL + r0] = n2_13;
      }
    }
  }
}
