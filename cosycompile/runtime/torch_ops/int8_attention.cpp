// cosycompile::int8_attention: scaled_dot_product_attention(q, k, v, attn_mask, scale) with INT8 products,
// the arithmetic of torch_dynamic's composite int8_attention (quantize/torch_dynamic/attention.py) in
// one call.
//
// Why a kernel of our own: the composite runs each head as two torch._int_mm calls with the softmax
// between them in a separate kernel, so every score makes a round trip through memory as an INT32, a
// float and a byte, and a flow estimator call makes thousands of small oneDNN calls. Here a block of
// query rows goes through its scores, softmax and P.V while they sit in L1: K and V are quantized and
// packed once per head into the layout VPDPBUSD reads (four bytes of 16 keys, or of 16 channels, per
// vector), and the probabilities go to P.V as unsigned bytes round(254 e) directly, so the composite's
// -127 offset has nothing to take back.
//
// Where the CPU has AMX-INT8 (Sapphire Rapids and later) the two products run as tile multiplies on the
// same packed K and V (amx_head), the rest as the VNNI kernel. Where the CPU has no AVX512-VNNI, a
// portable kernel runs the same arithmetic in plain loops (the compiler vectorizes them for AVX2 where
// the CPU has it). cosycompile::int8_attention_with runs one
// named kernel (tests check each kernel this CPU can run against the composite);
// cosycompile::int8_attention_kernels names those kernels.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "vnni.h"
using cosycompile_ops::amax_avx512;
using cosycompile_ops::dpbusd;
using cosycompile_ops::has_avx512_vnni;
using cosycompile_ops::lanes;
using cosycompile_ops::quantize_avx512;
using cosycompile_ops::ScaleBy;
#endif

namespace {

// The composite's constants (attention.py): symmetric INT8, probabilities on 254 steps, base-2 scores,
// the exponential's polynomial and its floor.
constexpr float LEVELS = 127.f;
constexpr float P_STEPS = 254.f;
constexpr double LOG2E = 1.4426950408889634;
constexpr float LOG2E_F = static_cast<float>(LOG2E);
constexpr float EXP2_C1 = 0.6954244246846342f, EXP2_C2 = 0.22630764466457975f, EXP2_C3 = 0.07826793065078608f;
constexpr float EXP2_FLOOR = -30.f;
// Query rows that share each load of K (their accumulators in registers, enough chains in flight to
// hide VPDPBUSD's latency), and that share each load of V (four vectors of channels for each).
constexpr int ROWS = 8;
constexpr int PV_ROWS = 4;

enum class Kernel { vnni, portable, amx };
const char* const KERNEL_NAMES[] = {"vnni", "portable", "amx"};
constexpr int KERNEL_COUNT = sizeof(KERNEL_NAMES) / sizeof(KERNEL_NAMES[0]);

float scale_of(float amax) { return std::max(amax, 1e-8f) * (1.f / LEVELS); }

// x times a scale's reciprocal, 1 / s as the composite takes it (a float division), rounded and clamped.
int8_t quantize(float x, float inverse) {
  return static_cast<int8_t>(std::min(LEVELS, std::max(-LEVELS, std::nearbyint(x * inverse))));
}

// 2^y for y <= 0 as the composite's exp2_nonpositive computes it; 0 below 2^-30 and for NaN.
float exp2_nonpositive(float y) {
  if (!(y >= EXP2_FLOOR)) return 0.f;
  const float n = std::floor(y), f = y - n;
  const float frac = 1.f + f * (EXP2_C1 + f * (EXP2_C2 + f * EXP2_C3));
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float p;
  std::memcpy(&p, &bits, sizeof p);
  return frac * p;
}

// One (batch, head) of the problem: [T, D] / [S, D] float inputs whose rows are contiguous but may lie
// apart (row strides q_row, k_row, v_row: heads split out of a projection are read where they are, not
// copied), the additive mask's rows (stride between rows; null when there is no mask), the output [T, D].
struct Head {
  const float* q;
  const float* k;
  const float* v;
  int64_t q_row, k_row, v_row;
  const float* mask;
  int64_t mask_row_stride;
  float* out;
  int64_t T, S, D;
  float score_scale;  // scale * log2(e) / 127, as the composite rounds it
};

// What both kernels need of K and V: their INT8 values and scales (K one per head, V one per channel).
struct Quantized {
  float k_scale;
  std::vector<int8_t> k, v;  // [S, D]
  std::vector<float> v_scale;
};

Quantized quantize_kv(const Head& h) {
  Quantized r;
  float amax = 0.f;
  for (int64_t s = 0; s < h.S; ++s)
    for (int64_t d = 0; d < h.D; ++d) amax = std::max(amax, std::fabs(h.k[s * h.k_row + d]));
  r.k_scale = scale_of(amax);
  r.k.resize(h.S * h.D);
  const float k_inverse = 1.f / r.k_scale;
  for (int64_t s = 0; s < h.S; ++s)
    for (int64_t d = 0; d < h.D; ++d) r.k[s * h.D + d] = quantize(h.k[s * h.k_row + d], k_inverse);
  std::vector<float> vmax(h.D, 0.f);
  for (int64_t s = 0; s < h.S; ++s)
    for (int64_t d = 0; d < h.D; ++d) vmax[d] = std::max(vmax[d], std::fabs(h.v[s * h.v_row + d]));
  r.v_scale.resize(h.D);
  std::vector<float> v_inverse(h.D);
  for (int64_t d = 0; d < h.D; ++d) {
    r.v_scale[d] = scale_of(vmax[d]);
    v_inverse[d] = 1.f / r.v_scale[d];
  }
  r.v.resize(h.S * h.D);
  for (int64_t s = 0; s < h.S; ++s)
    for (int64_t d = 0; d < h.D; ++d) r.v[s * h.D + d] = quantize(h.v[s * h.v_row + d], v_inverse[d]);
  return r;
}

// Query row t as INT8 and its score factor (its scale times K's times the softmax's constants, taken
// as the composite takes it: max |q| times the product of the others).
float quantize_query(const Head& h, const Quantized& kv, int64_t t, int8_t* q) {
  const float* row = h.q + t * h.q_row;
  float amax = 0.f;
  for (int64_t d = 0; d < h.D; ++d) amax = std::max(amax, std::fabs(row[d]));
  const float s = scale_of(amax);
  const float inverse = 1.f / s;
  for (int64_t d = 0; d < h.D; ++d) q[d] = quantize(row[d], inverse);
  return amax * (kv.k_scale * h.score_scale);
}

// Softmax of one row of base-2 scores into bytes round(254 e) (e = 2^(score - max) in [0, 1]); returns
// the sum of e, which the output divides by. A row that attends to no key sums to 0 and its output
// is 0, as scaled_dot_product_attention gives.
float probabilities(const float* scores, int64_t S, uint8_t* p) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < S; ++s) m = std::max(m, scores[s]);
  float sum = 0.f;
  for (int64_t s = 0; s < S; ++s) {
    const float e = exp2_nonpositive(scores[s] - m);
    sum += e;
    p[s] = static_cast<uint8_t>(std::nearbyint(e * P_STEPS));
  }
  return sum;
}

