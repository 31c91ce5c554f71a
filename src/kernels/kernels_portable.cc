// Portable C++ implementations of every table entry: the reference the ISA paths are tested
// against, and the fallback on CPUs without AVX2.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/kernel_table.h"

namespace crescent::kernels::internal {
namespace {

constexpr int kR = static_cast<int>(kPanelRows);

void store_panel(const MatmulArgs& a, int64_t panel, int64_t t, const float* acc) {
  const int64_t rows = a.w->rows();
  const int64_t r0 = panel * kR;
  const int64_t n = std::min<int64_t>(kR, rows - r0);
  float* y = a.y + t * rows + r0;
  for (int64_t i = 0; i < n; ++i)
    y[i] = acc[i] + (a.bias ? a.bias[r0 + i] : 0.0f);
}

// F32 and BF16 panels share one loop: even and odd columns of each K pair go to separate
// accumulators, as in the SIMD paths.
template <typename LoadFn>
void matmul_pairs(const MatmulArgs& a, int64_t pb, int64_t pe, LoadFn load) {
  const int64_t kp = a.w->padded_cols();
  for (int64_t p = pb; p < pe; ++p) {
    const std::byte* panel = a.w->panel(p);
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const float* x = a.x + t * kp;
      float acc_even[kR] = {};
      float acc_odd[kR] = {};
      for (int64_t k = 0; k < kp; k += 2) {
        for (int r = 0; r < kR; ++r) {
          acc_even[r] += load(panel, k, r, 0) * x[k];
          acc_odd[r] += load(panel, k, r, 1) * x[k + 1];
        }
      }
      float acc[kR];
      for (int r = 0; r < kR; ++r)
        acc[r] = acc_even[r] + acc_odd[r];
      store_panel(a, p, t, acc);
    }
  }
}

void matmul_f32(const MatmulArgs& a, int64_t pb, int64_t pe) {
  matmul_pairs(a, pb, pe, [](const std::byte* panel, int64_t k, int r, int odd) {
    return reinterpret_cast<const float*>(panel)[(k + odd) * kR + r];
  });
}

void matmul_bf16(const MatmulArgs& a, int64_t pb, int64_t pe) {
  matmul_pairs(a, pb, pe, [](const std::byte* panel, int64_t k, int r, int odd) {
    return bf16_to_float(reinterpret_cast<const uint16_t*>(panel)[k * kR + r * 2 + odd]);
  });
}

void matmul_q8(const MatmulArgs& a, int64_t pb, int64_t pe) {
  const int64_t kp = a.w->padded_cols();
  const int64_t num_blocks = kp / 32;
  for (int64_t p = pb; p < pe; ++p) {
    const std::byte* panel = a.w->panel(p);
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int8_t* xq = a.xq + t * kp;
      float acc[kR] = {};
      for (int64_t b = 0; b < num_blocks; ++b) {
        const auto* scales = reinterpret_cast<const uint16_t*>(panel + q8_scales_offset(b));
        const auto* quants = reinterpret_cast<const uint8_t*>(panel + q8_quants_offset(b));
        const float sx = a.x_scale[t * num_blocks + b];
        for (int64_t r = 0; r < kR; ++r) {
          int32_t dot = 0;
          for (int64_t j = 0; j < 8; ++j) {
            for (int64_t e = 0; e < 4; ++e) {
              const auto wq = static_cast<int8_t>(quants[j * 64 + r * 4 + e] ^ 0x80);
              dot += wq * xq[b * 32 + j * 4 + e];
            }
          }
          acc[r] += static_cast<float>(dot) * (f16_to_float(scales[r]) * sx);
        }
      }
      store_panel(a, p, t, acc);
    }
  }
}

// T: float, or uint16_t for bf16 (the bf16 KV cache).
template <typename T>
float dot(const float* a, const T* b, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; ++i)
    acc += a[i] * widen(b[i]);
  return acc;
}

template <typename T>
void axpy(float s, const T* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] += s * widen(x[i]);
}

#include "kernels/row_blocks.inc"

void scale(float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] *= s;
}

void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum_sq = 0;
    for (int64_t i = 0; i < dim; ++i)
      sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = xr[i] * inv * weight[i];
  }
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] += x[i];
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

float exp_sum(float* x, int64_t n, float scale, float shift) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] * scale - shift);
    sum += x[i];
  }
  return sum;
}

float max_value(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;  // false for NaN
  }
  return m;
}

double peak_fma_flops(int64_t num_iters) {
  // Eight independent chains the compiler may vectorise only as far as the baseline ISA allows.
  float acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float m = 0.999f;
  const float c = 0.001f;
  for (int64_t i = 0; i < num_iters; ++i) {
    for (float& v : acc)
      v = v * m + c;
  }
  volatile float sink = acc[0] + acc[7];
  (void)sink;
  return 2.0 * 8 * static_cast<double>(num_iters);
}

}  // namespace

void fill_portable(KernelTable* t) {
  t->matmul_f32 = matmul_f32;
  t->matmul_bf16 = matmul_bf16;
  t->gemm_bf16_dot = nullptr;
  t->matmul_q8 = matmul_q8;
  t->dot = dot<float>;
  t->axpy = axpy<float>;
  t->dot_bf16 = dot<uint16_t>;
  t->axpy_bf16 = axpy<uint16_t>;
  t->dot_rows_bf16 = dot_rows<uint16_t>;
  t->axpy_rows_bf16 = axpy_rows_loop<uint16_t>;
  t->scale = scale;
  t->rms_norm = rms_norm;
  t->add_inplace = add_inplace;
  t->silu_mul = silu_mul;
  t->exp_sum = exp_sum;
  t->max_value = max_value;
  t->peak_fma_flops = peak_fma_flops;
  t->peak_bf16_flops = nullptr;
}

}  // namespace crescent::kernels::internal
