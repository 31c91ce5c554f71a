#include "model/make_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/thread_pool.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "model/safetensors.h"

namespace crescent::model {

namespace fs = std::filesystem;

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_key_value_heads} * c.head_dim;
  const int64_t ffn = c.intermediate_size;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {c.vocab_size, hidden}});
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    specs.push_back({p + "input_layernorm.weight", {hidden}});
    specs.push_back({p + "self_attn.q_proj.weight", {q_dim, hidden}});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_dim, hidden}});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_dim, hidden}});
    if (c.has_qkv_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q_dim}});
      specs.push_back({p + "self_attn.k_proj.bias", {kv_dim}});
      specs.push_back({p + "self_attn.v_proj.bias", {kv_dim}});
    }
    if (c.has_qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {hidden, q_dim}});
    specs.push_back({p + "post_attention_layernorm.weight", {hidden}});
    specs.push_back({p + "mlp.gate_proj.weight", {ffn, hidden}});
    specs.push_back({p + "mlp.up_proj.weight", {ffn, hidden}});
    specs.push_back({p + "mlp.down_proj.weight", {hidden, ffn}});
  }
  specs.push_back({"model.norm.weight", {hidden}});
  if (!c.tie_word_embeddings)
    specs.push_back({"lm_head.weight", {c.vocab_size, hidden}});
  return specs;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

void generate_weights(const ModelConfig& c, const TensorSpec& spec, uint64_t seed, int64_t begin,
                      int64_t count, float* out) {
  // Linear layers ~ N(0, 0.02); the projections that write into the residual stream are scaled
  // down by sqrt(2 * layers) (GPT-2's rule) so activations stay O(1) through the stack.
  float mean = 0.0f;
  float stddev = 0.02f;
  const std::string_view name = spec.name;
  if (ends_with(name, "norm.weight")) {
    mean = 1.0f;
    stddev = 0.02f;
  } else if (ends_with(name, ".bias")) {
    stddev = 0.01f;
  } else if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) {
    stddev = 0.02f / std::sqrt(2.0f * static_cast<float>(c.num_hidden_layers));
  }
  const uint64_t key = splitmix64(seed ^ fnv1a(name));
  // Counter-based: element i draws from splitmix64(key + i), four 16-bit uniforms summed
  // (Irwin-Hall, variance 4/12), rescaled to unit variance: normal-ish, bounded, fast.
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = splitmix64(key + static_cast<uint64_t>(begin + i));
    const float sum =
        static_cast<float>((r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48));
    out[i] = mean + stddev * ((sum - 2.0f * 65535.0f) * kScale);
  }
}

Result<DType> parse_dtype_flag(std::string_view text) {
  if (text == "bf16")
    return DType::kBF16;
  if (text == "f16")
    return DType::kF16;
  if (text == "f32")
    return DType::kF32;
  if (text == "q8_0")
    return DType::kQ8_0;
  return invalid_argument("unknown dtype '" + std::string(text) + "' (bf16, f16, f32, q8_0)");
}

namespace {

class Progress {
 public:
  Progress(bool enabled, std::string label, int64_t total_bytes)
      : enabled_(enabled), label_(std::move(label)), total_bytes_(total_bytes) {}
  void set_total(int64_t total_bytes) { total_bytes_ = total_bytes; }
  void update(int64_t done_bytes) {
    if (!enabled_)
      return;
    const int percent = total_bytes_ > 0 ? static_cast<int>(100 * done_bytes / total_bytes_) : 100;
    if (percent == last_percent_)
      return;
    last_percent_ = percent;
    std::fprintf(stderr, "\r%s: %3d%% (%lld / %lld MB)", label_.c_str(), percent,
                 static_cast<long long>(done_bytes >> 20),
                 static_cast<long long>(total_bytes_ >> 20));
    if (done_bytes >= total_bytes_)
      std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::string label_;
  int64_t total_bytes_;
  int last_percent_ = -1;
};

Status write_text(const fs::path& path, std::string_view text) {
  ASSIGN_OR_RETURN(auto out, FileWriter::create(path.string()));
  RETURN_IF_ERROR(out->write(text.data(), static_cast<int64_t>(text.size())));
  return out->close();
}

std::string torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kQ8_0:
      break;
  }
  return "";
}

