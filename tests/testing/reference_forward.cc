#include "testing/reference_forward.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/dtype.h"

namespace crescent::testing {
namespace {

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;  // [rows][cols]

std::vector<double> tensor(const model::ModelFiles& files, const std::string& name) {
  auto t = files.tensors->get(name);
  if (!t.is_ok())
    throw std::runtime_error("reference: " + t.status().to_string());
  int64_t n = 1;
  for (int64_t d : t->shape)
    n *= d;
  std::vector<double> out(static_cast<size_t>(n));
  if (t->dtype != DType::kQ8_0 && is_block_quantized(t->dtype)) {  // ggml's dequantiser
    std::vector<float> values(static_cast<size_t>(n));
    dtype_to_float(t->dtype, t->data, n, values.data());
    out.assign(values.begin(), values.end());
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    switch (t->dtype) {
      case DType::kF32:
        out[i] = static_cast<const float*>(t->data)[i];
        break;
      case DType::kF16:
        out[i] = f16_to_float(static_cast<const uint16_t*>(t->data)[i]);
        break;
      case DType::kBF16:
        out[i] = bf16_to_float(static_cast<const uint16_t*>(t->data)[i]);
        break;
      case DType::kQ8_0: {
        const auto* b = static_cast<const Q8Block*>(t->data) + i / kQ8BlockSize;
        out[i] = static_cast<double>(f16_to_float(b->scale_f16)) * b->quants[i % kQ8BlockSize];
        break;
      }
      default:
        break;
    }
  }
  return out;
}

// y = W x for W stored row-major [rows][cols].
Vec matvec(const std::vector<double>& w, int64_t rows, int64_t cols, const Vec& x) {
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (int64_t c = 0; c < cols; ++c)
      acc += w[r * cols + c] * x[c];
    y[r] = acc;
  }
  return y;
}

Vec rms_norm(const Vec& x, const std::vector<double>& w, double eps, size_t offset = 0,
             size_t n = 0) {
  if (n == 0)
    n = x.size();
  double ss = 0;
  for (size_t i = 0; i < n; ++i)
    ss += x[offset + i] * x[offset + i];
  double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  Vec y(n);
  for (size_t i = 0; i < n; ++i)
    y[i] = x[offset + i] * inv * w[i];
  return y;
}

// HF inv_freq, with the Llama-3 frequency-dependent scaling when configured.
Vec inv_frequencies(const model::ModelConfig& c) {
  const int half = c.head_dim / 2;
  Vec inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
  }
  if (c.rope_scaling.is_llama3) {
    const auto& s = c.rope_scaling;
    const double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    const double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

void apply_rope(Vec& x, size_t offset, int head_dim, int64_t pos, const Vec& inv) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * inv[i];
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double a = x[offset + i], b = x[offset + i + half];
    x[offset + i] = a * cs - b * sn;
    x[offset + i + half] = b * cs + a * sn;
  }
}

}  // namespace

