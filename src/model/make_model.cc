#include "model/make_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/fnv.h"
#include "core/thread_pool.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/gguf_mmproj.h"
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
  if (c.vision) {
    std::vector<TensorSpec> visual = vision_tensor_specs(*c.vision);
    specs.insert(specs.end(), std::make_move_iterator(visual.begin()),
                 std::make_move_iterator(visual.end()));
  }
  return specs;
}

std::vector<TensorSpec> vision_tensor_specs(const VisionConfig& v) {
  const int64_t embed = v.embed_dim;
  const int64_t ffn = v.intermediate_size;
  const int64_t merged = int64_t{v.merge_unit()} * embed;
  const bool is_qwen2 = v.architecture == VisionArchitecture::kQwen2Vl;
  std::vector<TensorSpec> specs;
  specs.push_back({"visual.patch_embed.proj.weight",
                   {embed, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size}});
  // Qwen2-VL's norms are LayerNorms (weight and bias), Qwen2.5-VL's RMSNorms (weight only).
  auto norm = [&](const std::string& prefix) {
    specs.push_back({prefix + ".weight", {embed}});
    if (is_qwen2)
      specs.push_back({prefix + ".bias", {embed}});
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    specs.push_back({prefix + ".weight", {out, in}});
    specs.push_back({prefix + ".bias", {out}});
  };
  for (int block = 0; block < v.depth; ++block) {
    const std::string p = "visual.blocks." + std::to_string(block) + ".";
    norm(p + "norm1");
    norm(p + "norm2");
    linear(p + "attn.qkv", 3 * embed, embed);
    linear(p + "attn.proj", embed, embed);
    if (is_qwen2) {
      linear(p + "mlp.fc1", ffn, embed);
      linear(p + "mlp.fc2", embed, ffn);
    } else {
      linear(p + "mlp.gate_proj", ffn, embed);
      linear(p + "mlp.up_proj", ffn, embed);
      linear(p + "mlp.down_proj", embed, ffn);
    }
  }
  norm("visual.merger.ln_q");
  linear("visual.merger.mlp.0", merged, merged);
  linear("visual.merger.mlp.2", v.out_hidden_size, merged);
  return specs;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

void generate_weights(const ModelConfig& c, const TensorSpec& spec, uint64_t seed, int64_t begin,
                      int64_t count, float* out) {
  // Linear layers ~ N(0, 0.02); the projections that write into the residual stream are scaled
  // down by sqrt(2 * layers) (GPT-2's rule) so activations stay O(1) through the stack. The
  // vision tower follows the same rules with its own depth (its patch embedding sees ~1176
  // normalised pixels, so N(0, 0.02) gives O(1) embeddings).
  float mean = 0.0f;
  float stddev = 0.02f;
  const std::string_view name = spec.name;
  const bool is_visual = name.substr(0, 7) == "visual.";
  const int num_layers = is_visual && c.vision ? c.vision->depth : c.num_hidden_layers;
  if (ends_with(name, "norm.weight") || ends_with(name, "norm1.weight") ||
      ends_with(name, "norm2.weight") || ends_with(name, "ln_q.weight")) {
    mean = 1.0f;
    stddev = 0.02f;
  } else if (ends_with(name, ".bias")) {
    stddev = 0.01f;
  } else if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight") ||
             (is_visual &&
              (ends_with(name, "attn.proj.weight") || ends_with(name, "fc2.weight")))) {
    stddev = 0.02f / std::sqrt(2.0f * static_cast<float>(std::max(num_layers, 1)));
  }
  const uint64_t key = splitmix64(seed ^ fnv1a64(name));
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

namespace {

// A float as JSON writes it: OpenAI CLIP's normalisation constants as the checkpoints spell them
// (0.48145466, though 0.48145467 is the shorter decimal of the same float), anything else as
// the shortest decimal that reads back as the same float (not 0.4814546597003937).
double short_decimal(float f) {
  for (double clip : {0.48145466, 0.4578275, 0.40821073, 0.26862954, 0.26130258, 0.27577711}) {
    if (static_cast<float>(clip) == f)
      return clip;
  }
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f)
      return std::strtod(buf, nullptr);
  }
  return f;
}

}  // namespace

