#include "model/vision_transformer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <utility>

#include "core/fnv.h"
#include "kernels/ops.h"

namespace crescent::model {
namespace {

// Query rows per attention task: enough work per task to amortise the pass over K, little
// enough scratch (rows x segment length scores) to stay in cache.
constexpr int64_t kQueryChunk = 64;

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) {
    v.resize(static_cast<size_t>(n));
  }
  return v.data();
}

// Per-thread scratch of the attention tasks, kept between calls: allocating (and faulting in)
// a large scores buffer per task costs about as much as the softmax over it.
float* thread_scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[3];
  return grow(buffers[slot], n);
}

Result<std::vector<float>> load_vector(const TensorSource& src, const std::string& name,
                                       int64_t size) {
  ASSIGN_OR_RETURN(TensorView t, require_tensor(src, name, {size}));
  return tensor_to_float(t);
}

// Packs the row-wise concatenation of `parts` (each [rows_i][cols]) as one matrix.
Result<kernels::PackedWeight> pack_rows(const std::vector<TensorView>& parts, int64_t cols,
                                        kernels::WeightFormat format) {
  if (parts.size() == 1) {
    return kernels::pack_weight(parts[0].data, parts[0].dtype, parts[0].shape[0], cols, format);
  }
  int64_t rows = 0;
  for (const TensorView& p : parts) {
    rows += p.shape[0];
  }
  std::vector<float> joined(static_cast<size_t>(rows * cols));
  int64_t row = 0;
  for (const TensorView& p : parts) {
    tensor_to_float(p, joined.data() + row * cols);
    row += p.shape[0];
  }
  return kernels::pack_weight(joined.data(), DType::kF32, rows, cols, format);
}

// LayerNorm over `dim` (biased variance), statistics in double.
void layer_norm_rows(const float* x, const float* weight, const float* bias, int64_t num_rows,
                     int64_t dim, double eps, float* y) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) {
      sum += xr[i];
    }
    const double mean = sum / static_cast<double>(dim);
    double sq = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double d = xr[i] - mean;
      sq += d * d;
    }
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      yr[i] = static_cast<float>((xr[i] - mean) * inv * weight[i] + bias[i]);
    }
  }
}

float quick_gelu(float x) {
  return x / (1.0f + std::exp(-1.702f * x));
}

float gelu_erf(float x) {
  return 0.5f * x * (1.0f + std::erf(x / std::numbers::sqrt2_v<float>));
}

}  // namespace

VisionTransformer::VisionTransformer(VisionConfig config, ThreadPool& pool)
    : config_(std::move(config)), pool_(pool) {}

Result<std::unique_ptr<VisionTransformer>> VisionTransformer::load(
    const VisionConfig& config, const TensorSource& tensors,
    const VisionTransformerOptions& options, ThreadPool& pool) {
  RETURN_IF_ERROR(validate_vision_config(config));
  std::unique_ptr<VisionTransformer> t(new VisionTransformer(config, pool));
  RETURN_IF_ERROR(t->load_weights(tensors, options)
                      .with_context("loading the " +
                                    std::string(vision_architecture_name(config.architecture)) +
                                    " vision tower"));
  return t;
}

