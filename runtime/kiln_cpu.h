// Helpers for kiln's generated C++ kernels: fp16/bf16 storage, Python-style integer division,
// NaN-propagating min/max. Plain C++17, no torch headers: a kernel file compiles in well under
// a second.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <type_traits>

namespace kiln {

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Note: round to nearest even, NaN kept quiet, as torch's c10::BFloat16 does.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float half_to_float(uint16_t h) {
  return static_cast<float>(*reinterpret_cast<const _Float16*>(&h));
}

inline uint16_t float_to_half(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Floor division and modulo as Python and torch define them; 0 for a zero divisor, so a lane
// that a mask discards can never trap. The lowest integer over -1 is the one quotient that
// overflows (x86 traps on it: SIGFPE): it wraps, as torch's does, and its remainder is 0.
template <typename T>
inline T floordiv(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return static_cast<T>(static_cast<std::make_unsigned_t<T>>(0) - static_cast<std::make_unsigned_t<T>>(a));
  }
  T q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

template <typename T>
inline T mod(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
  }
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

// fmod on integers: C's truncated remainder (the dividend's sign), guarded as mod is.
template <typename T>
inline T fmod_int(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
  }
  return static_cast<T>(a % b);
}

// Integer powers as torch computes them (ATen's powi): square and multiply in the integer type,
// wrapping on overflow (here in unsigned arithmetic, where wrapping is defined); a negative
// exponent gives 1 for a base of 1, +-1 for -1, and 0 for every other base. std::pow would go
// through double: inexact above 2**53, and undefined where the result leaves the type.
template <typename T>
inline T ipow(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) {
      if (a == 1) return 1;
      if (a == -1) return (b & 1) ? -1 : 1;
      return 0;
    }
  }
  U result = 1, base = static_cast<U>(a);
  for (U e = static_cast<U>(b); e != 0; e >>= 1) {
    if (e & 1) result = static_cast<U>(result * base);
    base = static_cast<U>(base * base);
  }
  return static_cast<T>(result);
}

// Shifts as torch defines them (ATen's BinaryOpsKernel): a shift by a negative amount or by the
// type's width or more gives 0 to the left, and the sign's fill to the right; C++ leaves those
// undefined (and vector lanes and a scalar tail disagree).
template <typename T>
inline bool shift_out_of_range(T b) {
  constexpr T width = static_cast<T>(sizeof(T) * 8);
  if constexpr (std::is_signed_v<T>) {
    if (b < 0) return true;
  }
  return b >= width;
}

template <typename T>
inline T shl(T a, T b) {
  if (shift_out_of_range(b)) return 0;
  return static_cast<T>(static_cast<std::make_unsigned_t<T>>(a) << b);
}

template <typename T>
inline T shr(T a, T b) {
  if (shift_out_of_range(b)) {
    if constexpr (std::is_signed_v<T>) return static_cast<T>(a < 0 ? -1 : 0);
    return 0;
  }
  return static_cast<T>(a >> b);
}

template <typename T>
inline T maximum(T a, T b) {
  if constexpr (std::numeric_limits<T>::has_quiet_NaN) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
  }
  return a > b ? a : b;
}

template <typename T>
inline T minimum(T a, T b) {
  if constexpr (std::numeric_limits<T>::has_quiet_NaN) {
    if (a != a || b != b) return std::numeric_limits<T>::quiet_NaN();
  }
  return a < b ? a : b;
}

template <typename T>
inline T sign(T a) {
  if constexpr (std::numeric_limits<T>::has_quiet_NaN) {
    if (a != a) return a;
  }
  return static_cast<T>((T(0) < a) - (a < T(0)));
}

// -- float math the compiler can vectorize -----------------------------------------------------
// Note: glibc's vector math (libmvec) is only reachable with -ffast-math, which kiln does not
// use, so a loop calling std::exp or std::tanh on floats stays scalar. These are branch-free
// (selects only) and inline, so `omp simd` loops vectorize them; accuracy is what eager's own
// vectorized CPU kernels give (exp and tanh within a few ulp, erf to 1.5e-7 absolute: the same
// Abramowitz-Stegun formula ATen's Vectorized<float>::erf uses). NaN and infinities as libm.

inline float exp(float x) {
  float xc = x > 88.7228391f ? 88.7228391f : (x < -103.972084f ? -103.972084f : x);
  // Round to nearest by the 1.5 * 2^23 trick: nearbyint is a libm call GCC will not vectorize.
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n in two halves, so n = 128 (overflow to inf) and n < -126 (subnormals) come out right.
  int32_t ni = static_cast<int32_t>(n);
  int32_t half = ni / 2;
  uint32_t b1 = static_cast<uint32_t>(half + 127) << 23, b2 = static_cast<uint32_t>(ni - half + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float y = p * s1 * s2;
  y = x < -103.972084f ? 0.0f : y;
  y = x > 88.7228391f ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}
inline double exp(double x) { return std::exp(x); }

inline float tanh(float x) {
  float a = std::fabs(x);
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  float big = 1.0f - 2.0f / (kiln::exp(2.0f * a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : big;
}
inline double tanh(double x) { return std::tanh(x); }

inline float erf(float x) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float r = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  float y = 1.0f - r * kiln::exp(-a * a);
  return x < 0.0f ? -y : (x != x ? x : y);
}
inline double erf(double x) { return std::erf(x); }

inline float sigmoid(float x) { return 1.0f / (1.0f + kiln::exp(-x)); }
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

template <typename T>
inline T rsqrt(T x) { return T(1) / std::sqrt(x); }

// torch.round: halves to even.
template <typename T>
inline T round_even(T x) { return std::nearbyint(x); }

// erfinv: Giles' single-precision approximation, then two Newton steps on erf.
template <typename T>
inline T erfinv(T y) {
  if (y <= T(-1)) return y == T(-1) ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::quiet_NaN();
  if (y >= T(1)) return y == T(1) ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::quiet_NaN();
  double w = -std::log((1.0 - y) * (1.0 + y)), x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941}) x = c + x * w;
  } else {
    w = std::sqrt(w) - 3.0;
    x = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682}) x = c + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
  return static_cast<T>(x);
}

// Welford's running mean and sum of squared deviations.
template <typename T>
struct Welford {
  T mean = 0, m2 = 0;
  int64_t n = 0;
  inline void add(T x) {
    ++n;
    T delta = x - mean;
    mean += delta / static_cast<T>(n);
    m2 += delta * (x - mean);
  }
  // Chan et al.'s combination of two partial results.
  inline void merge(const Welford& o) {
    if (o.n == 0) return;
    if (n == 0) { *this = o; return; }
    int64_t total = n + o.n;
    T delta = o.mean - mean;
    T w = static_cast<T>(o.n) / static_cast<T>(total);
    mean += delta * w;
    m2 += o.m2 + delta * delta * static_cast<T>(n) * w;
    n = total;
  }
};

}  // namespace kiln
