#include "engine/loader.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/logging.h"
#include "engine/tokenizer_detokenizer.h"
#include "model/model_files.h"
#include "model/tensor_source.h"

namespace crescent::engine {
namespace {

// generation_config.json may list more end-of-sequence ids than config.json (Qwen2.5 does).
void merge_generation_config_eos(const std::string& model_dir, std::vector<int32_t>& eos) {
  auto text = read_file(model_dir + "/generation_config.json");
  if (!text.is_ok())
    return;  // optional file
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id"))
    return;
  auto add = [&](const nlohmann::json& v) {
    if (v.is_number_integer()) {
      auto id = v.get<int32_t>();
      if (std::find(eos.begin(), eos.end(), id) == eos.end())
        eos.push_back(id);
    }
  };
  const auto& e = j["eos_token_id"];
  if (e.is_array()) {
    for (const auto& v : e) {
      add(v);
    }
  } else {
    add(e);
  }
}

// The bytes TransformerRunner::create will want for these options: whole blocks only.
Result<int64_t> kv_cache_num_bytes(const model::Transformer& model, const KvCacheOptions& kv) {
  if (kv.block_size <= 0 || kv.block_size > 1024) {
    return invalid_argument("block size must be in [1, 1024], got " +
                            std::to_string(kv.block_size));
  }
  const kernels::KvCacheLayout layout = model.kv_layout(kv.block_size, kv.dtype);
  RETURN_IF_ERROR(kernels::check_kv_dtype(kv.dtype, layout.head_dim));
  const int64_t block_bytes = layout.block_num_bytes();
  const int64_t num_blocks = kv.num_blocks > 0 ? kv.num_blocks : kv.kv_cache_bytes / block_bytes;
  if (num_blocks < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(kv.kv_cache_bytes) +
                            " bytes holds no block of " + std::to_string(block_bytes) + " bytes");
  }
  return std::min<int64_t>(num_blocks, INT32_MAX / 2) * block_bytes;
}

// The tower's matrices follow the language model's weight choice; Q8_0 (a GGUF-only format for
// the LLM here) keeps the tower in BF16.
kernels::WeightFormat vision_weight_format(model::TransformerOptions::Weights w) {
  return w == model::TransformerOptions::Weights::kF32 ? kernels::WeightFormat::kF32
                                                       : kernels::WeightFormat::kBF16;
}

}  // namespace