void portable_head(const Head& h) {
  const Quantized kv = quantize_kv(h);
  const int64_t S = h.S, D = h.D;
  std::vector<int8_t> q(D);
  std::vector<float> scores(S);
  std::vector<uint8_t> p(S);
  std::vector<int32_t> acc(D);
  for (int64_t t = 0; t < h.T; ++t) {
    const float factor = quantize_query(h, kv, t, q.data());
    const float* mask = h.mask ? h.mask + t * h.mask_row_stride : nullptr;
    for (int64_t s = 0; s < S; ++s) {
      int32_t dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += static_cast<int32_t>(q[d]) * kv.k[s * D + d];
      scores[s] = static_cast<float>(dot) * factor;
      if (mask) scores[s] += mask[s] * LOG2E_F;  // as the composite: the mask times log2(e), then the sum
    }
    const float sum = probabilities(scores.data(), S, p.data());
    std::fill(acc.begin(), acc.end(), 0);
    for (int64_t s = 0; s < S; ++s) {
      const int32_t ps = p[s];
      for (int64_t d = 0; d < D; ++d) acc[d] += ps * kv.v[s * D + d];
    }
    const float norm = P_STEPS * sum, inverse = 1.f / norm;
    for (int64_t d = 0; d < D; ++d) h.out[t * D + d] = norm > 0.f ? static_cast<float>(acc[d]) * (kv.v_scale[d] * inverse) : 0.f;
  }
}

#if defined(__x86_64__)
// Rows ahead of the one being read that a strided pass asks for: heads split out of a projection lie
// H*D floats apart, a stride the hardware prefetchers do not follow.
constexpr int64_t PREFETCH_ROWS = 16;

void prefetch_row(const float* row, int64_t D) {
  for (int64_t d = 0; d < D; d += 16) _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
}

// quantize_kv with vector loops: K one scale per head, V one per channel. Where rows are not
// contiguous, the first pass over each copies them together while it takes their maximum, and the
// second quantizes the copy: heads split out of a projection lie rows H*D floats apart, a power of two
// that maps them onto a few cache sets, so a second pass over the rows where they lie missed L1 and L2
// on every row. Contiguous rows are read where they lie, without that extra write.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
Quantized vnni_quantize_kv(const Head& h) {
  Quantized r;
  const int64_t S = h.S, D = h.D;
  const bool copy_k = h.k_row != D, copy_v = h.v_row != D;
  thread_local std::vector<float> rows;
  if (copy_k || copy_v) rows.resize(S * D);
  float* const buf = rows.data();
  const float* k_rows = copy_k ? buf : h.k;
  __m512 km = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; ++s) {
    if (s + PREFETCH_ROWS < S) prefetch_row(h.k + (s + PREFETCH_ROWS) * h.k_row, D);
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 live = lanes(D - d);
      const __m512 x = _mm512_maskz_loadu_ps(live, h.k + s * h.k_row + d);
      if (copy_k) _mm512_mask_storeu_ps(buf + s * D + d, live, x);
      km = _mm512_max_ps(km, _mm512_abs_ps(x));
    }
  }
  r.k_scale = scale_of(_mm512_reduce_max_ps(km));
  r.k.resize(S * D);
  quantize_avx512(k_rows, S * D, 1.f / r.k_scale, r.k.data(), ScaleBy::multiplying);
  const float* v_rows = copy_v ? buf : h.v;  // K is quantized: the buffer is free for V
  const int64_t D16 = (D + 15) / 16 * 16;
  std::vector<float> vmax(D16, 0.f);
  for (int64_t s = 0; s < S; ++s) {
    if (s + PREFETCH_ROWS < S) prefetch_row(h.v + (s + PREFETCH_ROWS) * h.v_row, D);
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 live = lanes(D - d);
      const __m512 x = _mm512_maskz_loadu_ps(live, h.v + s * h.v_row + d);
      if (copy_v) _mm512_mask_storeu_ps(buf + s * D + d, live, x);
      _mm512_storeu_ps(vmax.data() + d, _mm512_max_ps(_mm512_loadu_ps(vmax.data() + d), _mm512_abs_ps(x)));
    }
  }
  r.v_scale.resize(D);
  std::vector<float> v_inverse(D16, 0.f);
  for (int64_t d = 0; d < D; ++d) {
    r.v_scale[d] = scale_of(vmax[d]);
    v_inverse[d] = 1.f / r.v_scale[d];
  }
  r.v.resize(S * D);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 live = lanes(D - d);
      const __m512 inverse = _mm512_loadu_ps(v_inverse.data() + d);
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(live, v_rows + s * D + d), inverse));
      _mm512_mask_cvtepi32_storeu_epi8(r.v.data() + s * D + d, live, _mm512_min_epi32(hi, _mm512_max_epi32(lo, q)));
    }
  return r;
}

