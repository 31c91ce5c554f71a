#include "kernels/ops.h"

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "core/check.h"
#include "kernels/kernel_table.h"

namespace crescent::kernels {

void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y) {
  internal::active_table().rms_norm(x, weight, num_rows, dim, eps, y);
}

void add_inplace(float* y, const float* x, int64_t n) {
  internal::active_table().add_inplace(y, x, n);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  internal::active_table().silu_mul(gate, up, n, out);
}

RopeTable::RopeTable(int head_dim, double theta, int64_t max_positions, const RopeScaling& scaling)
    : head_dim_(head_dim), max_positions_(max_positions) {
  CRESCENT_CHECK(head_dim > 0 && head_dim % 2 == 0) << "head_dim " << head_dim;
  CRESCENT_CHECK(max_positions > 0) << max_positions;
  const int half = head_dim / 2;
  inv_freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    inv_freq_[i] = 1.0 / std::pow(theta, 2.0 * i / head_dim);
  }
  if (scaling.is_llama3) {
    // transformers' _compute_llama3_parameters.
    const double old_len = scaling.original_max_position_embeddings;
    const double low_freq_wavelen = old_len / scaling.low_freq_factor;
    const double high_freq_wavelen = old_len / scaling.high_freq_factor;
    for (double& f : inv_freq_) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f = f / scaling.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth = (old_len / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1 - smooth) * f / scaling.factor + smooth * f;
      }
    }
  }
  cos_.resize(max_positions * half);
  sin_.resize(max_positions * half);
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq_[i];
      cos_[p * half + i] = static_cast<float>(std::cos(angle));
      sin_[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope(float* x, const int32_t* positions, int64_t num_tokens, int num_heads,
          const RopeTable& table) {
  const int head_dim = table.head_dim();
  const int half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = positions[t];
    CRESCENT_CHECK(pos >= 0 && pos < table.max_positions())
        << "position " << pos << " outside the RoPE table (" << table.max_positions() << ")";
    const float* c = table.cos(pos);
    const float* s = table.sin(pos);
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void rope_multi(float* x, const int32_t* positions3, int64_t num_tokens, int num_heads,
                const RopeTable& table, std::span<const int> sections) {
  const int head_dim = table.head_dim();
  const int half = head_dim / 2;
  // section_of[i]: which of the three positions turns rotary pair i.
  std::vector<int> section_of(static_cast<size_t>(half));
  int pair = 0;
  for (size_t k = 0; k < sections.size(); ++k) {
    for (int j = 0; j < sections[k] && pair < half; ++j) {
      section_of[static_cast<size_t>(pair++)] = static_cast<int>(k);
    }
  }
  CRESCENT_CHECK(pair == half && sections.size() <= 3)
      << "M-RoPE sections must cover head_dim / 2 = " << half << " pairs in at most 3 runs";
  std::vector<float> c(static_cast<size_t>(half));
  std::vector<float> s(static_cast<size_t>(half));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < 3; ++k) {
      const int64_t pos = positions3[t * 3 + k];
      CRESCENT_CHECK(pos >= 0 && pos < table.max_positions())
          << "position " << pos << " outside the RoPE table (" << table.max_positions() << ")";
    }
    for (int i = 0; i < half; ++i) {
      const int64_t pos = positions3[t * 3 + section_of[static_cast<size_t>(i)]];
      c[static_cast<size_t>(i)] = table.cos(pos)[i];
      s[static_cast<size_t>(i)] = table.sin(pos)[i];
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * c[static_cast<size_t>(i)] - b * s[static_cast<size_t>(i)];
        v[i + half] = b * c[static_cast<size_t>(i)] + a * s[static_cast<size_t>(i)];
      }
    }
  }
}

int64_t argmax(const float* x, int64_t n) {
  CRESCENT_CHECK(n >= 1) << "argmax of an empty vector";
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best])
      best = i;
  }
  return best;
}

void softmax(float* x, int64_t n) {
  if (n <= 0)
    return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, x[i]);
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i)
      x[i] = 1.0f / static_cast<float>(n);
    return;
  }
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i)
    x[i] *= inv;
}

void softmax_scaled(float* x, int64_t n, float scale) {
  if (n <= 0)
    return;
  float m = x[0];
  for (int64_t i = 1; i < n; ++i)
    m = std::max(m, x[i]);
  if (m == -std::numeric_limits<float>::infinity()) {
    for (int64_t i = 0; i < n; ++i)
      x[i] = 1.0f / static_cast<float>(n);
    return;
  }
  const float sum = internal::active_table().exp_sum(x, n, scale, m * scale);
  internal::active_table().scale(1.0f / sum, x, n);
}

float exp_scaled(float* x, int64_t n, float scale, float shift) {
  return n <= 0 ? 0.0f : internal::active_table().exp_sum(x, n, scale, shift);
}

float max_value(const float* x, int64_t n) {
  return n <= 0 ? -std::numeric_limits<float>::infinity()
                : internal::active_table().max_value(x, n);
}

float log_sum_exp(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    m = std::max(m, x[i]);
  if (m == -std::numeric_limits<float>::infinity())
    return m;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += std::exp(static_cast<double>(x[i]) - m);
  return static_cast<float>(m + std::log(sum));
}

}  // namespace crescent::kernels
