#include "apps/model_flags.h"

#include <thread>

namespace crescent::apps {

void ModelFlags::add_to(FlagParser& flags) {
  flags.add("model", &model, "model: an HF directory (config.json + safetensors) or a .gguf file");
  flags.add("threads", &threads, "compute threads; 0 uses every core");
  flags.add("weights", &weights,
            "matrix format in memory: auto (Q8_0 files stay Q8_0, else BF16), f32, bf16, q8_0");
  flags.add("kv-cache-mb", &kv_cache_mb, "memory for the paged KV cache, in MiB");
  flags.add("block-size", &block_size, "tokens per KV cache block");
  flags.add("max-model-len", &max_model_len,
            "longest prompt + output in tokens; 0: the model's limit");
  flags.add("max-num-seqs", &max_num_seqs, "most sequences decoded at once");
  flags.add("max-num-batched-tokens", &max_num_batched_tokens,
            "token budget of one engine step (prefill chunks + decodes)");
  flags.add("enable-prefix-caching", &enable_prefix_caching,
            "reuse KV blocks of shared prompt prefixes (--no-enable-prefix-caching to turn off)");
  flags.add("mmproj", &mmproj,
            "vision-language GGUF models: llama.cpp's vision projector file (default: an "
            "mmproj*.gguf beside the model)");
  flags.add("encoder-cache-size", &encoder_cache_size,
            "vision-language models: image embeddings kept for reuse, in embedding rows "
            "(one per image placeholder token); a larger image is refused");
  flags.require("model");
}

int ModelFlags::num_threads() const {
  return threads > 0 ? threads
                     : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Result<std::unique_ptr<engine::LoadedEngine>> ModelFlags::load() const {
  ThreadPool::set_default_threads(num_threads());
  return load(ThreadPool::default_pool(), {});
}

Result<std::unique_ptr<engine::LoadedEngine>> ModelFlags::load(
    ThreadPool& pool, std::function<Result<engine::KvCacheMemory>(int64_t)> allocate_kv_memory,
    engine::ModelParts parts) const {
  engine::LoadOptions options;
  options.parts = parts;
  options.allocate_kv_memory = std::move(allocate_kv_memory);
  options.model_path = model;
  if (weights == "auto") {
    options.transformer.weights = model::TransformerOptions::Weights::kAuto;
  } else if (weights == "f32") {
    options.transformer.weights = model::TransformerOptions::Weights::kF32;
  } else if (weights == "bf16") {
    options.transformer.weights = model::TransformerOptions::Weights::kBF16;
  } else if (weights == "q8_0") {
    options.transformer.weights = model::TransformerOptions::Weights::kQ8_0;
  } else {
    return invalid_argument("--weights must be auto, f32, bf16 or q8_0, got '" + weights + "'");
  }
  if (kv_cache_mb <= 0)
    return invalid_argument("--kv-cache-mb must be positive");
  options.kv_cache.block_size = block_size;
  options.kv_cache.kv_cache_bytes = kv_cache_mb << 20;
  options.max_model_len = max_model_len;
  options.max_num_seqs = max_num_seqs;
  options.max_num_batched_tokens = max_num_batched_tokens;
  options.enable_prefix_caching = enable_prefix_caching;
  options.mmproj_path = mmproj;
  if (encoder_cache_size < 1) {
    return invalid_argument("--encoder-cache-size must be positive");
  }
  options.encoder_cache_tokens = encoder_cache_size;
  return engine::load_engine(options, pool);
}

}  // namespace crescent::apps