// K and V in the layouts the VNNI kernel reads, both zero-padded: K as [S/16][D/4][16 keys][4 bytes]
// with -128 times each key's sum (the accumulators start from it, which takes back the offset the
// query's unsigned bytes q + 128 add), V as [S/4][D'][4 keys] with D' the channels rounded up to 16.
struct Packed {
  int64_t S16, D4, S4, DP;
  std::vector<int8_t> k, v;
  std::vector<int32_t> k_offset;
};

// The packing moves bytes only; vector shuffles do it a row of K (a scatter of its 16 dwords, for
// D = 64) or four keys of V (16 channels at a time) per step, the scalar loops what remains.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
Packed pack(const Head& h, const Quantized& kv) {
  Packed p;
  p.S16 = (h.S + 15) / 16;
  p.D4 = (h.D + 3) / 4;
  p.S4 = (h.S + 3) / 4;
  p.DP = (h.D + 15) / 16 * 16;
  p.k.assign(p.S16 * p.D4 * 64, 0);
  p.k_offset.assign(p.S16 * 16, 0);
  const __m512i dword_stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(16));
  for (int64_t s = 0; s < h.S; ++s) {
    int8_t* dst = p.k.data() + (s / 16 * p.D4 * 16 + s % 16) * 4;
    const int8_t* src = kv.k.data() + s * h.D;
    int64_t d = 0;
    for (; d + 64 <= h.D; d += 64)  // dword i of these 64 bytes goes to dst + (d / 4 + i) * 64
      _mm512_i32scatter_epi32(dst + d * 16, dword_stride, _mm512_loadu_si512(src + d), 4);
    for (; d < h.D; ++d) dst[(d / 4) * 64 + d % 4] = src[d];
    int32_t sum = 0;
    for (int64_t i = 0; i < h.D; ++i) sum += src[i];
    p.k_offset[s] = -128 * sum;
  }
  // Groups of four keys up to a multiple of 16, zero: an AMX tile of V reads 16 groups (64 keys) at once.
  p.v.assign((p.S4 + 15) / 16 * 16 * p.DP * 4, 0);
  for (int64_t s0 = 0; s0 < h.S; s0 += 4) {
    int8_t* dst = p.v.data() + s0 / 4 * p.DP * 4;
    const int64_t keys = std::min<int64_t>(4, h.S - s0);
    int64_t d = 0;
    if (keys == 4) {
      for (; d + 16 <= h.D; d += 16) {  // four rows of 16 bytes into 16 groups of four
        const int8_t* src = kv.v.data() + s0 * h.D + d;
        const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
        const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + h.D));
        const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * h.D));
        const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * h.D));
        const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
        const __m128i c = _mm_unpacklo_epi8(r2, r3), e = _mm_unpackhi_epi8(r2, r3);
        __m128i* out = reinterpret_cast<__m128i*>(dst + d * 4);
        _mm_storeu_si128(out, _mm_unpacklo_epi16(a, c));
        _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(a, c));
        _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(b, e));
        _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(b, e));
      }
    }
    for (; d < h.D; ++d)
      for (int64_t i = 0; i < keys; ++i) dst[d * 4 + i] = kv.v[(s0 + i) * h.D + d];
  }
  return p;
}

// The mask row in base 2 as the scores add it (mask * log2(e), 0 without a mask), and -inf past S:
// 16 S16 floats. Rows that share a mask row share this one.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_bias(const float* mask, int64_t S, int64_t S16, float* bias) {
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), log2e = _mm512_set1_ps(LOG2E_F);
  for (int64_t j = 0; j < S16; ++j) {
    const __mmask16 live = lanes(S - j * 16);
    const __m512 b = mask ? _mm512_mul_ps(_mm512_maskz_loadu_ps(live, mask + j * 16), log2e) : _mm512_setzero_ps();
    _mm512_storeu_ps(bias + j * 16, _mm512_mask_blend_ps(live, minus_inf, b));
  }
}

