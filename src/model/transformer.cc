#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/fnv.h"
#include "core/logging.h"

namespace crescent::model {
namespace {

std::string layer_name(int layer, const char* suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

Result<std::vector<float>> load_vector(const TensorSource& src, const std::string& name,
                                       int64_t size) {
  ASSIGN_OR_RETURN(TensorView t, require_tensor(src, name, {size}));
  return tensor_to_float(t);
}

kernels::WeightFormat choose_format(TransformerOptions::Weights w, DType source) {
  switch (w) {
    case TransformerOptions::Weights::kF32:
      return kernels::WeightFormat::kF32;
    case TransformerOptions::Weights::kBF16:
      return kernels::WeightFormat::kBF16;
    case TransformerOptions::Weights::kQ8_0:
      return kernels::WeightFormat::kQ8_0;
    case TransformerOptions::Weights::kAuto:
      break;
  }
  return kernels::native_weight_format(source).value_or(kernels::WeightFormat::kBF16);
}

// kAuto on a fused matrix (gate/up; q/k/v when pack_parts keeps them together): it computes in
// its parts' block type, or the widest of them when they differ (the narrower rows are
// requantised, a small loss that keeps the matrix one matmul).
kernels::WeightFormat auto_format(const std::vector<TensorView>& parts,
                                  kernels::WeightFormat fallback) {
  DType widest = parts[0].dtype;
  for (const auto& p : parts) {
    const double bits = 8.0 * dtype_block_bytes(p.dtype) / dtype_block_size(p.dtype);
    if (bits > 8.0 * dtype_block_bytes(widest) / dtype_block_size(widest))
      widest = p.dtype;
  }
  if (std::optional<kernels::WeightFormat> native = kernels::native_weight_format(widest))
    return *native;
  return kernels::ggml_row_dtype(fallback) ? kernels::WeightFormat::kBF16 : fallback;
}

// Packs the row-wise concatenation of `parts` (each [rows_i][cols]) as one matrix, so that
// q/k/v and gate/up run as one matmul each.
Result<kernels::PackedWeight> pack_rows(const std::vector<TensorView>& parts, int64_t cols,
                                        kernels::WeightFormat format, bool is_auto) {
  if (is_auto)
    format = auto_format(parts, format);
  int64_t rows = 0;
  bool same_dtype = true;
  for (const auto& p : parts) {
    rows += p.shape[0];
    same_dtype = same_dtype && p.dtype == parts[0].dtype;
  }
  if (parts.size() == 1) {
    return kernels::pack_weight(parts[0].data, parts[0].dtype, rows, cols, format);
  }
  if (same_dtype) {
    std::vector<uint8_t> joined;
    for (const auto& p : parts) {
      const auto* b = static_cast<const uint8_t*>(p.data);
      joined.insert(joined.end(), b, b + dtype_num_bytes(p.dtype, p.shape[0] * cols));
    }
    return kernels::pack_weight(joined.data(), parts[0].dtype, rows, cols, format);
  }
  std::vector<float> joined(static_cast<size_t>(rows * cols));
  int64_t row = 0;
  for (const auto& p : parts) {
    dtype_to_float(p.dtype, p.data, p.shape[0] * cols, joined.data() + row * cols);
    row += p.shape[0];
  }
  return kernels::pack_weight(joined.data(), DType::kF32, rows, cols, format);
}

// q/k/v: one fused matrix, as pack_rows makes it, unless kAuto finds the GGUF parts in different
// block types that each have a kernel, which then stay apart in their own types: requantising
// Q4_K_M's Q4_K q / k to its Q6_K v's type was two thirds of llama-3.2-1b's load time (4.6-5.1 s
// -> 1.6 s), 1.3% more bytes per decoded token and a little precision.
Result<std::vector<kernels::PackedWeight>> pack_parts(const std::vector<TensorView>& parts,
                                                      int64_t cols, kernels::WeightFormat format,
                                                      bool is_auto) {
  std::vector<kernels::PackedWeight> out;
  const bool apart = is_auto &&
                     std::any_of(parts.begin(), parts.end(),
                                 [&](const TensorView& p) { return p.dtype != parts[0].dtype; }) &&
                     std::all_of(parts.begin(), parts.end(), [](const TensorView& p) {
                       return kernels::native_weight_format(p.dtype).has_value();
                     });
  if (!apart) {
    ASSIGN_OR_RETURN(kernels::PackedWeight w, pack_rows(parts, cols, format, is_auto));
    out.push_back(std::move(w));
    return out;
  }
  for (const auto& p : parts) {
    ASSIGN_OR_RETURN(kernels::PackedWeight w, pack_rows({p}, cols, format, is_auto));
    out.push_back(std::move(w));
  }
  return out;
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) {
    v.resize(static_cast<size_t>(n));
  }
  return v.data();
}

// A row-wise op over num_rows rows of row_values values: a prefill-sized batch splits its rows
// between the pool's threads (run on the calling thread alone, the norms, RoPE, SiLU and
// residual adds left the other threads waiting, ~4% of a 512-token prefill); a decode step's few
// rows stay on the calling thread, where waking the workers costs more than the op.
template <typename Fn>
void for_row_ranges(ThreadPool& pool, int64_t num_rows, int64_t row_values, const Fn& fn) {
  constexpr int64_t kMinParallelValues = int64_t{1} << 16;
  if (num_rows > 1 && num_rows * row_values >= kMinParallelValues) {
    pool.parallel_range(num_rows, fn);
  } else {
    fn(0, num_rows);
  }
}

}  // namespace

Transformer::Transformer(ModelFiles files, ThreadPool& pool)
    : files_(std::move(files)), pool_(pool) {}

Result<std::unique_ptr<Transformer>> Transformer::load(ModelFiles files,
                                                       const TransformerOptions& options,
                                                       ThreadPool& pool) {
  std::unique_ptr<Transformer> t(new Transformer(std::move(files), pool));
  RETURN_IF_ERROR(t->load_weights(options).with_context("loading " + t->files_.name));
  return t;
}

Status Transformer::load_weights(const TransformerOptions& options) {
  const ModelConfig& c = files_.config;
  const TensorSource& src = *files_.tensors;
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * c.head_dim;
  const int64_t inter = c.intermediate_size;
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return invalid_argument("num_attention_heads must be a multiple of num_key_value_heads");
  }

