// What both operators' AVX512-VNNI kernels share.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace cosycompile_ops {

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