// Scores of R query rows against J blocks of 16 keys from block j (R * J accumulator chains, enough to
// cover VPDPBUSD's latency where a core issues two a cycle), rescaled, plus each row's bias, into
// scores[r][j * 16 ..).
template <int R, int J>
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline void vnni_score_blocks(
    const Packed& p, int64_t j, const uint8_t* q, const float* factor, const float* const* bias, float* scores,
    int64_t stride) {
  __m512i acc[J * R];  // one dimension: GCC keeps a two-dimensional one in memory across the loop
  for (int b = 0; b < J; ++b) {
    const __m512i start = _mm512_loadu_si512(p.k_offset.data() + (j + b) * 16);
    for (int r = 0; r < R; ++r) acc[b * R + r] = start;
  }
  const int8_t* kb = p.k.data() + j * p.D4 * 64;
  for (int64_t dd = 0; dd < p.D4; ++dd) {
    __m512i kv[J];
    for (int b = 0; b < J; ++b) kv[b] = _mm512_loadu_si512(kb + (b * p.D4 + dd) * 64);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, q + r * p.D4 * 4 + dd * 4, 4);
      const __m512i qb = _mm512_set1_epi32(four);
      for (int b = 0; b < J; ++b) acc[b * R + r] = dpbusd(acc[b * R + r], qb, kv[b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < J; ++b) {
      const __m512 sc = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[b * R + r]), _mm512_set1_ps(factor[r])),
                                      _mm512_loadu_ps(bias[r] + (j + b) * 16));
      _mm512_storeu_ps(scores + r * stride + (j + b) * 16, sc);
    }
}

// Scores of R query rows (unsigned bytes q + 128, D4 dwords each) against every key, rescaled, plus
// each row's bias (vnni_bias), into scores[r][0 .. 16 S16) (past S they are -inf), and each row's
// maximum.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_scores(const Packed& p, const uint8_t* q, const float* factor, const float* const* bias, float* scores,
                 int64_t stride, float* row_max) {
  int64_t j = 0;
  for (; j + 2 <= p.S16; j += 2) vnni_score_blocks<R, 2>(p, j, q, factor, bias, scores, stride);
  for (; j < p.S16; ++j) vnni_score_blocks<R, 1>(p, j, q, factor, bias, scores, stride);
  // The maxima in a pass of their own over the rows just written (in L1): kept in registers beside the
  // products' accumulators, they would push those out to the stack.
  for (int r = 0; r < R; ++r) {
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < p.S16; ++i) m = _mm512_max_ps(m, _mm512_loadu_ps(scores + r * stride + i * 16));
    row_max[r] = _mm512_reduce_max_ps(m);
  }
}

// 2^y for the lanes of y at or above the floor (0 elsewhere, NaN included) as exp2_nonpositive: the
// fraction f = y - floor(y) from VREDUCEPS, 2^floor(y) applied by VSCALEFPS, which floors its exponent
// operand itself and for the integers >= -30 the floor keeps is exact (the composite's exponent bits).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512 exp2_lanes(__m512 y) {
  const __m512 f = _mm512_reduce_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_add_ps(
      _mm512_set1_ps(1.f),
      _mm512_mul_ps(f, _mm512_add_ps(_mm512_set1_ps(EXP2_C1),
                                     _mm512_mul_ps(f, _mm512_add_ps(_mm512_set1_ps(EXP2_C2),
                                                                    _mm512_mul_ps(f, _mm512_set1_ps(EXP2_C3)))))));
  const __mmask16 kept = _mm512_cmp_ps_mask(y, _mm512_set1_ps(EXP2_FLOOR), _CMP_GE_OQ);  // false for NaN
  return _mm512_maskz_scalef_ps(kept, frac, y);
}

// round(254 e) of one vector of e, as 16 dwords in [0, 254] (round half to even, the default
// rounding mode, as torch.round).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni"), always_inline)) inline __m512i steps_of(__m512 e) {
  return _mm512_cvtps_epi32(_mm512_mul_ps(e, _mm512_set1_ps(P_STEPS)));
}

// The softmax of one row of 16 S16 scores with maximum m into round(254 e) bytes (the padding's -inf
// gives 0); returns the sum of e. Four vectors at a time narrow to bytes by packing (three shuffles
// and a permute for 64 bytes, where VPMOVDB takes two operations for each 16).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vnni")))
float vnni_probabilities(const float* scores, int64_t S16, float row_max, uint8_t* p) {
  const __m512 m = _mm512_set1_ps(row_max);
  // VPACKUSDW and VPACKUSWB interleave their operands by 128-bit lane: dword k of the result holds
  // vector k % 4's bytes 4 (k / 4) .. 4 (k / 4) + 3; this permute puts them back in order.
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 4 <= S16; j += 4) {
    __m512i w[4];
    for (int i = 0; i < 4; ++i) {
      const __m512 e = exp2_lanes(_mm512_sub_ps(_mm512_loadu_ps(scores + (j + i) * 16), m));
      sum = _mm512_add_ps(sum, e);
      w[i] = steps_of(e);
    }
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(w[0], w[1]), _mm512_packus_epi32(w[2], w[3]));
    _mm512_storeu_si512(p + j * 16, _mm512_permutexvar_epi32(order, bytes));
  }
  for (; j < S16; ++j) {
    const __m512 e = exp2_lanes(_mm512_sub_ps(_mm512_loadu_ps(scores + j * 16), m));
    sum = _mm512_add_ps(sum, e);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + j * 16), _mm512_cvtepi32_epi8(steps_of(e)));  // 0 .. 254 fits
  }
  return _mm512_reduce_add_ps(sum);
}