  ASSIGN_OR_RETURN(embed_tokens_,
                   require_tensor(src, "model.embed_tokens.weight", {c.vocab_size, hidden}));
  format_ = choose_format(options.weights, embed_tokens_.dtype);
  const bool is_auto = options.weights == TransformerOptions::Weights::kAuto;

  layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& layer = layers_[static_cast<size_t>(l)];
    ASSIGN_OR_RETURN(layer.input_norm,
                     load_vector(src, layer_name(l, "input_layernorm.weight"), hidden));
    ASSIGN_OR_RETURN(layer.post_attention_norm,
                     load_vector(src, layer_name(l, "post_attention_layernorm.weight"), hidden));
    ASSIGN_OR_RETURN(TensorView q, require_tensor(src, layer_name(l, "self_attn.q_proj.weight"),
                                                  {q_dim, hidden}));
    ASSIGN_OR_RETURN(TensorView k, require_tensor(src, layer_name(l, "self_attn.k_proj.weight"),
                                                  {kv_dim, hidden}));
    ASSIGN_OR_RETURN(TensorView v, require_tensor(src, layer_name(l, "self_attn.v_proj.weight"),
                                                  {kv_dim, hidden}));
    ASSIGN_OR_RETURN(layer.qkv, pack_parts({q, k, v}, hidden, format_, is_auto));
    if (c.has_qkv_bias) {
      ASSIGN_OR_RETURN(auto qb, load_vector(src, layer_name(l, "self_attn.q_proj.bias"), q_dim));
      ASSIGN_OR_RETURN(auto kb, load_vector(src, layer_name(l, "self_attn.k_proj.bias"), kv_dim));
      ASSIGN_OR_RETURN(auto vb, load_vector(src, layer_name(l, "self_attn.v_proj.bias"), kv_dim));
      layer.qkv_bias = std::move(qb);
      layer.qkv_bias.insert(layer.qkv_bias.end(), kb.begin(), kb.end());
      layer.qkv_bias.insert(layer.qkv_bias.end(), vb.begin(), vb.end());
    }
    if (c.has_qk_norm) {
      ASSIGN_OR_RETURN(layer.q_norm,
                       load_vector(src, layer_name(l, "self_attn.q_norm.weight"), c.head_dim));
      ASSIGN_OR_RETURN(layer.k_norm,
                       load_vector(src, layer_name(l, "self_attn.k_norm.weight"), c.head_dim));
    }
    ASSIGN_OR_RETURN(TensorView o, require_tensor(src, layer_name(l, "self_attn.o_proj.weight"),
                                                  {hidden, q_dim}));
    ASSIGN_OR_RETURN(layer.o, pack_rows({o}, q_dim, format_, is_auto));
    ASSIGN_OR_RETURN(TensorView gate,
                     require_tensor(src, layer_name(l, "mlp.gate_proj.weight"), {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView up,
                     require_tensor(src, layer_name(l, "mlp.up_proj.weight"), {inter, hidden}));
    ASSIGN_OR_RETURN(layer.gate_up, pack_rows({gate, up}, hidden, format_, is_auto));
    ASSIGN_OR_RETURN(TensorView down,
                     require_tensor(src, layer_name(l, "mlp.down_proj.weight"), {hidden, inter}));
    ASSIGN_OR_RETURN(layer.down, pack_rows({down}, inter, format_, is_auto));
    for (const kernels::PackedWeight* w : layer.matrices()) {
      num_weight_bytes_ += w->num_bytes();
      num_weight_params_ += w->rows() * w->cols();
    }
  }
  ASSIGN_OR_RETURN(final_norm_, load_vector(src, "model.norm.weight", hidden));
  if (c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(lm_head_, pack_rows({embed_tokens_}, hidden, format_, is_auto));
  } else {
    ASSIGN_OR_RETURN(TensorView head,
                     require_tensor(src, "lm_head.weight", {c.vocab_size, hidden}));
    ASSIGN_OR_RETURN(lm_head_, pack_rows({head}, hidden, format_, is_auto));
  }
  num_weight_bytes_ += lm_head_.num_bytes();
  num_weight_params_ += lm_head_.rows() * lm_head_.cols();

  kernels::RopeScaling scaling;
  scaling.is_llama3 = c.rope_scaling.is_llama3;
  scaling.factor = c.rope_scaling.factor;
  scaling.low_freq_factor = c.rope_scaling.low_freq_factor;
  scaling.high_freq_factor = c.rope_scaling.high_freq_factor;
  scaling.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  rope_ = std::make_unique<kernels::RopeTable>(c.head_dim, c.rope_theta, c.max_position_embeddings,
                                               scaling);
  weights_fingerprint_ = compute_weights_fingerprint();
  CRESCENT_LOG(kInfo) << "loaded " << files_.name << ": " << c.num_hidden_layers
                      << " layers, hidden " << hidden << ", vocab " << c.vocab_size << ", weights "
                      << weight_format_name() << " (" << num_weight_bytes_ / (1 << 20) << " MiB)";
  return Status::ok();
}

namespace {

// FNV-1a over tensors: stable across hosts and builds.
class Fingerprint {
 public:
  void bytes(const void* data, size_t n) { h_.bytes(data, n); }
  void number(int64_t v) { bytes(&v, sizeof(v)); }
  void floats(const std::vector<float>& v) {
    number(static_cast<int64_t>(v.size()));
    bytes(v.data(), v.size() * sizeof(float));
  }
  // The first and last `window` bytes: enough to tell checkpoints apart without reading
  // gigabytes at start-up.
  void sample(const std::byte* data, int64_t n, int64_t window = 4096) {
    number(n);
    if (n <= 2 * window) {
      bytes(data, static_cast<size_t>(n));
      return;
    }
    bytes(data, static_cast<size_t>(window));
    bytes(data + n - window, static_cast<size_t>(window));
  }
  uint64_t value() const { return h_.value(); }