Status VisionTransformer::load_weights(const TensorSource& src,
                                       const VisionTransformerOptions& options) {
  const VisionConfig& c = config_;
  const bool is_qwen2 = c.architecture == VisionArchitecture::kQwen2Vl;
  const int64_t embed = c.embed_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t merged = int64_t{c.merge_unit()} * embed;
  format_ = options.weights;

  // Hub checkpoints name the tower "visual."; newer transformers "model.visual.".
  std::string prefix = "visual.";
  if (!src.get(prefix + "patch_embed.proj.weight").is_ok() &&
      src.get("model.visual.patch_embed.proj.weight").is_ok()) {
    prefix = "model.visual.";
  }
  auto name = [&](const std::string& suffix) { return prefix + suffix; };
  auto block_name = [&](int b, const char* suffix) {
    return prefix + "blocks." + std::to_string(b) + "." + suffix;
  };
  // A norm's weight, and its bias where the architecture has one (Qwen2-VL's LayerNorm).
  auto load_norm = [&](const std::string& base, std::vector<float>& weight,
                       std::vector<float>& bias) -> Status {
    ASSIGN_OR_RETURN(weight, load_vector(src, base + ".weight", embed));
    if (is_qwen2) {
      ASSIGN_OR_RETURN(bias, load_vector(src, base + ".bias", embed));
    }
    return Status::ok();
  };

  ASSIGN_OR_RETURN(TensorView patch, require_tensor(src, name("patch_embed.proj.weight"),
                                                    {embed, c.in_channels, c.temporal_patch_size,
                                                     c.patch_size, c.patch_size}));
  ASSIGN_OR_RETURN(patch_embed_, pack_rows({patch}, c.patch_dim(), format_));

  blocks_.resize(static_cast<size_t>(c.depth));
  for (int b = 0; b < c.depth; ++b) {
    Block& block = blocks_[static_cast<size_t>(b)];
    block.is_full_attention =
        is_qwen2 || std::find(c.fullatt_block_indexes.begin(), c.fullatt_block_indexes.end(), b) !=
                        c.fullatt_block_indexes.end();
    RETURN_IF_ERROR(load_norm(block_name(b, "norm1"), block.norm1_weight, block.norm1_bias));
    RETURN_IF_ERROR(load_norm(block_name(b, "norm2"), block.norm2_weight, block.norm2_bias));
    ASSIGN_OR_RETURN(TensorView qkv,
                     require_tensor(src, block_name(b, "attn.qkv.weight"), {3 * embed, embed}));
    ASSIGN_OR_RETURN(block.qkv, pack_rows({qkv}, embed, format_));
    ASSIGN_OR_RETURN(block.qkv_bias, load_vector(src, block_name(b, "attn.qkv.bias"), 3 * embed));
    ASSIGN_OR_RETURN(TensorView proj,
                     require_tensor(src, block_name(b, "attn.proj.weight"), {embed, embed}));
    ASSIGN_OR_RETURN(block.proj, pack_rows({proj}, embed, format_));
    ASSIGN_OR_RETURN(block.proj_bias, load_vector(src, block_name(b, "attn.proj.bias"), embed));
    if (is_qwen2) {
      ASSIGN_OR_RETURN(TensorView fc1,
                       require_tensor(src, block_name(b, "mlp.fc1.weight"), {inter, embed}));
      ASSIGN_OR_RETURN(block.mlp_in, pack_rows({fc1}, embed, format_));
      ASSIGN_OR_RETURN(block.mlp_in_bias, load_vector(src, block_name(b, "mlp.fc1.bias"), inter));
      ASSIGN_OR_RETURN(TensorView fc2,
                       require_tensor(src, block_name(b, "mlp.fc2.weight"), {embed, inter}));
      ASSIGN_OR_RETURN(block.mlp_out, pack_rows({fc2}, inter, format_));
      ASSIGN_OR_RETURN(block.mlp_out_bias, load_vector(src, block_name(b, "mlp.fc2.bias"), embed));
    } else {
      ASSIGN_OR_RETURN(TensorView gate,
                       require_tensor(src, block_name(b, "mlp.gate_proj.weight"), {inter, embed}));
      ASSIGN_OR_RETURN(TensorView up,
                       require_tensor(src, block_name(b, "mlp.up_proj.weight"), {inter, embed}));
      ASSIGN_OR_RETURN(block.mlp_in, pack_rows({gate, up}, embed, format_));
      ASSIGN_OR_RETURN(block.mlp_in_bias,
                       load_vector(src, block_name(b, "mlp.gate_proj.bias"), inter));
      ASSIGN_OR_RETURN(std::vector<float> up_bias,
                       load_vector(src, block_name(b, "mlp.up_proj.bias"), inter));
      block.mlp_in_bias.insert(block.mlp_in_bias.end(), up_bias.begin(), up_bias.end());
      ASSIGN_OR_RETURN(TensorView down,
                       require_tensor(src, block_name(b, "mlp.down_proj.weight"), {embed, inter}));
      ASSIGN_OR_RETURN(block.mlp_out, pack_rows({down}, inter, format_));
      ASSIGN_OR_RETURN(block.mlp_out_bias,
                       load_vector(src, block_name(b, "mlp.down_proj.bias"), embed));
    }
  }

  RETURN_IF_ERROR(load_norm(name("merger.ln_q"), merger_norm_weight_, merger_norm_bias_));
  ASSIGN_OR_RETURN(TensorView fc1,
                   require_tensor(src, name("merger.mlp.0.weight"), {merged, merged}));
  ASSIGN_OR_RETURN(merger_fc1_, pack_rows({fc1}, merged, format_));
  ASSIGN_OR_RETURN(merger_fc1_bias_, load_vector(src, name("merger.mlp.0.bias"), merged));
  ASSIGN_OR_RETURN(TensorView fc2,
                   require_tensor(src, name("merger.mlp.2.weight"), {c.out_hidden_size, merged}));
  ASSIGN_OR_RETURN(merger_fc2_, pack_rows({fc2}, merged, format_));
  ASSIGN_OR_RETURN(merger_fc2_bias_,
                   load_vector(src, name("merger.mlp.2.bias"), c.out_hidden_size));
  return Status::ok();
}

