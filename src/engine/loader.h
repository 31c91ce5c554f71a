#pragma once
// Loads everything one engine needs from a model path (an HF directory or a GGUF file):
// the transformer, tokenizer, chat template, the KV cache runner, and EngineOptions filled
// with the model's limits and end-of-sequence ids. Used by `crescent generate`, `crescent
// serve` and the benchmarks, so they all load a model the same way.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/transformer_runner.h"
#include "engine/vision_encoder_runner.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "model/vision_transformer.h"

namespace crescent::engine {

// Which parts of a model one process loads. `crescent serve --role encode` needs only the
// vision tower (no language-model weights, tokenizer or KV cache); --role decode of a
// vision-language model everything but the tower (the prefill engine computes the images' KV).
enum class ModelParts { kAll, kVisionTowerOnly, kWithoutVisionTower };

struct LoadOptions {
  std::string model_path;
  ModelParts parts = ModelParts::kAll;
  // Vision-language GGUF models: llama.cpp's vision projector file (empty: an mmproj*.gguf
  // beside the model, if any). HF checkouts carry the tower in their own safetensors.
  std::string mmproj_path;
  // Vision-language models: encoder cache budget (embedding rows) and encoder rows per step
  // (0: max_num_batched_tokens); see EngineOptions.
  int64_t encoder_cache_tokens = 16384;
  int max_num_encoder_tokens_per_step = 0;
  model::TransformerOptions transformer;
  KvCacheOptions kv_cache;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  bool enable_prefix_caching = true;
  // Where the runner's KV cache lives. Empty: private anonymous memory. Set by `crescent serve
  // --role prefill|decode` to put the cache in memory the transfer engine can register/share.
  // Called once with the exact byte count the cache needs (block count x block bytes, or
  // kv_cache.kv_cache_bytes when kv_cache.num_blocks is 0); the result must be at least that
  // large and lives until the runner is destroyed (its release runs then).
  std::function<Result<KvCacheMemory>(int64_t num_bytes)> allocate_kv_memory;
};

// Owns the pieces; the runner refers to the model and the engine to the runner, so keep the
// LoadedEngine alive (and unmoved from) while the Engine built from options runs.
struct LoadedEngine {
  model::ModelConfig config;  // always set, whatever parts were loaded
  // Null for ModelParts::kVisionTowerOnly, with tokenizer and runner.
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::optional<model::ChatTemplate> chat_template;  // absent: the model ships none
  std::unique_ptr<TransformerRunner> runner;
  // Vision-language models only (null otherwise): the tower and the engine's runner over it.
  std::unique_ptr<model::VisionTransformer> vision;
  std::unique_ptr<VisionEncoderRunner> encoder_runner;
  // The image processor settings (preprocessor_config.json's text; empty: the defaults).
  std::string preprocessor_config_json;
  EngineOptions engine_options;

  // The vision tower is loaded (it can encode images).
  bool is_multimodal() const { return vision != nullptr; }
  // The model takes images, whether or not this process loaded its tower.
  bool takes_images() const { return config.vision.has_value(); }
};

Result<std::unique_ptr<LoadedEngine>> load_engine(const LoadOptions& options, ThreadPool& pool);

}  // namespace crescent::engine