// out[r][c0 * 16 .. (c0 + C) * 16) = sum over keys of p[r][s] * V[s][...]: C vectors of channels at a
// time for R rows, each load of V used R times.
template <int R, int C>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_pv(const Packed& p, const uint8_t* probs, int64_t stride, int64_t c0, int32_t* acc_out) {
  __m512i acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
  for (int64_t g = 0; g < p.S4; ++g) {
    __m512i vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_si512(p.v.data() + (g * p.DP + (c0 + c) * 16) * 4);
    for (int r = 0; r < R; ++r) {
      int32_t four;
      std::memcpy(&four, probs + r * stride + g * 4, 4);
      const __m512i pb = _mm512_set1_epi32(four);
      for (int c = 0; c < C; ++c) acc[r][c] = dpbusd(acc[r][c], pb, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_si512(acc_out + r * p.DP + (c0 + c) * 16, acc[r][c]);
}

template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_pv_all(const Packed& p, const uint8_t* probs, int64_t stride, int32_t* acc) {
  const int64_t chunks = p.DP / 16;
  int64_t c = 0;
  for (; c + 4 <= chunks; c += 4) vnni_pv<R, 4>(p, probs, stride, c, acc);
  switch (chunks - c) {
    case 3: vnni_pv<R, 3>(p, probs, stride, c, acc); break;
    case 2: vnni_pv<R, 2>(p, probs, stride, c, acc); break;
    case 1: vnni_pv<R, 1>(p, probs, stride, c, acc); break;
    default: break;
  }
}

// One output row: acc * (v_scale * (1 / norm)) per channel, one division a row, as the composite.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_output(const int32_t* acc, const float* v_scale, float norm, int64_t D, float* out) {
  if (!(norm > 0.f)) {  // no key attended
    std::fill(out, out + D, 0.f);
    return;
  }
  const __m512 inverse = _mm512_set1_ps(1.f / norm);
  for (int64_t d = 0; d < D; d += 16) {
    const __mmask16 live = lanes(D - d);
    const __m512 f = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, v_scale + d), inverse);
    _mm512_mask_storeu_ps(out + d, live, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(live, acc + d)), f));
  }
}

// Query row t for the products: its bytes q + 128 (unsigned, zero-padded to D4 dwords) into qr, its
// bias row into *bias (shared_bias, or made in slot where rows have mask rows of their own); returns
// its score factor, as quantize_query takes it.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
float vnni_query_row(const Head& h, const Quantized& kv, const Packed& p, int64_t t, uint8_t* qr,
                     const float* shared_bias, float* slot, const float** bias) {
  const int64_t q_bytes = p.D4 * 4;
  const float* row = h.q + t * h.q_row;
  const float amax = amax_avx512(row, h.D);
  int8_t* q = reinterpret_cast<int8_t*>(qr);
  quantize_avx512(row, h.D, 1.f / scale_of(amax), q, ScaleBy::multiplying);
  std::fill(q + h.D, q + q_bytes, int8_t{0});
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t d = 0; d < q_bytes; d += 64) {  // q + 128 as an unsigned byte
    const __mmask64 live = q_bytes - d >= 64 ? ~__mmask64(0) : (__mmask64(1) << (q_bytes - d)) - 1;
    _mm512_mask_storeu_epi8(q + d, live, _mm512_xor_si512(_mm512_maskz_loadu_epi8(live, q + d), flip));
  }
  if (shared_bias) {
    *bias = shared_bias;
  } else {
    vnni_bias(h.mask + t * h.mask_row_stride, h.S, p.S16, slot);
    *bias = slot;
  }
  return amax * (kv.k_scale * h.score_scale);
}

// Rows t0 .. t0 + R of the head. shared_bias is every row's bias where the rows share one mask row (or
// have none); else each row's is made in row_bias.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void vnni_rows(const Head& h, const Quantized& kv, const Packed& p, int64_t t0, const float* shared_bias,
               float* row_bias, uint8_t* q, float* scores, uint8_t* probs, int32_t* acc) {
  const int64_t score_stride = p.S16 * 16, prob_stride = std::max(p.S16 * 16, p.S4 * 4), q_bytes = p.D4 * 4;
  float factor[R], sum[R];
  const float* bias[R];
  for (int r = 0; r < R; ++r) {
    if (t0 + R + r < h.T) prefetch_row(h.q + (t0 + R + r) * h.q_row, h.D);  // the next block's row
    float* slot = shared_bias ? nullptr : row_bias + r * score_stride;
    factor[r] = vnni_query_row(h, kv, p, t0 + r, q + r * q_bytes, shared_bias, slot, &bias[r]);
  }
  float row_max[R];
  vnni_scores<R>(p, q, factor, bias, scores, score_stride, row_max);
  for (int r = 0; r < R; ++r)
    sum[r] = vnni_probabilities(scores + r * score_stride, p.S16, row_max[r], probs + r * prob_stride);
  for (int r0 = 0; r0 < R; r0 += PV_ROWS) {
    const uint8_t* pr = probs + r0 * prob_stride;
    int32_t* ar = acc + r0 * p.DP;
    switch (std::min(PV_ROWS, R - r0)) {
      case 4: vnni_pv_all<4>(p, pr, prob_stride, ar); break;
      case 3: vnni_pv_all<3>(p, pr, prob_stride, ar); break;
      case 2: vnni_pv_all<2>(p, pr, prob_stride, ar); break;
      default: vnni_pv_all<1>(p, pr, prob_stride, ar); break;
    }
  }
  for (int r = 0; r < R; ++r) vnni_output(acc + r * p.DP, kv.v_scale.data(), P_STEPS * sum[r], h.D, h.out + (t0 + r) * h.D);
}

