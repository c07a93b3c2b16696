// cosycompile::int8_linear: y = linear(x, w_q * w_scale, bias) with x quantized to INT8 per row, the
// same arithmetic as torch_dynamic's int8_linear (torch._int_mm), in one call.
//
// Why a kernel of our own: a decode step multiplies one row by every weight of the LM, so its speed is
// how fast the weights stream from memory. torch._int_mm (oneDNN) reads them at about half the
// machine's read bandwidth for one row (docs/bench-log/2026-12-02-amx-xeon-int8-gemv.md), and on a CPU
// without AVX512-VNNI it is a scalar loop (docs/bench-log/2026-12-02-zen3-int8-products-and-build-memory.md).
// So up to GEMV_ROWS rows are multiplied in one pass over the weights, with AVX512-VNNI dot products
// where the CPU has them, else with AVX2 ones. More rows (a prefill, a flow) reuse each weight across
// rows in a blocked GEMM: torch._int_mm where it is vectorized (AVX512-VNNI), else an FP32 GEMM of the
// same integers (exact while a row's sum stays below 2^24, which it does but for adversarial inputs).
//
// cosycompile::int8_linear_with runs one named kernel (for tests, which check every kernel this CPU can
// run against the composite); cosycompile::int8_linear_kernels names those kernels.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>

#include "vnni.h"
using cosycompile_ops::amax_avx512;
using cosycompile_ops::dpbusd;
using cosycompile_ops::has_avx512_vnni;
using cosycompile_ops::quantize_avx512;
#endif

namespace {

// Rows multiplied in one pass over the weights: four at a time against each weight row of a block of
// four, the block re-read from L1 for the next four.
constexpr int64_t GEMV_ROWS = 8;
constexpr int64_t ROW_GROUP = 4;
// AVX2's pass takes two rows at a time (it has 16 vector registers to AVX-512's 32).
constexpr int64_t ROW_GROUP_AVX2 = 2;

enum class Kernel { vnni, avx2, int_mm, fp32 };

// Rows of x quantized, or of a product rescaled, per task of at::parallel_for: a decode step's one row
// runs on the calling thread, a prefill's rows on all of them.
constexpr int64_t ROWS_PER_TASK = 16;

// Each row of x [M, K] as INT8 (round half to even, clamp to +-127, as torch.round does), its scale,
// and 128 times the sum of its INT8 values (the offset the unsigned operand of VPDPBUSD adds).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* offset) {
  at::parallel_for(0, M, ROWS_PER_TASK, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* row = x + m * K;
#if defined(__x86_64__)
      if (has_avx512_vnni()) {
        const float s = std::max(amax_avx512(row, K), 1e-8f) / 127.f;
        scale[m] = s;
        offset[m] = 128 * quantize_avx512(row, K, s, q + m * K);
        continue;
      }
#endif
      float amax = 0.f;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float s = std::max(amax, 1e-8f) / 127.f;
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float v = std::min(127.f, std::max(-127.f, std::nearbyint(row[k] / s)));
        q[m * K + k] = static_cast<int8_t>(v);
        sum += static_cast<int32_t>(v);
      }
      scale[m] = s;
      offset[m] = 128 * sum;
    }
  });
}

// A float that may lie where an INT32 was read (strict aliasing would let the compiler assume not).
typedef float __attribute__((__may_alias__)) aliasing_float;

// y[m][n] = acc[m][n] * xs[m] * ws[n] (+ bias[n]), in that order (the composite's), for the blocked
// GEMMs' products: one pass, in place where y is acc (an INT32 product rewritten as floats).
template <typename T>
void rescale_rows(const T* acc, int64_t M, int64_t N, const float* xs, const float* ws, const float* bias,
                  aliasing_float* y) {
  at::parallel_for(0, M, ROWS_PER_TASK, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const T* a = acc + m * N;
      aliasing_float* out = y + m * N;
      const float s = xs[m];
      if (bias)
        for (int64_t n = 0; n < N; ++n) out[n] = static_cast<float>(a[n]) * s * ws[n] + bias[n];
      else
        for (int64_t n = 0; n < N; ++n) out[n] = static_cast<float>(a[n]) * s * ws[n];
    }
  });
}