int64_t VisionTransformer::num_weight_params() const {
  auto params = [](const kernels::PackedWeight& w) { return w.rows() * w.cols(); };
  int64_t n = params(patch_embed_);
  for (const Block& b : blocks_) {
    n += params(b.qkv) + params(b.proj) + params(b.mlp_in) + params(b.mlp_out);
  }
  // The merger runs once per merge_unit patches.
  return n + (params(merger_fc1_) + params(merger_fc2_)) / config_.merge_unit();
}

Status VisionTransformer::check_grid(int grid_t, int grid_h, int grid_w) const {
  const int m = config_.spatial_merge_size;
  // The bound keeps grid_t * grid_h * grid_w (and the FLOP counts) far from overflow.
  constexpr int kMaxGrid = 1 << 20;
  if (grid_t <= 0 || grid_h <= 0 || grid_w <= 0 || grid_t > kMaxGrid || grid_h > kMaxGrid ||
      grid_w > kMaxGrid) {
    return invalid_argument("vision encode: grid " + std::to_string(grid_t) + "x" +
                            std::to_string(grid_h) + "x" + std::to_string(grid_w) +
                            " must be positive and at most " + std::to_string(kMaxGrid) +
                            " per side");
  }
  if (grid_h % m != 0 || grid_w % m != 0) {
    return invalid_argument("vision encode: grid_h " + std::to_string(grid_h) + " and grid_w " +
                            std::to_string(grid_w) + " must be multiples of spatial_merge_size " +
                            std::to_string(m));
  }
  return Status::ok();
}

VisionTransformer::Layout VisionTransformer::make_layout(int grid_t, int grid_h, int grid_w) const {
  const int64_t m = config_.spatial_merge_size;
  const int64_t unit = config_.merge_unit();
  const int64_t units_h = grid_h / m;
  const int64_t units_w = grid_w / m;
  const int64_t frame_units = units_h * units_w;
  Layout layout;
  layout.unit_order.reserve(static_cast<size_t>(grid_t * frame_units));
  for (int64_t t = 0; t < grid_t; ++t) {
    layout.frames.push_back({t * frame_units * unit, (t + 1) * frame_units * unit});
  }
  if (config_.architecture == VisionArchitecture::kQwen2Vl) {
    layout.unit_order.resize(static_cast<size_t>(grid_t * frame_units));
    std::iota(layout.unit_order.begin(), layout.unit_order.end(), int64_t{0});
    return layout;
  }
  // get_window_index(): n x n units per window, partial windows at the bottom / right edge.
  const int64_t n = config_.window_size / m / config_.patch_size;
  for (int64_t t = 0; t < grid_t; ++t) {
    for (int64_t wy = 0; wy < units_h; wy += n) {
      for (int64_t wx = 0; wx < units_w; wx += n) {
        const auto begin = static_cast<int64_t>(layout.unit_order.size());
        for (int64_t y = wy; y < std::min(wy + n, units_h); ++y) {
          for (int64_t x = wx; x < std::min(wx + n, units_w); ++x) {
            layout.unit_order.push_back(t * frame_units + y * units_w + x);
          }
        }
        const auto end = static_cast<int64_t>(layout.unit_order.size());
        layout.windows.push_back({begin * unit, end * unit});
      }
    }
  }
  return layout;
}

int64_t VisionTransformer::attention_flops(int grid_t, int grid_h, int grid_w) const {
  if (!check_grid(grid_t, grid_h, grid_w).is_ok())
    return 0;
  // Sums of squared segment lengths, from the window spans rather than a layout (no
  // allocation); in double so that absurd grids saturate instead of overflowing.
  const double unit = config_.merge_unit();
  const double frame = static_cast<double>(grid_h) * grid_w;
  const double full = grid_t * frame * frame;
  double windowed = 0;
  if (config_.architecture == VisionArchitecture::kQwen25Vl) {
    const int64_t m = config_.spatial_merge_size;
    const int64_t n = config_.window_size / m / config_.patch_size;
    // A window of rows x columns units holds rows * columns * unit patches.
    auto sum_of_squared_spans = [n](int64_t units) {
      double sum = 0;
      for (int64_t begin = 0; begin < units; begin += n) {
        const auto span = static_cast<double>(std::min(n, units - begin));
        sum += span * span;
      }
      return sum;
    };
    windowed =
        grid_t * unit * unit * sum_of_squared_spans(grid_h / m) * sum_of_squared_spans(grid_w / m);
  }
  double flops = 0;
  for (const Block& b : blocks_) {
    flops += 2.0 * config_.embed_dim * (b.is_full_attention ? full : windowed);  // q k^T, p v
  }
  return flops >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(flops);
}