Result<std::unique_ptr<LoadedEngine>> load_engine(const LoadOptions& options, ThreadPool& pool) {
  auto loaded = std::make_unique<LoadedEngine>();
  ASSIGN_OR_RETURN(model::ModelFiles files,
                   model::open_model(options.model_path, options.mmproj_path));
  const std::string tokenizer_config_path = files.tokenizer_config_path;
  loaded->config = files.config;
  if (options.parts == ModelParts::kVisionTowerOnly && !files.config.vision) {
    return invalid_argument(options.model_path +
                            " has no vision tower to serve (an encoder needs a vision-language "
                            "model)");
  }
  if (files.config.vision && options.parts != ModelParts::kWithoutVisionTower) {
    // The tower first: the Transformer takes the files over.
    const model::TensorSource& vision_tensors =
        files.vision_tensors ? *files.vision_tensors : *files.tensors;
    model::VisionTransformerOptions vision_options;
    vision_options.weights = vision_weight_format(options.transformer.weights);
    ASSIGN_OR_RETURN(
        loaded->vision,
        model::VisionTransformer::load(*files.config.vision, vision_tensors, vision_options, pool));
    loaded->encoder_runner = std::make_unique<VisionEncoderRunner>(*loaded->vision);
  } else if (files.config.is_multimodal() && !files.config.vision) {
    return invalid_argument(options.model_path +
                            " is a vision-language model without its vision tower: give the "
                            "projector file with --mmproj");
  }
  // Every process that takes images preprocesses them, the tower loaded or not.
  if (files.config.vision && !files.preprocessor_config_path.empty()) {
    ASSIGN_OR_RETURN(loaded->preprocessor_config_json, read_file(files.preprocessor_config_path));
  }
  if (options.parts == ModelParts::kVisionTowerOnly) {
    return loaded;  // the language model's mapped files close here
  }
  model::TokenizerConfig gguf_tokenizer_config;
  ASSIGN_OR_RETURN(loaded->tokenizer, model::open_tokenizer(files, &gguf_tokenizer_config));
  if (!files.tokenizer_gguf_path.empty()) {
    CRESCENT_LOG(kInfo) << "tokenizer and chat template from " << files.tokenizer_gguf_path
                        << "'s metadata (no tokenizer.json beside it)";
  }
  if (!tokenizer_config_path.empty() || !gguf_tokenizer_config.chat_template.empty()) {
    Result<model::ChatTemplate> tmpl =
        !tokenizer_config_path.empty()
            ? model::ChatTemplate::from_tokenizer_config_file(tokenizer_config_path)
            : model::ChatTemplate::from_config(std::move(gguf_tokenizer_config));
    if (tmpl.is_ok()) {
      loaded->chat_template = std::move(*tmpl);
    } else {
      CRESCENT_LOG(kWarn) << "no usable chat template: " << tmpl.status().message();
    }
  }
  ASSIGN_OR_RETURN(loaded->model,
                   model::Transformer::load(std::move(files), options.transformer, pool));
  const model::ModelConfig& config = loaded->model->config();
  if (loaded->tokenizer->vocab_size() > config.vocab_size) {
    return invalid_argument("tokenizer has " + std::to_string(loaded->tokenizer->vocab_size()) +
                            " tokens but the model's vocab_size is " +
                            std::to_string(config.vocab_size));
  }
  std::optional<KvCacheMemory> kv_memory;
  if (options.allocate_kv_memory) {
    ASSIGN_OR_RETURN(int64_t kv_bytes, kv_cache_num_bytes(*loaded->model, options.kv_cache));
    ASSIGN_OR_RETURN(kv_memory, options.allocate_kv_memory(kv_bytes));
  }
  ASSIGN_OR_RETURN(loaded->runner, TransformerRunner::create(*loaded->model, options.kv_cache,
                                                             std::move(kv_memory)));

  EngineOptions& e = loaded->engine_options;
  e.block_size = options.kv_cache.block_size;
  e.max_num_seqs = options.max_num_seqs;
  e.max_num_batched_tokens = options.max_num_batched_tokens;
  e.enable_prefix_caching = options.enable_prefix_caching;
  e.max_model_len =
      options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
  if (e.max_model_len > config.max_position_embeddings) {
    return invalid_argument("--max-model-len " + std::to_string(e.max_model_len) +
                            " exceeds the model's max_position_embeddings " +
                            std::to_string(config.max_position_embeddings));
  }
  const int64_t kv_tokens = int64_t{loaded->runner->num_kv_blocks()} * e.block_size;
  CRESCENT_LOG(kInfo) << "KV cache: " << loaded->runner->num_kv_blocks() << " blocks of "
                      << e.block_size << " tokens, "
                      << kernels::kv_dtype_name(loaded->runner->kv_layout().dtype) << " ("
                      << loaded->runner->kv_layout().block_num_bytes() / 1024 << " KiB a block)";
  if (kv_tokens < e.max_model_len) {
    CRESCENT_LOG(kInfo) << "max model length lowered from " << e.max_model_len << " to "
                        << kv_tokens << " tokens: the KV cache holds no more";
    e.max_model_len = static_cast<int>(kv_tokens);
  }
  for (int id : config.eos_token_ids) {
    e.eos_token_ids.push_back(id);
  }
  merge_generation_config_eos(loaded->model->files().directory, e.eos_token_ids);
  if (loaded->encoder_runner) {
    e.encoder_runner = loaded->encoder_runner.get();
    e.encoder_cache_tokens = options.encoder_cache_tokens;
    e.max_num_encoder_tokens_per_step = options.max_num_encoder_tokens_per_step;
  }
  const model::Tokenizer* tokenizer = loaded->tokenizer.get();
  e.make_detokenizer = [tokenizer](bool skip_special_tokens) -> std::unique_ptr<Detokenizer> {
    return std::make_unique<TokenizerDetokenizer>(*tokenizer, skip_special_tokens);
  };
  // Guided decoding matches these bytes; ids past the tokenizer's (padding rows of the
  // embedding) stay empty, so they are never allowed.
  e.token_bytes.assign(loaded->runner->vocab_size(), std::string());
  for (int32_t id = 0; id < tokenizer->vocab_size() && id < loaded->runner->vocab_size(); ++id) {
    e.token_bytes[id] = tokenizer->token_bytes(id);
  }
  return loaded;
}

}  // namespace crescent::engine