void vnni_head(const Head& h) {
  const Quantized kv = vnni_quantize_kv(h);
  const Packed p = pack(h, kv);
  const int64_t prob_stride = std::max(p.S16 * 16, p.S4 * 4);
  std::vector<uint8_t> q(ROWS * p.D4 * 4);
  std::vector<float> scores(ROWS * p.S16 * 16);
  std::vector<uint8_t> probs(ROWS * prob_stride, 0);  // the bytes past S stay 0 for P.V's last group
  std::vector<int32_t> acc(ROWS * p.DP);
  // One bias row for the head where no row has a mask row of its own (the estimator's padding mask
  // reaches the operator as [B, 1, 1, S]), else one per row of a block.
  const bool shared = h.mask == nullptr || h.mask_row_stride == 0;
  std::vector<float> bias((shared ? 1 : ROWS) * p.S16 * 16);
  if (shared) vnni_bias(h.mask, h.S, p.S16, bias.data());
  const float* shared_bias = shared ? bias.data() : nullptr;
  float* row_bias = shared ? nullptr : bias.data();
  const auto rows = [&]<int R>(int64_t t0) {
    vnni_rows<R>(h, kv, p, t0, shared_bias, row_bias, q.data(), scores.data(), probs.data(), acc.data());
  };
  int64_t t = 0;
  for (; t + ROWS <= h.T; t += ROWS) rows.template operator()<ROWS>(t);
  switch (h.T - t) {
    case 7: rows.template operator()<7>(t); break;
    case 6: rows.template operator()<6>(t); break;
    case 5: rows.template operator()<5>(t); break;
    case 4: rows.template operator()<4>(t); break;
    case 3: rows.template operator()<3>(t); break;
    case 2: rows.template operator()<2>(t); break;
    case 1: rows.template operator()<1>(t); break;
    default: break;
  }
}
static_assert(ROWS == 8 && PV_ROWS == 4, "vnni_head's tail and vnni_rows' P.V blocks handle these counts");

// The AMX kernel: the VNNI kernel's arithmetic with its two products as tile multiplies. TDPBUSD
// multiplies 16 rows of 64 unsigned bytes by 16 rows of 64 signed bytes laid out as VPDPBUSD reads
// them (four bytes of 16 columns a row), which is how pack() lays out K (per block of 16 keys, D in
// groups of four) and V (per group of four keys, 16 channels a vector): the tiles load straight from
// Packed. One tile multiply does the work of 256 VPDPBUSD. Everything between the products (the
// scores' rescale and bias, the softmax, the output) is the VNNI kernel's code. Heads whose size is no
// multiple of 64 (a tile row) go to the VNNI kernel.

constexpr int TILE_ROWS = 16;

// Whether this CPU and kernel let the process use AMX-INT8 tiles (asked once).
bool amx_usable() {
  static const bool yes = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;
    // Linux hands a process the tile state only on request: arch_prctl(ARCH_REQ_XCOMP_PERM,
    // XFEATURE_XTILEDATA). A kernel too old for AMX refuses it.
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return yes;
}

struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Every tile is 16 rows of 64 bytes. Q.K: tmm0-5 the scores of six blocks of keys, tmm6 the query
// rows, tmm7 K. P.V: tmm0-3 four blocks of 16 output channels, tmm4 the probabilities of 64 keys,
// tmm5-7 V.
__attribute__((target("amx-tile,amx-int8"))) void amx_configure() {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = TILE_ROWS;
  }
  _tile_loadconfig(&config);
}

