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

}  // namespace cosycompile_ops
#endif