void VisionTransformer::norm(const float* x, const std::vector<float>& weight,
                             const std::vector<float>& bias, int64_t num_rows, float* y) {
  const int64_t dim = config_.embed_dim;
  const double eps = config_.norm_eps;
  pool_.parallel_range(num_rows, [&](int64_t begin, int64_t end) {
    if (bias.empty()) {
      kernels::rms_norm(x + begin * dim, weight.data(), end - begin, dim, static_cast<float>(eps),
                        y + begin * dim);
    } else {
      layer_norm_rows(x + begin * dim, weight.data(), bias.data(), end - begin, dim, eps,
                      y + begin * dim);
    }
  });
}

// Non-causal attention of qkv_ ([rows][q | k | v]) within each segment, into attn_. First K
// and V^T of every (segment, head) are packed as weights; then each (segment, head, query
// chunk) task runs scores = q K^T and out = softmax(scores * scale) V as two matmuls on its own
// thread (an inline pool), so the pool's threads split the segments, heads and rows.
void VisionTransformer::attention(const std::vector<Segment>& segments, int64_t num_rows) {
  const int64_t embed = config_.embed_dim;
  const int num_heads = config_.num_heads;
  const int64_t head_dim = config_.head_dim();
  const int64_t stride = 3 * embed;
  const float* qkv = qkv_.data();
  float* attn = grow(attn_, num_rows * embed);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // K and V^T stay F32 even in a BF16 tower: packing them as BF16 measured no faster (the
  // time goes to the per-task passes over K and the softmax, not the dot products) and F32
  // keeps attention exact.
  const kernels::WeightFormat attention_format = kernels::WeightFormat::kF32;

  const auto num_pairs = static_cast<int>(segments.size()) * num_heads;
  std::vector<kernels::PackedWeight> keys(static_cast<size_t>(num_pairs));
  std::vector<kernels::PackedWeight> values_t(static_cast<size_t>(num_pairs));
  pool_.parallel_for(num_pairs, [&](int pair) {
    const Segment& s = segments[static_cast<size_t>(pair / num_heads)];
    const int64_t head = pair % num_heads;
    const int64_t len = s.end - s.begin;
    float* k = thread_scratch(0, len * head_dim);
    float* vt = thread_scratch(1, len * head_dim);
    for (int64_t j = 0; j < len; ++j) {
      const float* row = qkv + (s.begin + j) * stride + head * head_dim;
      std::memcpy(k + j * head_dim, row + embed, static_cast<size_t>(head_dim) * sizeof(float));
      for (int64_t d = 0; d < head_dim; ++d) {
        vt[d * len + j] = row[2 * embed + d];
      }
    }
    // F32 packing of float data cannot fail. Per-image temporaries: heap, not the model's
    // huge-page chunks (weight_memory.h).
    constexpr auto kTransient = kernels::WeightStorage::kTransient;
    keys[static_cast<size_t>(pair)] =
        std::move(kernels::pack_weight(k, DType::kF32, len, head_dim, attention_format, kTransient))
            .value();
    values_t[static_cast<size_t>(pair)] =
        std::move(
            kernels::pack_weight(vt, DType::kF32, head_dim, len, attention_format, kTransient))
            .value();
  });

  struct Task {
    int pair;
    int64_t first_row;  // within the segment
  };
  std::vector<Task> tasks;
  for (int pair = 0; pair < num_pairs; ++pair) {
    const Segment& s = segments[static_cast<size_t>(pair / num_heads)];
    for (int64_t r = 0; r < s.end - s.begin; r += kQueryChunk) {
      tasks.push_back({pair, r});
    }
  }
  pool_.parallel_for(static_cast<int>(tasks.size()), [&](int i) {
    const Task& task = tasks[static_cast<size_t>(i)];
    const Segment& s = segments[static_cast<size_t>(task.pair / num_heads)];
    const int64_t head = task.pair % num_heads;
    const int64_t len = s.end - s.begin;
    const int64_t rows = std::min(kQueryChunk, len - task.first_row);
    float* q = thread_scratch(0, rows * head_dim);
    float* scores = thread_scratch(1, rows * len);
    float* out = thread_scratch(2, rows * head_dim);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(q + r * head_dim, qkv + (s.begin + task.first_row + r) * stride + head * head_dim,
                  static_cast<size_t>(head_dim) * sizeof(float));
    }
    ThreadPool inline_pool(1);
    kernels::matmul(q, rows, keys[static_cast<size_t>(task.pair)], nullptr, scores, inline_pool);
    for (int64_t r = 0; r < rows; ++r) {
      kernels::softmax_scaled(scores + r * len, len, scale);
    }
    kernels::matmul(scores, rows, values_t[static_cast<size_t>(task.pair)], nullptr, out,
                    inline_pool);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(attn + (s.begin + task.first_row + r) * embed + head * head_dim,
                  out + r * head_dim, static_cast<size_t>(head_dim) * sizeof(float));
    }
  });
}

