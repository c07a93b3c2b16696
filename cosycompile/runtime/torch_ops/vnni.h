// What both operators' AVX512-VNNI kernels share.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

namespace cosycompile_ops {

// Whether this CPU runs the AVX512-VNNI kernels (asked once, not on every call).
inline bool has_avx512_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return yes;
}

// The lanes of a 16-float vector that hold the `remaining` values left of a row (all when 16 or more).
inline __mmask16 lanes(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << remaining) - 1);
}

// acc + the dot products of a's unsigned bytes with b's signed ones, four to a lane: VPDPBUSD as one
// instruction. GCC 12 compiles _mm512_dpbusd_epi32 in a loop as register copies around each VPDPBUSD
// (it does not update the accumulator in place), and with many accumulators spills them to the stack.
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline __m512i dpbusd(__m512i acc, __m512i a,
                                                                                            __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// max |x[0 .. n)|. A NaN is passed over, as std::max(amax, std::fabs(x)) passes it over: VMAXPS
// returns its second operand when either is NaN.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline float amax_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = lanes(n - i);
    m = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(live, x + i)), m);
  }
  return _mm512_reduce_max_ps(m);
}

// How a quantizer applies its scale: the linear's composite divides by it, the attention's multiplies by
// its reciprocal (a division costs many multiplications, and the attention quantizes K, V and every query
// row on each call).
enum class ScaleBy { dividing, multiplying };

// x[0 .. n) / s (or x[0 .. n) * s where by is multiplying) rounded half to even (the default rounding
// mode, as torch.round and std::nearbyint) and clamped to [-127, 127] into out; returns the sum of
// those INT8 values.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline int32_t quantize_avx512(const float* x, int64_t n, float s,
                                                                                      int8_t* out,
                                                                                      ScaleBy by = ScaleBy::dividing) {
  const __m512 vs = _mm512_set1_ps(s);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = lanes(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(live, x + i);
    const __m512i r = _mm512_cvtps_epi32(by == ScaleBy::multiplying ? _mm512_mul_ps(v, vs) : _mm512_div_ps(v, vs));
    const __m512i q = _mm512_maskz_mov_epi32(live, _mm512_min_epi32(hi, _mm512_max_epi32(lo, r)));
    sum = _mm512_add_epi32(sum, q);
    _mm512_mask_cvtepi32_storeu_epi8(out + i, live, q);
  }
  return _mm512_reduce_add_epi32(sum);
}

}  // namespace cosycompile_ops
#endif
