#include "apps/model_flags.h"

#include <filesystem>
#include <thread>

#include "core/file.h"
#include "model/chat_template.h"
#include "model/tensor_source.h"

namespace crescent::apps {

void ModelFlags::add_to(FlagParser& flags) {
  flags.add("model", &model, "model: an HF directory (config.json + safetensors) or a .gguf file");
  flags.add("threads", &threads, "compute threads; 0 uses every core");
  flags.add("weights", &weights,
            "matrix format in memory: auto (Q8_0 files stay Q8_0, else BF16), f32, bf16, q8_0");
  flags.add("kv-cache-mb", &kv_cache_mb, "memory for the paged KV cache, in MiB");
  flags.add("kv-cache-dtype", &kv_cache_dtype,
            "element type of the KV cache: auto (bf16 on CPUs with AVX2 or better, else "
            "float32), float32, bf16 or f16 (half the memory, so twice the blocks per "
            "--kv-cache-mb, and half the bytes a disaggregated request moves), fp8_e4m3 (OCP "
            "E4M3FN, scale 1.0, values beyond +-448 saturate; a quarter) or q8_0 (ggml's blocks "
            "of 32 int8 + an fp16 scale along head_dim, which must be a multiple of 32; 34/128 "
            "of float32). Prefill and decode must agree");
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
  flags.add("chat-template", &chat_template,
            "the chat template to use instead of the model's (Jinja): a file's path if that file "
            "exists, else the template text itself; a template that does not parse stops the "
            "start. Requests may still send their own 'chat_template'");
  flags.require("model");
}

namespace {

// --chat-template as vLLM reads it: a path if the file exists, else the template itself. The
// model's special tokens (bos_token, ...) stay.
Status replace_chat_template(const std::string& flag, const std::string& model_path,
                             engine::LoadedEngine* loaded) {
  std::string text = flag;
  std::error_code ec;
  if (std::filesystem::is_regular_file(flag, ec)) {
    ASSIGN_OR_RETURN(text, read_file(flag));
  }
  model::TokenizerConfig config;
  if (loaded->chat_template) {
    config = loaded->chat_template->config();
  } else if (const auto file = std::filesystem::path(model_path) / "tokenizer_config.json";
             std::filesystem::is_regular_file(file, ec)) {
    auto from_file = model::TokenizerConfig::from_file(file.string());
    if (from_file.is_ok()) {
      config = std::move(from_file).value();
    }
  }
  auto tmpl = model::ChatTemplate::from_template(std::move(text), std::move(config));
  if (!tmpl.is_ok()) {
    return invalid_argument("--chat-template: " + tmpl.status().message());
  }
  loaded->chat_template = std::move(tmpl).value();
  return Status::ok();
}

}  // namespace

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
  ASSIGN_OR_RETURN(options.kv_cache.dtype, kernels::parse_kv_dtype(kv_cache_dtype));
  options.max_model_len = max_model_len;
  options.max_num_seqs = max_num_seqs;
  options.max_num_batched_tokens = max_num_batched_tokens;
  options.enable_prefix_caching = enable_prefix_caching;
  options.mmproj_path = mmproj;
  if (encoder_cache_size < 1) {
    return invalid_argument("--encoder-cache-size must be positive");
  }
  options.encoder_cache_tokens = encoder_cache_size;
  ASSIGN_OR_RETURN(auto loaded, engine::load_engine(options, pool));
  if (!chat_template.empty() && loaded->tokenizer != nullptr) {
    RETURN_IF_ERROR(replace_chat_template(chat_template, model, loaded.get()));
  }
  return loaded;
}

}  // namespace crescent::apps
