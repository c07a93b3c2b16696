// cosycompile::int8_linear: y = linear(x, w_q * w_scale, bias) with x quantized to INT8 per row, the
// same arithmetic as torch_dynamic's int8_linear (torch._int_mm), in one call.
//
// Why a kernel of our own: a decode step multiplies one row by every weight of the LM, so its speed is
// how fast the weights stream from memory. torch._int_mm (oneDNN) reads them at about half the
// machine's read bandwidth for one row (docs/bench-log/2026-12-02-amx-xeon-int8-gemv.md); here, up to
// GEMV_ROWS rows are multiplied in one pass over the weights with AVX512-VNNI dot products. More rows
// (a prefill) go to torch._int_mm, whose blocked GEMM reuses each weight across rows. On a CPU
// without AVX512-VNNI every call goes to torch._int_mm, so a program that calls this op runs anywhere.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Rows multiplied in one pass over the weights: four at a time against each block of four weight rows
// (16 accumulators in registers), the block re-read from L1 for the next four.
constexpr int64_t GEMV_ROWS = 8;
constexpr int64_t ROW_GROUP = 4;

// Each row of x [M, K] as INT8 (round half to even, clamp to +-127, as torch.round does), its scale,
// and 128 times the sum of its INT8 values (the offset the unsigned operand of VPDPBUSD adds).
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* offset) {
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
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
}

#if defined(__x86_64__)
bool has_avx512_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");  // asked once, not on every call
  return yes;
}

// acc[m][i] = sum_k q[m][k] * w[n0 + i][k] for i < rows <= 4 and m < M <= ROW_GROUP (M a template
// argument, so that the accumulators stay in registers). VPDPBUSD multiplies unsigned by signed bytes:
// the weights are made unsigned by flipping their sign bit (w + 128), and the caller takes
// 128 * sum(q[m]) back off.
template <int M>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void dot_block(const int8_t* w, int64_t K, int64_t rows, const int8_t* q, int32_t acc[ROW_GROUP][4]) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i a[M][4];
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < 4; ++i) a[m][i] = _mm512_setzero_si512();
  const int8_t* w1 = w + std::min<int64_t>(1, rows - 1) * K;  // rows past N re-read row 0: results unused
  const int8_t* w2 = w + std::min<int64_t>(2, rows - 1) * K;
  const int8_t* w3 = w + std::min<int64_t>(3, rows - 1) * K;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512i v0 = _mm512_xor_si512(_mm512_loadu_si512(w + k), flip);
    const __m512i v1 = _mm512_xor_si512(_mm512_loadu_si512(w1 + k), flip);
    const __m512i v2 = _mm512_xor_si512(_mm512_loadu_si512(w2 + k), flip);
    const __m512i v3 = _mm512_xor_si512(_mm512_loadu_si512(w3 + k), flip);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_loadu_si512(q + m * K + k);
      a[m][0] = _mm512_dpbusd_epi32(a[m][0], v0, xv);
      a[m][1] = _mm512_dpbusd_epi32(a[m][1], v1, xv);
      a[m][2] = _mm512_dpbusd_epi32(a[m][2], v2, xv);
      a[m][3] = _mm512_dpbusd_epi32(a[m][3], v3, xv);
    }
  }
  if (k < K) {  // the last K % 64 columns; masked-off bytes load as 0 and add nothing
    const __mmask64 mask = (__mmask64(1) << (K - k)) - 1;
    const __m512i v0 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w + k), flip);
    const __m512i v1 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w1 + k), flip);
    const __m512i v2 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w2 + k), flip);
    const __m512i v3 = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, w3 + k), flip);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mask, q + m * K + k);
      a[m][0] = _mm512_dpbusd_epi32(a[m][0], v0, xv);
      a[m][1] = _mm512_dpbusd_epi32(a[m][1], v1, xv);
      a[m][2] = _mm512_dpbusd_epi32(a[m][2], v2, xv);
      a[m][3] = _mm512_dpbusd_epi32(a[m][3], v3, xv);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_reduce_add_epi32(a[m][i]);
}

void gemv(const int8_t* w, int64_t N, int64_t K, const int8_t* q, const float* xs, const int32_t* offset, int64_t M,
          const float* ws, const float* bias, float* y) {
  // Blocks of 4 weight rows, 16 blocks at least per task so that a thread streams a long run of memory.
  at::parallel_for(0, (N + 3) / 4, 16, [&](int64_t b0, int64_t b1) {
    int32_t acc[ROW_GROUP][4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * 4, rows = std::min<int64_t>(4, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += ROW_GROUP) {
        const int64_t group = std::min<int64_t>(ROW_GROUP, M - m0);
        const int8_t* qg = q + m0 * K;
        switch (group) {
          case 1: dot_block<1>(w + n0 * K, K, rows, qg, acc); break;
          case 2: dot_block<2>(w + n0 * K, K, rows, qg, acc); break;
          case 3: dot_block<3>(w + n0 * K, K, rows, qg, acc); break;
          default: dot_block<4>(w + n0 * K, K, rows, qg, acc); break;
        }
        for (int64_t g = 0; g < group; ++g) {
          const int64_t m = m0 + g;
          for (int64_t i = 0; i < rows; ++i) {
            const float v = static_cast<float>(acc[g][i] - offset[m]) * xs[m] * ws[n0 + i];
            y[m * N + n0 + i] = bias ? v + bias[n0 + i] : v;
          }
        }
      }
    }
  });
}
#endif

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& w_q, const at::Tensor& w_scale,
                           const std::optional<at::Tensor>& bias) {
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
#if defined(__x86_64__)
  if (M >= 1 && M <= GEMV_ROWS && has_avx512_vnni()) {
    at::Tensor y = at::empty({M, N}, x.options());
    gemv(w.data_ptr<int8_t>(), N, K, q.data_ptr<int8_t>(), xs.data_ptr<float>(), offset.data(), M,
         ws.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>());
    return y.view(out_shape);
  }
#endif
  at::Tensor y = at::_int_mm(q, w.t()).to(at::kFloat).mul_(xs).mul_(ws);
  if (b.defined()) y.add_(b);
  return y.view(out_shape);
}

}  // namespace

TORCH_LIBRARY(cosycompile, m) {
  m.def("int8_linear(Tensor x, Tensor w_q, Tensor w_scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(cosycompile, CPU, m) {
  m.impl("int8_linear", &int8_linear_cpu);
}