std::string qwen2_vl_preprocessor_config_json(const VisionConfig& v, int64_t min_pixels,
                                              int64_t max_pixels) {
  nlohmann::json mean = nlohmann::json::array();
  nlohmann::json std_dev = nlohmann::json::array();
  for (int i = 0; i < 3; ++i) {
    mean.push_back(short_decimal(v.image_mean[i]));
    std_dev.push_back(short_decimal(v.image_std[i]));
  }
  nlohmann::json j;
  j["image_processor_type"] = "Qwen2VLImageProcessor";
  j["processor_class"] =
      v.architecture == VisionArchitecture::kQwen2Vl ? "Qwen2VLProcessor" : "Qwen2_5_VLProcessor";
  j["do_convert_rgb"] = true;
  j["do_resize"] = true;
  j["do_rescale"] = true;
  j["do_normalize"] = true;
  j["resample"] = 3;  // PIL bicubic
  j["rescale_factor"] = 1.0 / 255.0;
  j["image_mean"] = mean;
  j["image_std"] = std_dev;
  j["min_pixels"] = min_pixels;
  j["max_pixels"] = max_pixels;
  j["size"] = {{"shortest_edge", min_pixels}, {"longest_edge", max_pixels}};
  j["patch_size"] = v.patch_size;
  j["temporal_patch_size"] = v.temporal_patch_size;
  j["merge_size"] = v.spatial_merge_size;
  return j.dump(2) + "\n";
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
  // For writers that report (bytes done, bytes total).
  std::function<void(int64_t, int64_t)> callback() {
    return [this](int64_t done, int64_t total) {
      set_total(total);
      update(done);
    };
  }
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
    default:  // block-quantised types are GGUF only
      break;
  }
  return "";
}

Result<std::string> with_chat_template(std::string_view tokenizer_config,
                                       const std::string& chat_template) {
  try {
    nlohmann::json j = nlohmann::json::parse(tokenizer_config);
    j["chat_template"] = chat_template;
    return j.dump(2) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("tokenizer_config.json: ") + e.what());
  }
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
  if (is_block_quantized(options.dtype)) {
    return invalid_argument("--dtype " + std::string(dtype_name(options.dtype)) +
                            " is for GGUF only; safetensors takes bf16, f16 or f32");
  }
  if (options.out_dir.empty())
    return invalid_argument("an output directory is required");
  ModelConfig config = preset.config;
  config.torch_dtype = torch_dtype_name(options.dtype);

  const fs::path tokenizer_dir = fs::path(
      options.tokenizer_dir.empty() ? default_tokenizer_dir(preset) : options.tokenizer_dir);
  ASSIGN_OR_RETURN(std::string tokenizer_json,
                   read_file((tokenizer_dir / "tokenizer.json").string()));
  ASSIGN_OR_RETURN(std::string tokenizer_config,
                   read_file((tokenizer_dir / "tokenizer_config.json").string()));
  if (!preset.chat_template.empty()) {
    ASSIGN_OR_RETURN(tokenizer_config, with_chat_template(tokenizer_config, preset.chat_template));
  }

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

  if (config.vision) {
    RETURN_IF_ERROR(write_text(
        out / "preprocessor_config.json",
        qwen2_vl_preprocessor_config_json(*config.vision, preset.min_pixels, preset.max_pixels)));
  }

  // The GGUF files are converted from the safetensors just written (memory-mapped, streamed), so
  // they hold the same values: model.gguf the LLM, mmproj.gguf the vision tower (llama.cpp's
  // pair; llama-mtmd-cli -m model.gguf --mmproj mmproj.gguf).
  ASSIGN_OR_RETURN(auto source, SafetensorsFile::open((out / "model.safetensors").string()));
  const GgufWeightType gguf_type = options.gguf_dtype.value_or(GgufWeightType(options.dtype));
  Progress gguf_progress(options.show_progress, "model.gguf", 0);
  ASSIGN_OR_RETURN(TokenizerConfig tokenizer_fields, TokenizerConfig::from_json(tokenizer_config));
  RETURN_IF_ERROR(write_gguf((out / "model.gguf").string(), config, *source, gguf_type,
                             tokenizer_json, preset.name, tokenizer_fields.chat_template,
                             gguf_progress.callback()));
  if (!config.vision)
    return Status::ok();
  // The tower's narrow rows rarely hold whole K-quant blocks; like llama.cpp's mmproj files it is
  // written in Q8_0 when the LLM is quantised more coarsely.
  const DType gguf_dtype = is_block_quantized(gguf_type.dtype) ? DType::kQ8_0 : gguf_type.dtype;
  Progress mmproj_progress(options.show_progress, "mmproj.gguf", 0);
  return write_mmproj_gguf((out / "mmproj.gguf").string(), *config.vision, *source, gguf_dtype,
                           preset.name, mmproj_progress.callback());
}

}  // namespace crescent::model
