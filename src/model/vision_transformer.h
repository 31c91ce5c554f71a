#pragma once
// The vision tower of Qwen2-VL and Qwen2.5-VL (a ViT with 2-D rotary attention) and its patch
// merger, on the CPU: turns one image's (or video's) flattened patches into the embeddings that
// replace its <|image_pad|> tokens in the language model's input.
//
// A VisionTransformer owns its packed weights (it copies them out of the TensorSource, which
// need not outlive it). encode() is not thread-safe (it reuses scratch buffers); it
// parallelises inside through the pool given to load().
//
// The computation, as transformers' modeling_qwen2_vl.py / modeling_qwen2_5_vl.py define it.
// E = embed_dim, H = num_heads, D = E / H, m = spatial_merge_size, U = m * m (merge_unit),
// N = grid_t * grid_h * grid_w patches. Linear layers are y = x W^T + b with W in HF layout.
//  1. Patch embedding (Conv3d, kernel = stride = (tp, p, p), no bias): x[i] = W_pe x_in[i] with
//     W_pe reshaped to [E][C * tp * p * p]. Input row i is in Qwen2VLImageProcessor's order
//     (t, h / m, w / m, m, m): patch i covers frame t, row h_i, column w_i, where
//     i = ((t * (grid_h/m) + bh) * (grid_w/m) + bw) * U + r * m + c, h_i = bh*m + r,
//     w_i = bw*m + c; its values are ordered (channel, temporal, row, column).
//  2. Rotary angles of patch i: inv_freq[j] = 1 / 10000^(2j / (D/2)) for j < D/4;
//     theta[i] = (h_i * inv_freq[0..D/4), w_i * inv_freq[0..D/4)), D/2 angles. For q and k of
//     every head, the pair (v[k], v[k + D/2]) for k < D/2 is rotated by theta[i][k]:
//     (v[k] cos - v[k+D/2] sin, v[k+D/2] cos + v[k] sin)  (rotate_half with emb = cat(theta,
//     theta)).
//  3. Qwen2.5-VL only: window order. Merged units (groups of U consecutive rows) of each frame
//     form a (grid_h/m) x (grid_w/m) grid; it is cut into windows of n x n units,
//     n = window_size / m / patch_size (the last row / column of windows may be smaller).
//     Units are reordered frame by frame, window by window (row-major over windows), row-major
//     inside a window; rows move with their rotary angles. Blocks in fullatt_block_indexes
//     attend over the whole frame, the others within their window. Since the order is undone
//     at the end, this equals: patch i attends to the patches of its frame whose unit lies in
//     the same window (bh / n, bw / n). Qwen2-VL keeps the input order and every block
//     attends over the whole frame.
//  4. depth blocks: x += proj(attn(norm1(x))); x += mlp(norm2(x)).
//     norm: Qwen2-VL LayerNorm (biased variance, weight and bias), Qwen2.5-VL RMSNorm
//     (x / sqrt(mean(x^2) + eps) * weight); eps = norm_eps (1e-6).
//     attn: qkv = W_qkv h + b, row split as [q | k | v], each [H][D]; rotary on q and k;
//     per head and per attention segment (frame or window) softmax(q k^T / sqrt(D)) v,
//     no mask; heads concatenated; proj has a bias.
//     mlp: Qwen2-VL fc2(quick_gelu(fc1 h)), quick_gelu(x) = x * sigmoid(1.702 x);
//     Qwen2.5-VL down(silu(gate h) * up h); every linear has a bias.
//  5. Merger: ln_q per row (LayerNorm for Qwen2-VL, RMSNorm for Qwen2.5-VL, eps 1e-6), then
//     each U consecutive rows concatenated into one [U * E] row; mlp.2(gelu(mlp.0 r)) with
//     the exact gelu(x) = x / 2 * (1 + erf(x / sqrt(2))). Output row u is merged unit u of
//     the input order (step 3's reordering is undone).
// Activations are float32. With WeightFormat::kF32 every linear layer and both attention
// products (q k^T, then p v after softmax(scores * scale) with the row maximum subtracted) are
// float32 FMA sums; LayerNorm statistics are taken in double, RMSNorm is kernels::rms_norm;
// inv_freq, the angles and their cos/sin are computed in double and stored as float32. The
// result agrees with a float64 evaluation to about 1e-6 relative (tested at 1e-5).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "model/tensor_source.h"
#include "model/vision_config.h"