Status write_weights(const fs::path& path, const ModelConfig& config, DType dtype, uint64_t seed,
                     bool show_progress) {
  const std::vector<TensorSpec> specs = model_tensor_specs(config);
  SafetensorsWriter writer(path.string());
  writer.set_metadata("format", "pt");
  int64_t total_bytes = 0;
  for (const auto& s : specs) {
    RETURN_IF_ERROR(writer.add_tensor(s.name, dtype, s.shape));
    int64_t n = 1;
    for (int64_t d : s.shape)
      n *= d;
    total_bytes += dtype_num_bytes(dtype, n);
  }
  RETURN_IF_ERROR(writer.write_header());
  Progress progress(show_progress, path.filename().string(), total_bytes);
  constexpr int64_t kChunk = 1 << 20;
  constexpr int64_t kMinParallelValues = 1 << 18;  // below this, threads cost more than they save
  std::vector<float> values(kChunk);
  std::vector<uint16_t> halves(kChunk);
  int64_t done_bytes = 0;
  for (const auto& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape)
      n *= d;
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t count = std::min(kChunk, n - begin);
      // Counter-based values: any split of the chunk over threads gives the same bytes.
      auto fill = [&](int64_t lo, int64_t hi) {
        generate_weights(config, s, seed, begin + lo, hi - lo, values.data() + lo);
        if (dtype == DType::kF32)
          return;
        for (int64_t i = lo; i < hi; ++i) {
          halves[i] = dtype == DType::kBF16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
        }
      };
      if (count >= kMinParallelValues) {
        ThreadPool::default_pool().parallel_range(count, fill);
      } else {
        fill(0, count);
      }
      if (dtype == DType::kF32) {
        RETURN_IF_ERROR(writer.write_data(values.data(), count * 4));
      } else {
        RETURN_IF_ERROR(writer.write_data(halves.data(), count * 2));
      }
      done_bytes += dtype_num_bytes(dtype, count);
      progress.update(done_bytes);
    }
  }
  return writer.finish();
}

}  // namespace

Status make_model(const MakeModelOptions& options) {
  ASSIGN_OR_RETURN(ModelPreset preset, find_model_preset(options.preset));
  if (options.dtype == DType::kQ8_0) {
    return invalid_argument("--dtype q8_0 is for GGUF only; safetensors takes bf16, f16 or f32");
  }
  if (options.out_dir.empty())
    return invalid_argument("an output directory is required");
  ModelConfig config = preset.config;
  config.torch_dtype = torch_dtype_name(options.dtype);

  const fs::path tokenizer_dir = fs::path(
      options.tokenizer_dir.empty() ? default_tokenizer_dir(preset) : options.tokenizer_dir);
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   read_file_to_string((tokenizer_dir / "tokenizer.json").string()));
  ASSIGN_OR_RETURN(std::string tokenizer_config,
                   read_file_to_string((tokenizer_dir / "tokenizer_config.json").string()));

  const fs::path out(options.out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec)
    return invalid_argument(out.string() + ": cannot create directory: " + ec.message());

  RETURN_IF_ERROR(write_text(out / "config.json", to_config_json(config)));
  RETURN_IF_ERROR(write_text(out / "generation_config.json", to_generation_config_json(config)));
  RETURN_IF_ERROR(write_text(out / "tokenizer.json", tokenizer_json));
  RETURN_IF_ERROR(write_text(out / "tokenizer_config.json", tokenizer_config));
  RETURN_IF_ERROR(write_weights(out / "model.safetensors", config, options.dtype, options.seed,
                                options.show_progress));

  // The GGUF is converted from the safetensors just written (memory-mapped, streamed), so both
  // files hold the same values.
  ASSIGN_OR_RETURN(auto source, SafetensorsFile::open((out / "model.safetensors").string()));
  Progress progress(options.show_progress, "model.gguf", 0);
  auto report = [&](int64_t done, int64_t total) {
    progress.set_total(total);
    progress.update(done);
  };
  const DType gguf_dtype = options.gguf_dtype.value_or(options.dtype);
  return write_gguf((out / "model.gguf").string(), config, *source, gguf_dtype, tokenizer_json,
                    preset.name, report);
}

}  // namespace crescent::model