 private:
  Fnv1a64 h_;
};

void mix_matrix(Fingerprint& f, const kernels::PackedWeight& w) {
  f.number(w.rows());
  f.number(w.cols());
  f.number(static_cast<int64_t>(w.format()));
  if (kernels::ggml_row_dtype(w.format())) {
    // The file's bytes, not the stored layout, which depends on the CPU (kernels/x16.h): P/D
    // peers on different CPUs load the same weights.
    for (int64_t p : {int64_t{0}, w.num_panels() - 1}) {
      std::vector<std::byte> rows = kernels::panel_file_rows(w, p);
      // Zero-padded to the panel's stride, as stored row panels are: the hash earlier builds
      // gave these weights.
      rows.resize(w.panel_stride_bytes(), std::byte{0});
      f.sample(rows.data(), static_cast<int64_t>(rows.size()));
    }
    return;
  }
  const int64_t stride = w.panel_stride_bytes();
  f.sample(w.panel(0), stride);
  f.sample(w.panel(w.num_panels() - 1), stride);
}

}  // namespace

std::vector<const kernels::PackedWeight*> Transformer::Layer::matrices() const {
  std::vector<const kernels::PackedWeight*> all;
  for (const kernels::PackedWeight& w : qkv) {
    all.push_back(&w);
  }
  all.push_back(&o);
  all.push_back(&gate_up);
  all.push_back(&down);
  return all;
}

uint64_t Transformer::compute_weights_fingerprint() const {
  Fingerprint f;
  for (const Layer& layer : layers_) {
    for (const std::vector<float>* v : {&layer.input_norm, &layer.post_attention_norm,
                                        &layer.q_norm, &layer.k_norm, &layer.qkv_bias}) {
      f.floats(*v);
    }
    for (const kernels::PackedWeight* w : layer.matrices()) {
      mix_matrix(f, *w);
    }
  }
  f.floats(final_norm_);
  mix_matrix(f, lm_head_);
  f.number(static_cast<int64_t>(embed_tokens_.dtype));
  f.sample(static_cast<const std::byte*>(embed_tokens_.data), embed_tokens_.num_bytes);
  return f.value();
}

namespace {

// A matrix format as the model line prints it: F32, BF16, Q8_0, or the ggml type (Q4_K ...).
std::string format_label(kernels::WeightFormat format) {
  switch (format) {
    case kernels::WeightFormat::kF32:
      return "F32";
    case kernels::WeightFormat::kBF16:
      return "BF16";
    case kernels::WeightFormat::kQ8_0:
      return "Q8_0";
    default:
      return std::string(dtype_name(*kernels::ggml_row_dtype(format)));
  }
}

}  // namespace

std::vector<std::pair<int64_t, kernels::WeightFormat>> Transformer::matrix_format_shares() const {
  std::vector<std::pair<int64_t, kernels::WeightFormat>> shares;
  const auto add = [&](const kernels::PackedWeight& w) {
    for (auto& share : shares) {
      if (share.second == w.format()) {
        share.first += w.num_bytes();
        return;
      }
    }
    shares.emplace_back(w.num_bytes(), w.format());
  };
  for (const Layer& layer : layers_) {
    for (const kernels::PackedWeight* w : layer.matrices()) {
      add(*w);
    }
  }
  add(lm_head_);
  std::sort(shares.begin(), shares.end(), [](const auto& a, const auto& b) { return a > b; });
  return shares;
}

kernels::WeightFormat Transformer::matrix_format() const {
  const auto shares = matrix_format_shares();
  return shares.empty() ? format_ : shares.front().second;
}

std::string Transformer::weight_format_name() const {
  // A GGUF file may mix block types per tensor (llama-quantize's _M mixes, its fallbacks for
  // rows that are no multiple of 256): name them all, the largest share of bytes first.
  const auto shares = matrix_format_shares();
  if (shares.size() <= 1) {
    const kernels::WeightFormat format = shares.empty() ? format_ : shares.front().second;
    const std::string label = format_label(format);
    return kernels::ggml_row_dtype(format) ? "GGUF " + label : label;
  }
  std::string mix = "mixed";
  for (const auto& [bytes, format] : shares) {
    mix.append(" ").append(format_label(format)).append(" ");
    mix.append(std::to_string(bytes * 100 / std::max<int64_t>(1, num_weight_bytes_))).append("%");
  }
  return mix;
}

kernels::KvCacheLayout Transformer::kv_layout(int block_size, kernels::KvDtype dtype) const {
  const ModelConfig& c = files_.config;
  return kernels::KvCacheLayout{c.num_hidden_layers, block_size, c.num_key_value_heads, c.head_dim,
                                dtype};
}

void Transformer::embed(std::span<const int32_t> token_ids, float* out) const {
  const int64_t hidden = files_.config.hidden_size;
  const int64_t row_bytes = dtype_num_bytes(embed_tokens_.dtype, hidden);
  const auto* base = static_cast<const uint8_t*>(embed_tokens_.data);
  for (size_t i = 0; i < token_ids.size(); ++i) {
    dtype_to_float(embed_tokens_.dtype, base + token_ids[i] * row_bytes, hidden,
                   out + static_cast<int64_t>(i) * hidden);
  }
}

Status Transformer::forward(std::span<const ForwardSeq> batch, const kernels::KvCacheLayout& layout,
                            void* kv_base, std::vector<float>& logits) {
  const ModelConfig& c = files_.config;
  const int64_t hidden = c.hidden_size;
  const int num_heads = c.num_attention_heads;
  const int num_kv_heads = c.num_key_value_heads;
  const int64_t q_dim = int64_t{num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{num_kv_heads} * c.head_dim;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t inter = c.intermediate_size;

  // Validate the batch: a bad id or a short block table must never reach the kernels.
  int64_t num_rows = 0;
  int64_t num_logit_rows = 0;
  std::vector<kernels::AttentionSeq> attn_seqs;
  attn_seqs.reserve(batch.size());
  for (const ForwardSeq& s : batch) {
    if (s.token_ids.empty())
      return invalid_argument("forward: a sequence with no tokens");
    int64_t end = s.start_pos + static_cast<int64_t>(s.token_ids.size());
    if (end > c.max_position_embeddings) {
      return out_of_range("forward: position " + std::to_string(end - 1) +
                          " beyond max_position_embeddings " +
                          std::to_string(c.max_position_embeddings));
    }
    int64_t blocks_needed = (end + layout.block_size - 1) / layout.block_size;
    if (static_cast<int64_t>(s.block_table.size()) < blocks_needed) {
      return invalid_argument("forward: block table has " + std::to_string(s.block_table.size()) +
                              " blocks, positions need " + std::to_string(blocks_needed));
    }
    for (int32_t id : s.token_ids) {
      if (id < 0 || id >= c.vocab_size) {
        return invalid_argument("forward: token id " + std::to_string(id) +
                                " outside vocabulary of " + std::to_string(c.vocab_size));
      }
    }
    if (!s.positions3.empty() && s.positions3.size() != 3 * s.token_ids.size()) {
      return invalid_argument("forward: positions3 holds " + std::to_string(s.positions3.size()) +
                              " values for " + std::to_string(s.token_ids.size()) + " tokens");
    }
    int64_t previous_end = 0;
    for (const EmbeddingOverride& e : s.embeddings) {
      if (e.row < previous_end || e.num_rows < 0 || e.data == nullptr ||
          e.row + e.num_rows > static_cast<int64_t>(s.token_ids.size())) {
        return invalid_argument("forward: input embeddings outside the sequence's tokens");
      }
      previous_end = e.row + e.num_rows;
    }
    attn_seqs.push_back(
        {num_rows, static_cast<int64_t>(s.token_ids.size()), s.start_pos, s.block_table.data()});
    num_rows += static_cast<int64_t>(s.token_ids.size());
    num_logit_rows += s.needs_logits ? 1 : 0;
  }
  if (num_rows == 0)
    return Status::ok();

  float* x = grow(x_, num_rows * hidden);
  float* h = grow(h_, num_rows * hidden);
  // q_ holds q, then k, then v, each contiguous over rows (the layouts rope/write_kv want).
  float* q = grow(q_, num_rows * qkv_dim);
  float* k = q + num_rows * q_dim;
  float* v = k + num_rows * kv_dim;
  float* attn = grow(attn_, num_rows * q_dim);
  float* proj = grow(proj_, num_rows * hidden);
  float* gate_up = grow(gate_up_, num_rows * 2 * inter);
  float* act = grow(act_, num_rows * inter);
  int32_t* positions = grow(positions_, num_rows);
  const bool mrope = !c.mrope_section.empty();
  int32_t* positions3 = mrope ? grow(positions3_, num_rows * 3) : nullptr;

  int64_t row = 0;
  for (const ForwardSeq& s : batch) {
    embed(s.token_ids, x + row * hidden);
    for (const EmbeddingOverride& e : s.embeddings) {
      std::memcpy(x + (row + e.row) * hidden, e.data,
                  static_cast<size_t>(e.num_rows * hidden) * sizeof(float));
    }
    for (size_t i = 0; i < s.token_ids.size(); ++i) {
      const int64_t r = row + static_cast<int64_t>(i);
      positions[r] = static_cast<int32_t>(s.start_pos + static_cast<int64_t>(i));
      if (mrope) {
        for (int k = 0; k < 3; ++k) {
          positions3[r * 3 + k] = s.positions3.empty() ? positions[r] : s.positions3[i * 3 + k];
        }
      }
    }
    row += static_cast<int64_t>(s.token_ids.size());
  }

  const auto eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const Layer& layer = layers_[static_cast<size_t>(l)];
    for_row_ranges(pool_, num_rows, hidden, [&](int64_t r0, int64_t r1) {
      kernels::rms_norm(x + r0 * hidden, layer.input_norm.data(), r1 - r0, hidden, eps,
                        h + r0 * hidden);
    });
    const float* qkv_bias = layer.qkv_bias.empty() ? nullptr : layer.qkv_bias.data();
    if (layer.qkv.size() == 1) {
      float* qkv = grow(qkv_, num_rows * qkv_dim);  // only fused layers need it
      kernels::matmul(h, num_rows, layer.qkv[0], qkv_bias, qkv, pool_);
      for (int64_t r = 0; r < num_rows; ++r) {
        const float* src = qkv + r * qkv_dim;
        std::memcpy(q + r * q_dim, src, static_cast<size_t>(q_dim) * sizeof(float));
        std::memcpy(k + r * kv_dim, src + q_dim, static_cast<size_t>(kv_dim) * sizeof(float));
        std::memcpy(v + r * kv_dim, src + q_dim + kv_dim,
                    static_cast<size_t>(kv_dim) * sizeof(float));
      }
    } else {
      // Apart, each writes its own contiguous array directly.
      const int64_t bias_at[3] = {0, q_dim, q_dim + kv_dim};
      float* outs[3] = {q, k, v};
      for (size_t i = 0; i < 3; ++i) {
        kernels::matmul(h, num_rows, layer.qkv[i], qkv_bias ? qkv_bias + bias_at[i] : nullptr,
                        outs[i], pool_);
      }
    }
    for_row_ranges(pool_, num_rows, q_dim + kv_dim, [&](int64_t r0, int64_t r1) {
      float* qr = q + r0 * q_dim;
      float* kr = k + r0 * kv_dim;
      const int64_t n = r1 - r0;
      if (!layer.q_norm.empty()) {
        kernels::rms_norm(qr, layer.q_norm.data(), n * num_heads, c.head_dim, eps, qr);
        kernels::rms_norm(kr, layer.k_norm.data(), n * num_kv_heads, c.head_dim, eps, kr);
      }
      if (mrope) {
        kernels::rope_multi(qr, positions3 + 3 * r0, n, num_heads, *rope_, c.mrope_section);
        kernels::rope_multi(kr, positions3 + 3 * r0, n, num_kv_heads, *rope_, c.mrope_section);
      } else {
        kernels::rope(qr, positions + r0, n, num_heads, *rope_);
        kernels::rope(kr, positions + r0, n, num_kv_heads, *rope_);
      }
    });
    for (const auto& s : attn_seqs) {
      kernels::write_kv(k + s.q_row * kv_dim, v + s.q_row * kv_dim, s.num_tokens, s.start_pos,
                        s.block_table, l, layout, kv_base);
    }
    kernels::paged_attention(attn_seqs, q, num_heads, l, layout, kv_base, scale, attn, pool_);
    kernels::matmul(attn, num_rows, layer.o, nullptr, proj, pool_);
    for_row_ranges(pool_, num_rows, hidden, [&](int64_t r0, int64_t r1) {
      kernels::add_inplace(x + r0 * hidden, proj + r0 * hidden, (r1 - r0) * hidden);
      kernels::rms_norm(x + r0 * hidden, layer.post_attention_norm.data(), r1 - r0, hidden, eps,
                        h + r0 * hidden);
    });
    kernels::matmul(h, num_rows, layer.gate_up, nullptr, gate_up, pool_);
    for_row_ranges(pool_, num_rows, inter, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        kernels::silu_mul(gate_up + r * 2 * inter, gate_up + r * 2 * inter + inter, inter,
                          act + r * inter);
      }
    });
    kernels::matmul(act, num_rows, layer.down, nullptr, proj, pool_);
    for_row_ranges(pool_, num_rows, hidden, [&](int64_t r0, int64_t r1) {
      kernels::add_inplace(x + r0 * hidden, proj + r0 * hidden, (r1 - r0) * hidden);
    });
  }

  if (num_logit_rows == 0)
    return Status::ok();
  float* rows = grow(final_rows_, num_logit_rows * hidden);
  int64_t out_row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].needs_logits)
      continue;
    int64_t last = attn_seqs[i].q_row + attn_seqs[i].num_tokens - 1;
    std::memcpy(rows + out_row * hidden, x + last * hidden,
                static_cast<size_t>(hidden) * sizeof(float));
    ++out_row;
  }
  kernels::rms_norm(rows, final_norm_.data(), num_logit_rows, hidden, eps, rows);
  size_t offset = logits.size();
  logits.resize(offset + static_cast<size_t>(num_logit_rows * c.vocab_size));
  kernels::matmul(rows, num_logit_rows, lm_head_, nullptr, logits.data() + offset, pool_);
  return Status::ok();
}

}  // namespace crescent::model