namespace crescent::model {

struct VisionTransformerOptions {
  kernels::WeightFormat weights = kernels::WeightFormat::kBF16;
};

class VisionTransformer {
 public:
  // Weights by Hugging Face name under "visual." (or "model.visual.", as newer transformers
  // write): patch_embed.proj.weight [E, C, tp, p, p]; blocks.N.{norm1,norm2}.weight (+ .bias
  // for Qwen2-VL); blocks.N.attn.{qkv,proj}.{weight,bias}; Qwen2-VL blocks.N.mlp.{fc1,fc2},
  // Qwen2.5-VL blocks.N.mlp.{gate_proj,up_proj,down_proj} (weight + bias); merger.ln_q.weight
  // (+ .bias for Qwen2-VL); merger.mlp.0 [U*E, U*E] and merger.mlp.2 [out_hidden_size, U*E]
  // (weight + bias). InvalidArgument for a bad config; errors name a missing or misshapen
  // tensor.
  static Result<std::unique_ptr<VisionTransformer>> load(const VisionConfig& config,
                                                         const TensorSource& tensors,
                                                         const VisionTransformerOptions& options,
                                                         ThreadPool& pool);

  const VisionConfig& config() const { return config_; }
  kernels::WeightFormat weight_format() const { return format_; }
  // 64-bit FNV-1a of every norm weight and bias and every linear layer's bias, as loaded
  // (float32): two checkpoints of one architecture (a fine-tune, another size with the same
  // shape) differ here, so encoders and prefill workers refuse to mix their embeddings. The
  // packed matrices are left out to keep it cheap (they are trained with the same data).
  uint64_t weights_fingerprint() const;

  // pixel_values: [grid_t * grid_h * grid_w][patch_dim] in Qwen2VLImageProcessor's flatten
  // order (see above). out: resized to [num_tokens][out_hidden_size] with num_tokens =
  // grid_t * grid_h * grid_w / merge_unit(). InvalidArgument for a size mismatch, a
  // non-positive grid, or grid_h / grid_w not multiples of spatial_merge_size.
  Status encode(std::span<const float> pixel_values, int grid_t, int grid_h, int grid_w,
                std::vector<float>& out);

  // Multiply-adds per patch in the linear layers (patch embedding, blocks, merger / U), for
  // FLOP figures; attention scores and values excluded.
  int64_t num_weight_params() const;
  // Multiply-adds of the attention scores (q k^T) and values (p v) over all blocks for one
  // image; 0 for a grid encode() would reject.
  int64_t attention_flops(int grid_t, int grid_h, int grid_w) const;
  // Wall seconds the last encode() spent in attention (scores, softmax, values), so that a
  // benchmark can report the linear layers' rate apart from attention's.
  double last_attention_seconds() const { return last_attention_seconds_; }

 private:
  struct Block {
    std::vector<float> norm1_weight, norm1_bias;  // biases: Qwen2-VL only
    std::vector<float> norm2_weight, norm2_bias;
    kernels::PackedWeight qkv;
    std::vector<float> qkv_bias;
    kernels::PackedWeight proj;
    std::vector<float> proj_bias;
    kernels::PackedWeight mlp_in;  // Qwen2-VL fc1; Qwen2.5-VL rows: gate, then up
    std::vector<float> mlp_in_bias;
    kernels::PackedWeight mlp_out;  // fc2 / down_proj
    std::vector<float> mlp_out_bias;
    bool is_full_attention = true;
  };
  // Rows [begin, end) of the (reordered) sequence that attend to each other.
  struct Segment {
    int64_t begin = 0;
    int64_t end = 0;
  };
  // How one grid is laid out: the unit order and the attention segments.
  struct Layout {
    std::vector<int64_t> unit_order;  // position p holds input unit unit_order[p]
    std::vector<Segment> frames;
    std::vector<Segment> windows;  // Qwen2.5-VL; empty for Qwen2-VL
  };

  VisionTransformer(VisionConfig config, ThreadPool& pool);
  Status load_weights(const TensorSource& tensors, const VisionTransformerOptions& options);
  Status check_grid(int grid_t, int grid_h, int grid_w) const;
  Layout make_layout(int grid_t, int grid_h, int grid_w) const;
  void norm(const float* x, const std::vector<float>& weight, const std::vector<float>& bias,
            int64_t num_rows, float* y);
  void attention(const std::vector<Segment>& segments, int64_t num_rows);

  VisionConfig config_;
  ThreadPool& pool_;
  kernels::WeightFormat format_ = kernels::WeightFormat::kBF16;
  kernels::PackedWeight patch_embed_;
  std::vector<Block> blocks_;
  std::vector<float> merger_norm_weight_, merger_norm_bias_;
  kernels::PackedWeight merger_fc1_;
  std::vector<float> merger_fc1_bias_;
  kernels::PackedWeight merger_fc2_;
  std::vector<float> merger_fc2_bias_;

  // Scratch, grown on demand.
  double last_attention_seconds_ = 0;
  std::vector<float> x_, h_, qkv_, attn_, proj_, mlp_, act_, cos_, sin_, merged_;
};

}  // namespace crescent::model
