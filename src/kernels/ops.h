#pragma once
// Element-wise and row-wise ops of a transformer layer, RoPE, and the sampling primitives.
// All tensors are float32, row-major, owned by the caller. Functions are stateless and
// thread-safe; they run on the calling thread (they are cheap next to matmul and attention).

#include <cstdint>
#include <span>
#include <vector>

namespace crescent::kernels {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for num_rows rows of dim. y may alias x.
void rms_norm(const float* x, const float* weight, int64_t num_rows, int64_t dim, float eps,
              float* y);
// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);
// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

// HF rope_scaling; is_llama3 selects rope_type "llama3" frequency scaling.
struct RopeScaling {
  bool is_llama3 = false;
  double factor = 1;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int original_max_position_embeddings = 8192;
};

// Precomputed cos/sin for positions [0, max_positions), head_dim / 2 frequencies each;
// inv_freq[i] = theta^(-2i/head_dim) (then Llama-3 scaled) computed in double, as in HF.
// Immutable after construction; shareable across threads.
class RopeTable {
 public:
  RopeTable(int head_dim, double theta, int64_t max_positions, const RopeScaling& scaling);

  int head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  const std::vector<double>& inv_freq() const { return inv_freq_; }
  const float* cos(int64_t pos) const { return cos_.data() + pos * (head_dim_ / 2); }
  const float* sin(int64_t pos) const { return sin_.data() + pos * (head_dim_ / 2); }

 private:
  int head_dim_;
  int64_t max_positions_;
  std::vector<double> inv_freq_;
  std::vector<float> cos_;
  std::vector<float> sin_;
};

// Rotates x ([num_tokens][num_heads][head_dim]) in place, HF "rotate_half" (NeoX) style:
// (x[i], x[i + half]) is rotated by the angle positions[t] * inv_freq[i].
// Positions must be in [0, table.max_positions()) (CHECKed).
void rope(float* x, const int32_t* positions, int64_t num_tokens, int num_heads,
          const RopeTable& table);

// Multimodal RoPE (Qwen2-VL's M-RoPE): like rope(), but each token has three positions
// (temporal, height, width; positions3[t * 3 + k]) and rotary pair i turns with position k where
// i falls in the k-th of `sections` (consecutive runs of pairs whose sizes sum to head_dim / 2).
// Tokens whose three positions are equal rotate exactly as rope() does.
void rope_multi(float* x, const int32_t* positions3, int64_t num_tokens, int num_heads,
                const RopeTable& table, std::span<const int> sections);

// Index of the first largest element (n >= 1).
int64_t argmax(const float* x, int64_t n);
// In place, numerically stable (subtracts the max first).
void softmax(float* x, int64_t n);
// softmax(x * scale) in place (scale > 0), with the ISA's vector exp (~1 ulp): the attention
// of the vision towers, whose rows are thousands long.
void softmax_scaled(float* x, int64_t n, float scale);
// x[i] = exp(x[i] * scale - shift) in place with the ISA's vector exp (~1 ulp); returns their
// sum (accumulated in float lanes). -inf inputs become 0 (and, on AVX-512, results below
// float's normal range; the portable path may keep them as denormals). The sampler's softmax
// over a whole vocabulary.
float exp_scaled(float* x, int64_t n, float scale, float shift);
// The largest x[i] with the ISA's vector max, NaN ignored; -inf when there is none.
float max_value(const float* x, int64_t n);
// log(sum(exp(x))), stable; -inf when every x is -inf.
float log_sum_exp(const float* x, int64_t n);

}  // namespace crescent::kernels