// Q.K of the 16 query rows in q (D4 * 4 bytes each) against every block of 16 keys, the INT32
// products into products[16][16 S16]. A tile multiply's result is ready long after it issues, so the
// blocks go in two sets of three result tiles (tmm0-2, tmm3-5): one set is stored while the other
// computes, rather than each store waiting on the multiply just issued.
__attribute__((target("amx-tile,amx-int8"))) void amx_scores(const Packed& p, const uint8_t* q, int32_t* products) {
  const int64_t q_bytes = p.D4 * 4, stride = p.S16 * 16 * 4, chunks = p.D4 / 16;
  const int8_t* k = p.k.data();
  const auto block = [&](int64_t j, int64_t c) { return k + (j * p.D4 + c * 16) * 64; };
  const auto out = [&](int64_t j) { return products + j * 16; };
  if (chunks == 1) _tile_loadd(6, q, q_bytes);  // the rows stay in tmm6 for every block
#define COSYCOMPILE_QK(TILE, J)                                    \
  _tile_zero(TILE);                                                \
  for (int64_t c = 0; c < chunks; ++c) {                           \
    if (chunks > 1) _tile_loadd(6, q + c * 64, q_bytes);           \
    _tile_loadd(7, block(J, c), 64);                               \
    _tile_dpbusd(TILE, 6, 7);                                      \
  }
  int64_t j = 0;
  for (; j + 6 <= p.S16; j += 6) {
    COSYCOMPILE_QK(0, j)
    COSYCOMPILE_QK(1, j + 1)
    COSYCOMPILE_QK(2, j + 2)
    if (j > 0) {  // the previous round's second set, computed while this round's first set was issued
      _tile_stored(3, out(j - 3), stride);
      _tile_stored(4, out(j - 2), stride);
      _tile_stored(5, out(j - 1), stride);
    }
    COSYCOMPILE_QK(3, j + 3)
    COSYCOMPILE_QK(4, j + 4)
    COSYCOMPILE_QK(5, j + 5)
    _tile_stored(0, out(j), stride);
    _tile_stored(1, out(j + 1), stride);
    _tile_stored(2, out(j + 2), stride);
  }
  if (j > 0) {
    _tile_stored(3, out(j - 3), stride);
    _tile_stored(4, out(j - 2), stride);
    _tile_stored(5, out(j - 1), stride);
  }
  for (; j < p.S16; ++j) {
    COSYCOMPILE_QK(0, j)
    _tile_stored(0, out(j), stride);
  }
#undef COSYCOMPILE_QK
}

// P.V of 16 rows of probabilities (prob_stride bytes apart, zero past S up to a multiple of 64) into
// acc[16][DP].
__attribute__((target("amx-tile,amx-int8"))) void amx_pv(const Packed& p, const uint8_t* probs, int64_t prob_stride,
                                                          int32_t* acc) {
  const int64_t v_row = p.DP * 4, chunks = (p.S4 + 15) / 16;
  for (int64_t c0 = 0; c0 < p.DP / 16; c0 += 4) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t g = 0; g < chunks; ++g) {  // 64 keys: 16 groups of four
      const int8_t* vb = p.v.data() + (g * 16 * p.DP + c0 * 16) * 4;
      _tile_loadd(4, probs + g * 64, prob_stride);
      _tile_loadd(5, vb, v_row);
      _tile_loadd(6, vb + 64, v_row);
      _tile_loadd(7, vb + 128, v_row);
      _tile_dpbusd(0, 4, 5);
      _tile_dpbusd(1, 4, 6);
      _tile_dpbusd(2, 4, 7);
      _tile_loadd(5, vb + 192, v_row);
      _tile_dpbusd(3, 4, 5);
    }
    _tile_stored(0, acc + c0 * 16, v_row);
    _tile_stored(1, acc + (c0 + 1) * 16, v_row);
    _tile_stored(2, acc + (c0 + 2) * 16, v_row);
    _tile_stored(3, acc + (c0 + 3) * 16, v_row);
  }
}

// One row's scores from its products: (products + K's offsets) rescaled plus the bias, as
// vnni_scores makes them, into scores[0 .. 16 S16); returns the row's maximum.
__attribute__((target("avx512f,avx512bw,avx512vnni")))
float amx_row_scores(const Packed& p, const int32_t* products, float factor, const float* bias, float* scores) {
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t j = 0; j < p.S16; ++j) {
    const __m512i acc = _mm512_add_epi32(_mm512_loadu_si512(products + j * 16), _mm512_loadu_si512(p.k_offset.data() + j * 16));
    const __m512 sc = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), f), _mm512_loadu_ps(bias + j * 16));
    vmax = _mm512_max_ps(vmax, sc);
    _mm512_storeu_ps(scores + j * 16, sc);
  }
  return _mm512_reduce_max_ps(vmax);
}

__attribute__((target("amx-tile,amx-int8"))) void amx_head(const Head& h) {
  const Quantized kv = vnni_quantize_kv(h);
  const Packed p = pack(h, kv);
  const int64_t q_bytes = p.D4 * 4, score_stride = p.S16 * 16, prob_stride = (h.S + 63) / 64 * 64;
  std::vector<uint8_t> q(TILE_ROWS * q_bytes, 0);  // rows past T keep whatever they held: their results are dropped
  std::vector<int32_t> products(TILE_ROWS * score_stride);
  std::vector<float> scores(score_stride);
  std::vector<uint8_t> probs(TILE_ROWS * prob_stride, 0);  // zero past S: the last tile of P.V reads them
  std::vector<int32_t> acc(TILE_ROWS * p.DP);
  const bool shared = h.mask == nullptr || h.mask_row_stride == 0;
  std::vector<float> bias((shared ? 1 : TILE_ROWS) * score_stride);
  if (shared) vnni_bias(h.mask, h.S, p.S16, bias.data());
  amx_configure();
  for (int64_t t0 = 0; t0 < h.T; t0 += TILE_ROWS) {
    const int64_t n = std::min<int64_t>(TILE_ROWS, h.T - t0);
    float factor[TILE_ROWS], sum[TILE_ROWS];
    const float* row_bias[TILE_ROWS];
    for (int64_t r = 0; r < n; ++r) {
      if (t0 + TILE_ROWS + r < h.T) prefetch_row(h.q + (t0 + TILE_ROWS + r) * h.q_row, h.D);  // the next block's row
      factor[r] = vnni_query_row(h, kv, p, t0 + r, q.data() + r * q_bytes, shared ? bias.data() : nullptr,
                                 shared ? nullptr : bias.data() + r * score_stride, &row_bias[r]);
    }
    amx_scores(p, q.data(), products.data());
    for (int64_t r = 0; r < n; ++r) {
      const float m = amx_row_scores(p, products.data() + r * score_stride, factor[r], row_bias[r], scores.data());
      sum[r] = vnni_probabilities(scores.data(), p.S16, m, probs.data() + r * prob_stride);
    }
    amx_pv(p, probs.data(), prob_stride, acc.data());
    for (int64_t r = 0; r < n; ++r)
      vnni_output(acc.data() + r * p.DP, kv.v_scale.data(), P_STEPS * sum[r], h.D, h.out + (t0 + r) * h.D);
  }
  _tile_release();
}
#endif