#if defined(__x86_64__)
// acc[m][i] = sum_k q[m][k] * w[n0 + i][k] for i < rows <= 4 and m < M <= ROW_GROUP (M a template
// argument, so that the accumulators stay in registers). VPDPBUSD multiplies unsigned by signed bytes:
// the weights are made unsigned by flipping their sign bit (w + 128), and the caller takes
// 128 * sum(q[m]) back off. One weight row after the other, so that a pass reads the weights as one
// sequential stream: four rows read side by side (four streams K bytes apart) kept a decode step well
// below the machine's read bandwidth on Zen 4, one after the other reaches it
// (docs/bench-log/2026-12-03-gemv-stream-and-bf16-convolutions-zen4.md).
template <int M>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void dot_block(const int8_t* w, int64_t K, int64_t rows, const int8_t* q, int32_t acc[ROW_GROUP][4]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < rows; ++i) {
    const int8_t* r = w + i * K;
    __m512i a[M];
    for (int m = 0; m < M; ++m) a[m] = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(r + k), flip);
      for (int m = 0; m < M; ++m) a[m] = dpbusd(a[m], v, _mm512_loadu_si512(q + m * K + k));
    }
    if (k < K) {  // the last K % 64 columns; masked-off bytes load as 0 and add nothing
      const __mmask64 mask = (__mmask64(1) << (K - k)) - 1;
      const __m512i v = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, r + k), flip);
      for (int m = 0; m < M; ++m) a[m] = dpbusd(a[m], v, _mm512_maskz_loadu_epi8(mask, q + m * K + k));
    }
    for (int m = 0; m < M; ++m) acc[m][i] = _mm512_reduce_add_epi32(a[m]);
  }
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

__attribute__((target("avx2"))) int32_t hsum_avx2(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// As dot_block, with AVX2's VPMADDUBSW (unsigned by signed bytes, pairs summed into 16 bits with
// saturation) and VPMADDWD (pairs of those into 32 bits). The unsigned operand is |w| and the signed one
// x with w's sign moved onto it; both lie in [-127, 127], so a pair sums to at most 2 * 127 * 127 = 32258
// and never saturates. No offset to take back.
template <int M>
__attribute__((target("avx2")))
void dot_block_avx2(const int8_t* w, int64_t K, int64_t rows, const int8_t* q, int32_t acc[ROW_GROUP][4]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < rows; ++i) {
    const int8_t* r = w + i * K;
    __m256i a[M];
    for (int m = 0; m < M; ++m) a[m] = _mm256_setzero_si256();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + k));
      const __m256i u = _mm256_abs_epi8(v);
      for (int m = 0; m < M; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + m * K + k));
        a[m] = _mm256_add_epi32(a[m], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xv, v)), ones));
      }
    }
    for (int m = 0; m < M; ++m) {
      int32_t sum = hsum_avx2(a[m]);
      for (int64_t j = k; j < K; ++j) sum += static_cast<int32_t>(q[m * K + j]) * r[j];  // the last K % 32
      acc[m][i] = sum;
    }
  }
}
#endif

using DotBlock = void (*)(const int8_t*, int64_t, int64_t, const int8_t*, int32_t[ROW_GROUP][4]);

#if defined(__x86_64__)
// Each kernel's dot blocks by row count (entry g - 1 takes g rows), fixed for the process: a decode step
// calls the operator for every linear, so nothing here is built per call.
constexpr DotBlock VNNI_DOTS[] = {dot_block<1>, dot_block<2>, dot_block<3>, dot_block<4>};
constexpr DotBlock AVX2_DOTS[] = {dot_block_avx2<1>, dot_block_avx2<2>};
static_assert(std::size(VNNI_DOTS) == ROW_GROUP && std::size(AVX2_DOTS) == ROW_GROUP_AVX2);
#endif

// y[m] = rescaled dot products of row m with every weight row, in one pass over the weights: blocks of
// 4 weight rows, each block against the rows in groups of group_rows (dots[g - 1] takes g rows).
// offset[m] is what the dot products add besides q . w (the VNNI kernel's sign flip), or null.
void gemv(const DotBlock* dots, int64_t group_rows, const int8_t* w, int64_t N, int64_t K, const int8_t* q,
          const float* xs, const int32_t* offset, int64_t M, const float* ws, const float* bias, float* y) {
  // 16 blocks at least per task, so that a thread streams a long run of memory.
  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t b0, int64_t b1) {
    int32_t acc[ROW_GROUP][4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * 4, rows = std::min<int64_t>(4, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += group_rows) {
        const int64_t group = std::min<int64_t>(group_rows, M - m0);
        dots[group - 1](w + n0 * K, K, rows, q + m0 * K, acc);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t m = m0 + g;
          for (int64_t i = 0; i < rows; ++i) {
            const int32_t dot = offset ? acc[g][i] - offset[m] : acc[g][i];
            const float v = static_cast<float>(dot) * xs[m] * ws[n0 + i];
            y[m * N + n0 + i] = bias ? v + bias[n0 + i] : v;
          }
        }
      }
    }
  });
}

bool can_run(Kernel kernel) {
#if defined(__x86_64__)
  if (kernel == Kernel::vnni) return has_avx512_vnni();
  if (kernel == Kernel::avx2) return has_avx2();
#else
  if (kernel == Kernel::vnni || kernel == Kernel::avx2) return false;
#endif
  return true;
}

