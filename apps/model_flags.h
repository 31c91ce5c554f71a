#pragma once
// The flags every command that runs a model shares (--model, --threads, KV cache size, ...),
// and the load that turns them into an engine::LoadedEngine.

#include <functional>
#include <memory>
#include <string>

#include "apps/flags.h"
#include "engine/loader.h"

namespace crescent::apps {

struct ModelFlags {
  std::string model;
  int threads = 0;  // 0: all cores
  std::string weights = "auto";
  int64_t kv_cache_mb = 1024;
  std::string kv_cache_dtype = "auto";  // kernels::parse_kv_dtype
  int block_size = 16;
  int max_model_len = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  bool enable_prefix_caching = true;
  std::string mmproj;                  // vision projector GGUF of a VL model
  int64_t encoder_cache_size = 16384;  // embedding rows
  // Replaces the model's chat template: a file's path if one exists there, else the template.
  std::string chat_template;

  void add_to(FlagParser& flags);
  // Sizes the default thread pool and loads the model.
  Result<std::unique_ptr<engine::LoadedEngine>> load() const;
  // Loads the model onto `pool` (one per data-parallel rank) with the KV cache from
  // allocate_kv_memory (empty: private memory). Does not touch the default pool's size.
  // `parts`: all, or only the vision tower (--role encode), or all but it (--role decode).
  Result<std::unique_ptr<engine::LoadedEngine>> load(
      ThreadPool& pool, std::function<Result<engine::KvCacheMemory>(int64_t)> allocate_kv_memory,
      engine::ModelParts parts = engine::ModelParts::kAll) const;
  // The compute threads --threads asks for (all cores when 0).
  int num_threads() const;
};

}  // namespace crescent::apps