std::vector<std::vector<double>> reference_logits(const model::ModelFiles& files,
                                                  const std::vector<int32_t>& tokens) {
  const model::ModelConfig& c = files.config;
  const int64_t H = c.hidden_size, D = c.head_dim, NH = c.num_attention_heads,
                NKV = c.num_key_value_heads, I = c.intermediate_size, V = c.vocab_size;
  const size_t T = tokens.size();
  const Vec inv = inv_frequencies(c);
  const auto embed = tensor(files, "model.embed_tokens.weight");

  Mat x(T, Vec(H));
  for (size_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      x[t][i] = embed[tokens[t] * H + i];

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    auto name = [&](const char* s) { return "model.layers." + std::to_string(l) + "." + s; };
    const auto in_norm = tensor(files, name("input_layernorm.weight"));
    const auto post_norm = tensor(files, name("post_attention_layernorm.weight"));
    const auto wq = tensor(files, name("self_attn.q_proj.weight"));
    const auto wk = tensor(files, name("self_attn.k_proj.weight"));
    const auto wv = tensor(files, name("self_attn.v_proj.weight"));
    const auto wo = tensor(files, name("self_attn.o_proj.weight"));
    const auto wg = tensor(files, name("mlp.gate_proj.weight"));
    const auto wu = tensor(files, name("mlp.up_proj.weight"));
    const auto wd = tensor(files, name("mlp.down_proj.weight"));
    Mat q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      Vec h = rms_norm(x[t], in_norm, c.rms_norm_eps);
      q[t] = matvec(wq, NH * D, H, h);
      k[t] = matvec(wk, NKV * D, H, h);
      v[t] = matvec(wv, NKV * D, H, h);
      if (c.has_qkv_bias) {
        const auto bq = tensor(files, name("self_attn.q_proj.bias"));
        const auto bk = tensor(files, name("self_attn.k_proj.bias"));
        const auto bv = tensor(files, name("self_attn.v_proj.bias"));
        for (int64_t i = 0; i < NH * D; ++i)
          q[t][i] += bq[i];
        for (int64_t i = 0; i < NKV * D; ++i)
          k[t][i] += bk[i], v[t][i] += bv[i];
      }
      if (c.has_qk_norm) {
        const auto qn = tensor(files, name("self_attn.q_norm.weight"));
        const auto kn = tensor(files, name("self_attn.k_norm.weight"));
        for (int64_t h2 = 0; h2 < NH; ++h2) {
          Vec r = rms_norm(q[t], qn, c.rms_norm_eps, h2 * D, D);
          std::copy(r.begin(), r.end(), q[t].begin() + h2 * D);
        }
        for (int64_t h2 = 0; h2 < NKV; ++h2) {
          Vec r = rms_norm(k[t], kn, c.rms_norm_eps, h2 * D, D);
          std::copy(r.begin(), r.end(), k[t].begin() + h2 * D);
        }
      }
      for (int64_t h2 = 0; h2 < NH; ++h2)
        apply_rope(q[t], h2 * D, D, t, inv);
      for (int64_t h2 = 0; h2 < NKV; ++h2)
        apply_rope(k[t], h2 * D, D, t, inv);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (size_t t = 0; t < T; ++t) {
      Vec attn(NH * D, 0.0);
      for (int64_t h2 = 0; h2 < NH; ++h2) {
        const int64_t kvh = h2 / (NH / NKV);
        Vec scores(t + 1);
        double mx = -1e300;
        for (size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[t][h2 * D + d] * k[s][kvh * D + d];
          scores[s] = dot * scale;
          mx = std::max(mx, scores[s]);
        }
        double sum = 0;
        for (double& sc : scores)
          sum += (sc = std::exp(sc - mx));
        for (size_t s = 0; s <= t; ++s)
          for (int64_t d = 0; d < D; ++d)
            attn[h2 * D + d] += scores[s] / sum * v[s][kvh * D + d];
      }
      Vec o = matvec(wo, H, NH * D, attn);
      for (int64_t i = 0; i < H; ++i)
        x[t][i] += o[i];
      Vec h = rms_norm(x[t], post_norm, c.rms_norm_eps);
      Vec g = matvec(wg, I, H, h), u = matvec(wu, I, H, h);
      for (int64_t i = 0; i < I; ++i)
        g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      Vec d = matvec(wd, H, I, g);
      for (int64_t i = 0; i < H; ++i)
        x[t][i] += d[i];
    }
  }
  const auto final_norm = tensor(files, "model.norm.weight");
  const auto head = c.tie_word_embeddings ? embed : tensor(files, "lm_head.weight");
  std::vector<std::vector<double>> logits(T);
  for (size_t t = 0; t < T; ++t)
    logits[t] = matvec(head, V, H, rms_norm(x[t], final_norm, c.rms_norm_eps));
  return logits;
}

}  // namespace crescent::testing