// The kernel for M rows: a pass over the weights for a few rows, a blocked GEMM for more; torch._int_mm
// only where it is vectorized.
Kernel choose(int64_t M) {
  if (M >= 1 && M <= GEMV_ROWS && can_run(Kernel::vnni)) return Kernel::vnni;
  if (M >= 1 && M <= GEMV_ROWS && can_run(Kernel::avx2)) return Kernel::avx2;
  return can_run(Kernel::vnni) ? Kernel::int_mm : Kernel::fp32;
}

const char* const KERNEL_NAMES[] = {"vnni", "avx2", "int_mm", "fp32"};

at::Tensor run_int8_linear(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                           const std::optional<at::Tensor>& bias, std::optional<Kernel> forced) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_linear: x must be float32");
  TORCH_CHECK(w_q.scalar_type() == at::kChar && w_q.dim() == 2, "int8_linear: w_q must be a 2-D int8 tensor");
  TORCH_CHECK(w_scale.scalar_type() == at::kFloat, "int8_linear: w_scale must be float32");
  const int64_t K = x.size(-1), N = w_q.size(0);
  TORCH_CHECK(w_q.size(1) == K, "int8_linear: x has ", K, " features and w_q ", w_q.size(1));
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const at::Tensor w = w_q.contiguous();
  const at::Tensor ws = w_scale.contiguous();
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t M = x2.size(0);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = N;

  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M, 1}, x.options());
  std::vector<int32_t> offset(M);
  quantize_rows(x2.data_ptr<float>(), M, K, q.data_ptr<int8_t>(), xs.data_ptr<float>(), offset.data());
  const Kernel kernel = forced.value_or(choose(M));
  const float* bias_ptr = b.defined() ? b.data_ptr<float>() : nullptr;
#if defined(__x86_64__)
  if (kernel == Kernel::vnni || kernel == Kernel::avx2) {
    at::Tensor y = at::empty({M, N}, x.options());
    if (M == 0) return y.view(out_shape);
    const bool vnni = kernel == Kernel::vnni;
    gemv(vnni ? VNNI_DOTS : AVX2_DOTS, vnni ? ROW_GROUP : ROW_GROUP_AVX2, w.data_ptr<int8_t>(), N, K,
         q.data_ptr<int8_t>(), xs.data_ptr<float>(), vnni ? offset.data() : nullptr, M, ws.data_ptr<float>(), bias_ptr,
         y.data_ptr<float>());
    return y.view(out_shape);
  }
#endif
  if (kernel == Kernel::int_mm) {
    // The INT32 product becomes the output in place: same element size, one pass instead of four.
    at::Tensor acc = at::_int_mm(q, w.t()).contiguous();
    aliasing_float* y = reinterpret_cast<aliasing_float*>(acc.data_ptr<int32_t>());
    rescale_rows(acc.data_ptr<int32_t>(), M, N, xs.data_ptr<float>(), ws.data_ptr<float>(), bias_ptr, y);
    return acc.view(at::kFloat).view(out_shape);
  }
  at::Tensor y = at::mm(q.to(at::kFloat), w.to(at::kFloat).t()).contiguous();
  rescale_rows(y.data_ptr<float>(), M, N, xs.data_ptr<float>(), ws.data_ptr<float>(), bias_ptr, y.data_ptr<float>());
  return y.view(out_shape);
}

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                           const std::optional<at::Tensor>& bias) {
  return run_int8_linear(x, w_q, w_scale, bias, std::nullopt);
}

at::Tensor int8_linear_with_cpu(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                                const std::optional<at::Tensor>& bias, c10::string_view name) {
  for (int i = 0; i < 4; ++i) {
    const Kernel kernel = static_cast<Kernel>(i);
    if (name == KERNEL_NAMES[i]) {
      TORCH_CHECK(can_run(kernel), "int8_linear_with: this CPU cannot run kernel ", std::string(name));
      return run_int8_linear(x, w_q, w_scale, bias, kernel);
    }
  }
  TORCH_CHECK(false, "int8_linear_with: no kernel ", std::string(name), " (vnni, avx2, int_mm, fp32)");
}

std::vector<std::string> int8_linear_kernels() {
  std::vector<std::string> names;
  for (int i = 0; i < 4; ++i)
    if (can_run(static_cast<Kernel>(i))) names.emplace_back(KERNEL_NAMES[i]);
  return names;
}

}  // namespace

TORCH_LIBRARY(cosycompile, m) {
  m.def("int8_linear(Tensor x, Tensor w_q, Tensor w_scale, Tensor? bias) -> Tensor");
  m.def("int8_linear_with(Tensor x, Tensor w_q, Tensor w_scale, Tensor? bias, str kernel) -> Tensor");
  m.def("int8_linear_kernels() -> str[]", &int8_linear_kernels);
}

TORCH_LIBRARY_IMPL(cosycompile, CPU, m) {
  m.impl("int8_linear", &int8_linear_cpu);
  m.impl("int8_linear_with", &int8_linear_with_cpu);
}