bool can_run(Kernel kernel) {
#if defined(__x86_64__)
  // The softmax's VREDUCEPS is AVX512DQ, which every CPU with AVX512-VNNI has; asked all the same.
  const bool vnni = has_avx512_vnni() && __builtin_cpu_supports("avx512dq");
  if (kernel == Kernel::vnni) return vnni;
  if (kernel == Kernel::amx) return vnni && amx_usable();  // heads the tiles cannot take run the VNNI code
#else
  if (kernel != Kernel::portable) return false;
#endif
  return true;
}

at::Tensor run_int8_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& attn_mask, double scale, std::optional<Kernel> forced) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "int8_attention: q, k, v must be 4-D [B, H, T, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "int8_attention: q, k, v must be float32");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), S = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(1) == H && k.size(3) == D && v.sizes() == k.sizes(),
              "int8_attention: k and v must be [B, H, S, D] with q's B, H and D");
  // Rows must be contiguous; where they lie (a head split out of a projection, transposed) is free.
  const auto rows_contiguous = [](const at::Tensor& x) { return x.stride(3) == 1 ? x : x.contiguous(); };
  const at::Tensor qc = rows_contiguous(q), kc = rows_contiguous(k), vc = rows_contiguous(v);
  at::Tensor mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    // Additive; a boolean mask (True = attend) becomes 0 / -inf. The kernels take it to base 2 as they
    // read it, so that a float mask is not copied on every call.
    at::Tensor m = attn_mask->scalar_type() == at::kBool
        ? at::zeros(attn_mask->sizes(), q.options()).masked_fill_(attn_mask->logical_not(), -std::numeric_limits<float>::infinity())
        : attn_mask->to(at::kFloat);
    mask = m.expand({B, H, T, S});
    if (mask.stride(3) != 1) mask = mask.contiguous();
  }
  at::Tensor out = at::empty({B, H, T, D}, q.options());
  const Kernel kernel = forced.value_or(can_run(Kernel::amx)    ? Kernel::amx
                                       : can_run(Kernel::vnni) ? Kernel::vnni
                                                               : Kernel::portable);
  // The composite multiplies K's scale by this constant in float32, rounded from the double.
  const float score_scale = static_cast<float>(scale * LOG2E / LEVELS);
  const float* qp = qc.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const float* mp = mask.defined() ? mask.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / H, hh = i % H;
      Head h{qp + b * qc.stride(0) + hh * qc.stride(1), kp + b * kc.stride(0) + hh * kc.stride(1),
             vp + b * vc.stride(0) + hh * vc.stride(1), qc.stride(2), kc.stride(2), vc.stride(2),
             mp ? mp + b * mask.stride(0) + hh * mask.stride(1) : nullptr, mp ? mask.stride(2) : 0,
             op + i * T * D, T, S, D, score_scale};
#if defined(__x86_64__)
      if (kernel == Kernel::amx && D % 64 == 0) {
        amx_head(h);
        continue;
      }
      if (kernel == Kernel::vnni || kernel == Kernel::amx) {
        vnni_head(h);
        continue;
      }
#endif
      portable_head(h);
    }
  });
  return out;
}

at::Tensor int8_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& attn_mask, double scale) {
  return run_int8_attention(q, k, v, attn_mask, scale, std::nullopt);
}

at::Tensor int8_attention_with_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const std::optional<at::Tensor>& attn_mask, double scale, c10::string_view name) {
  for (int i = 0; i < KERNEL_COUNT; ++i) {
    const Kernel kernel = static_cast<Kernel>(i);
    if (name == KERNEL_NAMES[i]) {
      TORCH_CHECK(can_run(kernel), "int8_attention_with: this CPU cannot run kernel ", std::string(name));
      return run_int8_attention(q, k, v, attn_mask, scale, kernel);
    }
  }
  TORCH_CHECK(false, "int8_attention_with: no kernel ", std::string(name), " (vnni, portable, amx)");
}

std::vector<std::string> int8_attention_kernels() {
  std::vector<std::string> names;
  for (int i = 0; i < KERNEL_COUNT; ++i)
    if (can_run(static_cast<Kernel>(i))) names.emplace_back(KERNEL_NAMES[i]);
  return names;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cosycompile, m) {
  m.def("int8_attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, float scale) -> Tensor");
  m.def("int8_attention_with(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, float scale, str kernel) -> Tensor");
  m.def("int8_attention_kernels() -> str[]", &int8_attention_kernels);
}

TORCH_LIBRARY_IMPL(cosycompile, CPU, m) {
  m.impl("int8_attention", &int8_attention_cpu);
  m.impl("int8_attention_with", &int8_attention_with_cpu);
}