Status VisionTransformer::encode(std::span<const float> pixel_values, int grid_t, int grid_h,
                                 int grid_w, std::vector<float>& out) {
  const VisionConfig& c = config_;
  RETURN_IF_ERROR(check_grid(grid_t, grid_h, grid_w));
  last_attention_seconds_ = 0;
  const int64_t num_rows = int64_t{grid_t} * grid_h * grid_w;
  const int64_t patch_dim = c.patch_dim();
  if (pixel_values.size() % static_cast<size_t>(patch_dim) != 0 ||
      static_cast<int64_t>(pixel_values.size()) / patch_dim != num_rows) {
    return invalid_argument(
        "vision encode: " + std::to_string(pixel_values.size()) + " pixel values for a " +
        std::to_string(grid_t) + "x" + std::to_string(grid_h) + "x" + std::to_string(grid_w) +
        " grid, expected " + std::to_string(num_rows) + " patches of " + std::to_string(patch_dim));
  }
  const bool is_qwen2 = c.architecture == VisionArchitecture::kQwen2Vl;
  const int64_t embed = c.embed_dim;
  const int64_t inter = c.intermediate_size;
  const int64_t unit = c.merge_unit();
  const int64_t num_units = num_rows / unit;
  const int64_t merged_dim = unit * embed;
  const int64_t head_dim = c.head_dim();
  const int64_t half = head_dim / 2;
  const Layout layout = make_layout(grid_t, grid_h, grid_w);

  float* x = grow(x_, num_rows * embed);
  float* h = grow(h_, num_rows * embed);
  float* qkv = grow(qkv_, num_rows * 3 * embed);
  float* proj = grow(proj_, num_rows * embed);
  float* mlp = grow(mlp_, num_rows * (is_qwen2 ? inter : 2 * inter));
  float* act = grow(act_, num_rows * inter);
  float* cos = grow(cos_, num_rows * half);
  float* sin = grow(sin_, num_rows * half);

  // 1. Patch embedding, then the units into layout order (identity for Qwen2-VL).
  kernels::matmul(pixel_values.data(), num_rows, patch_embed_, nullptr, h, pool_);
  // 2. Rotary angles of every row in layout order, from its (row, column) in the grid.
  const int64_t m = c.spatial_merge_size;
  const int64_t units_w = grid_w / m;
  const int64_t frame_units = (grid_h / m) * units_w;
  std::vector<double> inv_freq(static_cast<size_t>(half / 2));
  for (int64_t j = 0; j < half / 2; ++j) {
    inv_freq[static_cast<size_t>(j)] =
        1.0 / std::pow(10000.0, static_cast<double>(2 * j) / static_cast<double>(half));
  }
  pool_.parallel_range(num_units, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t u = layout.unit_order[static_cast<size_t>(p)];
      std::memcpy(x + p * unit * embed, h + u * unit * embed,
                  static_cast<size_t>(unit * embed) * sizeof(float));
      const int64_t in_frame = u % frame_units;
      for (int64_t k = 0; k < unit; ++k) {
        const int64_t row = (in_frame / units_w) * m + k / m;
        const int64_t column = (in_frame % units_w) * m + k % m;
        const auto pos_h = static_cast<double>(row);
        const auto pos_w = static_cast<double>(column);
        float* cr = cos + (p * unit + k) * half;
        float* sr = sin + (p * unit + k) * half;
        for (int64_t j = 0; j < half; ++j) {
          const double angle = j < half / 2 ? pos_h * inv_freq[static_cast<size_t>(j)]
                                            : pos_w * inv_freq[static_cast<size_t>(j - half / 2)];
          cr[j] = static_cast<float>(std::cos(angle));
          sr[j] = static_cast<float>(std::sin(angle));
        }
      }
    }
  });

  for (const Block& block : blocks_) {
    norm(x, block.norm1_weight, block.norm1_bias, num_rows, h);
    kernels::matmul(h, num_rows, block.qkv, block.qkv_bias.data(), qkv, pool_);
    pool_.parallel_range(num_rows, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* cr = cos + r * half;
        const float* sr = sin + r * half;
        // q heads then k heads: 2 * num_heads vectors of head_dim.
        float* v = qkv + r * 3 * embed;
        for (int64_t vec = 0; vec < 2 * int64_t{c.num_heads}; ++vec, v += head_dim) {
          for (int64_t j = 0; j < half; ++j) {
            const float a = v[j];
            const float b = v[j + half];
            v[j] = a * cr[j] - b * sr[j];
            v[j + half] = b * cr[j] + a * sr[j];
          }
        }
      }
    });
    const auto attention_start = std::chrono::steady_clock::now();
    attention(block.is_full_attention ? layout.frames : layout.windows, num_rows);
    last_attention_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - attention_start).count();
    kernels::matmul(attn_.data(), num_rows, block.proj, block.proj_bias.data(), proj, pool_);
    kernels::add_inplace(x, proj, num_rows * embed);

    norm(x, block.norm2_weight, block.norm2_bias, num_rows, h);
    kernels::matmul(h, num_rows, block.mlp_in, block.mlp_in_bias.data(), mlp, pool_);
    const float* mlp_out_input = mlp;
    if (is_qwen2) {
      pool_.parallel_range(num_rows * inter, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          mlp[i] = quick_gelu(mlp[i]);
        }
      });
    } else {
      pool_.parallel_range(num_rows, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          kernels::silu_mul(mlp + r * 2 * inter, mlp + r * 2 * inter + inter, inter,
                            act + r * inter);
        }
      });
      mlp_out_input = act;
    }
    kernels::matmul(mlp_out_input, num_rows, block.mlp_out, block.mlp_out_bias.data(), proj, pool_);
    kernels::add_inplace(x, proj, num_rows * embed);
  }

  // 5. Merger: each unit's U consecutive normalised rows form one row of merged_dim.
  norm(x, merger_norm_weight_, merger_norm_bias_, num_rows, h);
  float* merged = grow(merged_, num_units * merged_dim);
  kernels::matmul(h, num_units, merger_fc1_, merger_fc1_bias_.data(), merged, pool_);
  pool_.parallel_range(num_units * merged_dim, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      merged[i] = gelu_erf(merged[i]);
    }
  });
  const int64_t out_dim = c.out_hidden_size;
  out.resize(static_cast<size_t>(num_units * out_dim));
  if (is_qwen2) {
    kernels::matmul(merged, num_units, merger_fc2_, merger_fc2_bias_.data(), out.data(), pool_);
    return Status::ok();
  }
  // Undo the window order: layout row p is input unit unit_order[p].
  float* rows = grow(proj_, num_units * out_dim);
  kernels::matmul(merged, num_units, merger_fc2_, merger_fc2_bias_.data(), rows, pool_);
  for (int64_t p = 0; p < num_units; ++p) {
    std::memcpy(out.data() + layout.unit_order[static_cast<size_t>(p)] * out_dim,
                rows + p * out_dim, static_cast<size_t>(out_dim) * sizeof(float));
  }
  return Status::ok();
}

uint64_t VisionTransformer::weights_fingerprint() const {
  Fnv1a64 h;
  auto mix = [&h](const std::vector<float>& v) {
    h.bytes(v.data(), v.size() * sizeof(float));
    h.word(v.size());  // where one vector ends
  };
  for (const Block& b : blocks_) {
    for (const std::vector<float>* v :
         {&b.norm1_weight, &b.norm1_bias, &b.norm2_weight, &b.norm2_bias, &b.qkv_bias, &b.proj_bias,
          &b.mlp_in_bias, &b.mlp_out_bias}) {
      mix(*v);
    }
  }
  for (const std::vector<float>* v :
       {&merger_norm_weight_, &merger_norm_bias_, &merger_fc1_bias_, &merger_fc2_bias_}) {
    mix(*v);
  }
  return h.value();
}

}  // namespace crescent::model
