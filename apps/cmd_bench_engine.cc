// `crescent bench engine`: prefill and decode throughput of one engine on this machine, with
// ratios to baselines measured in the same run (memcpy bandwidth for decode, a register-only
// multiply-add microkernel for prefill), because shared machines are noisy. Vision-language
// models add the vision tower's image encoding, against the same peak.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "apps/model_flags.h"
#include "core/clock.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "media/image.h"
#include "media/image_processor.h"

namespace crescent::apps {
namespace {

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab) {
  // Avoid the special tokens at the top of real vocabularies.
  std::uniform_int_distribution<int32_t> dist(0, std::max(1, vocab - 1024) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (auto& id : ids) {
    id = dist(rng);
  }
  return ids;
}

struct DecodeFigures {
  double tokens_per_s = 0;
  double step_ms = 0;
};

// Admits batch requests, runs their prefill, then times num_steps decode steps.
Result<DecodeFigures> measure_decode(engine::Engine& eng, std::mt19937& rng, int vocab, int batch,
                                     int prompt_len, int num_steps, int* id_counter) {
  for (int i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    r.request_id = "decode-" + std::to_string((*id_counter)++);
    r.prompt_token_ids = random_prompt(rng, prompt_len, vocab);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = num_steps + 2;
    r.sampling.ignore_eos = true;
    RETURN_IF_ERROR(eng.add_request(std::move(r)));
  }
  // Until every request has its first token, the steps are prefill.
  int num_with_first_token = 0;
  while (num_with_first_token < batch) {
    ASSIGN_OR_RETURN(auto outs, eng.step());
    for (const auto& o : outs) {
      if (o.num_output_tokens == 1 && !o.new_token_ids.empty())
        ++num_with_first_token;
    }
  }
  auto start = Clock::now();
  for (int s = 0; s < num_steps; ++s) {
    RETURN_IF_ERROR(eng.step().status());
  }
  double secs = seconds_since(start);
  while (eng.has_unfinished_requests()) {
    RETURN_IF_ERROR(eng.step().status());
  }
  return DecodeFigures{batch * num_steps / secs, secs * 1000 / num_steps};
}

// A deterministic test card: gradients across each channel with a fine checker and a ring
// pattern, so that the resize has detail to filter.
media::RgbImage synthetic_image(int width, int height) {
  media::RgbImage image;
  image.width = width;
  image.height = height;
  image.rgb.resize(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &image.rgb[(static_cast<size_t>(y) * width + x) * 3];
      const int checker = ((x / 8 + y / 8) % 2) * 48;
      const int dx = x - width / 2;
      const int dy = y - height / 2;
      p[0] = static_cast<uint8_t>(x * 207 / std::max(1, width - 1) + checker);
      p[1] = static_cast<uint8_t>(y * 207 / std::max(1, height - 1) + checker);
      p[2] = static_cast<uint8_t>(((dx * dx + dy * dy) / 64) % 256);
    }
  }
  return image;
}

const char* peak_name(kernels::WeightFormat format) {
  return format == kernels::WeightFormat::kBF16 ? "BF16" : "FP32";
}

// The image-encoding section of a vision-language model: two synthetic images through the
// model's preprocessing and its vision tower, best of `reps` timed runs after a warm-up, with
// the tower's FLOP rate against the peak multiply-add rate of the format its matrices use.
Status bench_vision(const engine::LoadedEngine& loaded, ThreadPool& pool, int reps,
                    kernels::WeightFormat measured_peak_format, double measured_peak_gflops) {
  model::VisionTransformer& tower = *loaded.vision;
  const model::VisionConfig& vc = tower.config();
  media::ImageProcessorConfig processor;
  if (!loaded.preprocessor_config_json.empty()) {
    ASSIGN_OR_RETURN(processor, media::parse_preprocessor_config(loaded.preprocessor_config_json));
  }
  // The baseline for the tower's own weight format (the language model's may differ).
  const kernels::WeightFormat tower_peak_format = kernels::gemm_peak_format(
      tower.weight_format() == kernels::WeightFormat::kF32 ? kernels::WeightFormat::kF32
                                                           : kernels::WeightFormat::kBF16);
  const double peak_gflops = tower_peak_format == measured_peak_format
                                 ? measured_peak_gflops
                                 : kernels::measure_peak_gflops(pool, tower_peak_format);

  std::printf(
      "vision       %s tower: %d blocks, width %d, %d heads, %s weights, %.1f M multiply-adds "
      "per patch; preprocessing %s (min_pixels %lld, max_pixels %lld)\n",
      std::string(model::vision_architecture_name(vc.architecture)).c_str(), vc.depth, vc.embed_dim,
      vc.num_heads, std::string(kernels::weight_format_name(tower.weight_format())).c_str(),
      static_cast<double>(tower.num_weight_params()) / 1e6,
      loaded.preprocessor_config_json.empty() ? "defaults (no preprocessor_config.json)"
                                              : "from preprocessor_config.json",
      static_cast<long long>(processor.min_pixels), static_cast<long long>(processor.max_pixels));
  if (tower_peak_format != measured_peak_format) {
    std::printf("baseline     peak %s multiply-add %.1f GFLOP/s (same run, the tower's format)\n",
                peak_name(tower_peak_format), peak_gflops);
  }

  struct Row {
    std::string name;
    double linear_gflops = 0;     // patch embedding, blocks' linear layers, merger
    double attention_gflops = 0;  // scores, softmax and values
    double attention_share = 0;   // of the tower's time
  };
  std::vector<Row> rows;
  for (auto [width, height] : {std::pair{448, 448}, std::pair{1280, 720}}) {
    const media::RgbImage image = synthetic_image(width, height);
    double best_preprocess_s = 1e30;
    double best_encode_s = 1e30;
    double attention_s = 0;  // of the best run
    media::PixelPatches patches;
    std::vector<float> embeddings;
    for (int r = 0; r < reps + 1; ++r) {  // r == 0 warms up
      auto start = Clock::now();
      ASSIGN_OR_RETURN(patches, media::preprocess_image(image, processor));
      const double preprocess_s = seconds_since(start);
      start = Clock::now();
      RETURN_IF_ERROR(
          tower.encode(patches.values, patches.grid_t, patches.grid_h, patches.grid_w, embeddings));
      const double encode_s = seconds_since(start);
      if (r > 0) {
        best_preprocess_s = std::min(best_preprocess_s, preprocess_s);
        if (encode_s < best_encode_s) {
          best_encode_s = encode_s;
          attention_s = tower.last_attention_seconds();
        }
      }
    }
    const int num_patches = patches.num_patches();
    const double linear_flops = 2.0 * static_cast<double>(tower.num_weight_params()) * num_patches;
    const double attention_flops = 2.0 * static_cast<double>(tower.attention_flops(
                                             patches.grid_t, patches.grid_h, patches.grid_w));
    const double linear_s = std::max(best_encode_s - attention_s, 1e-9);
    Row row;
    row.name = std::to_string(width) + "x" + std::to_string(height);
    row.linear_gflops = linear_flops / linear_s / 1e9;
    row.attention_gflops = attention_flops / std::max(attention_s, 1e-9) / 1e9;
    row.attention_share = attention_s / best_encode_s;
    std::printf(
        "image        %s -> %dx%d, grid %dx%dx%d: %d patches, %d tokens; preprocess %.2f ms, "
        "tower %.1f ms per image (best of %d runs; attention %.0f%% of it), %.1f patches/s, "
        "%.1f GFLOP/s overall\n",
        row.name.c_str(), patches.grid_w * processor.patch_size,
        patches.grid_h * processor.patch_size, patches.grid_t, patches.grid_h, patches.grid_w,
        num_patches, patches.num_merged_tokens(vc.spatial_merge_size), best_preprocess_s * 1000,
        best_encode_s * 1000, reps, row.attention_share * 100, num_patches / best_encode_s,
        (linear_flops + attention_flops) / best_encode_s / 1e9);
    rows.push_back(row);
  }
  for (const Row& row : rows) {
    std::printf(
        "ratio        vision tower %-9s linear layers %.1f GFLOP/s = %.2f of peak %s multiply-add "
        "(target >= 0.50); attention %.1f GFLOP/s = %.2f\n",
        row.name.c_str(), row.linear_gflops, row.linear_gflops / peak_gflops,
        peak_name(tower_peak_format), row.attention_gflops, row.attention_gflops / peak_gflops);
  }
  return Status::ok();
}

int run_bench_engine(const std::vector<std::string>& args) {
  ModelFlags model_flags;
  model_flags.threads = 2;
  model_flags.max_num_batched_tokens = 4096;
  int prompt_len = 512;
  int decode_steps = 32;
  int big_batch = 16;
  int decode_context = 128;
  int reps = 3;
  FlagParser flags(
      "crescent bench engine --model DIR|FILE [--threads N] [flags]",
      "Measures prefill tokens/s (one prompt), decode tokens/s at batch 1 and at a larger\n"
      "batch, and compares them with baselines measured in the same run: batch-1 decode\n"
      "streams every weight once per token, so its weight bytes/s are compared with a\n"
      "read-only stream of memory (the best of one after each round of decode runs) and a\n"
      "memcpy on the same threads; prefill is compared with the peak rate of a register-only\n"
      "microkernel of the instructions its matrices use (int8 vpdpbusd for quantised weights,\n"
      "else BF16 or FP32 multiply-adds), the best of one after each timed prefill. A\n"
      "vision-language model adds its image encoding: a 448x448 and a 1280x720 synthetic\n"
      "image through the model's preprocessing and vision tower, with the tower's FLOP rate\n"
      "against the peak multiply-add rate of the tower's weight format.");
  model_flags.add_to(flags);
  flags.add("prompt-len", &prompt_len, "prompt tokens for the prefill measurement");
  flags.add("decode-steps", &decode_steps, "decode steps timed per measurement");
  flags.add("batch", &big_batch, "the larger decode batch");
  flags.add("decode-context", &decode_context,
            "prompt tokens of each decoding sequence (the KV each decode step reads)");
  flags.add("reps", &reps, "repetitions; the best is reported");
  if (int code = flags.parse_or_exit_code(args); code >= 0)
    return code;
  model_flags.enable_prefix_caching = false;  // every repetition must really compute
  if (decode_context < 1) {
    std::fprintf(stderr, "error: --decode-context must be positive\n");
    return 1;
  }
  if (reps < 1) {
    std::fprintf(stderr, "error: --reps must be at least 1, got %d\n", reps);
    return 1;
  }

  auto loaded_or = model_flags.load();
  if (!loaded_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", loaded_or.status().to_string().c_str());
    return 1;
  }
  engine::LoadedEngine& loaded = **loaded_or;
  ThreadPool& pool = ThreadPool::default_pool();
  const model::ModelConfig& cfg = loaded.model->config();
  const int vocab = cfg.vocab_size;
  engine::EngineOptions opts = loaded.engine_options;
  opts.max_num_batched_tokens = std::max(opts.max_num_batched_tokens, prompt_len);
  engine::Engine eng(opts, loaded.runner.get());
  std::mt19937 rng(1234);
  int ids = 0;

  std::printf(
      "model        %s (%s weights, %.0f MiB streamed per token), %s KV cache (%d blocks, %lld "
      "bytes per token), %d threads, ISA %s\n",
      loaded.model->name().c_str(), loaded.model->weight_format_name().c_str(),
      loaded.model->num_weight_bytes() / 1048576.0,
      kernels::kv_dtype_name(loaded.runner->kv_layout().dtype).data(),
      loaded.runner->num_kv_blocks(),
      static_cast<long long>(loaded.runner->kv_layout().block_num_bytes() /
                             loaded.runner->kv_layout().block_size),
      pool.num_threads(), kernels::isa_name(kernels::active_isa()).data());

  const kernels::WeightFormat peak_format = kernels::gemm_peak_format(
      loaded.model->weight_format() == kernels::WeightFormat::kF32 ? kernels::WeightFormat::kF32
                                                                   : kernels::WeightFormat::kBF16);
  // Quantised matrices multiply on int8 dot products (vpdpbusd): that peak judges their prefill.
  const kernels::WeightFormat matrices = loaded.model->matrix_format();
  const bool quantised =
      matrices != kernels::WeightFormat::kF32 && matrices != kernels::WeightFormat::kBF16;
  double peak_gflops = 0;
  double peak_int8_gops = 0;

  // Prefill: one prompt, max_tokens 1, the whole prompt in one step.
  double best_prefill_s = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    engine::EngineRequest req;
    req.request_id = "prefill-" + std::to_string(ids++);
    req.prompt_token_ids = random_prompt(rng, prompt_len, vocab);
    req.sampling.temperature = 0;
    req.sampling.max_tokens = 1;
    req.sampling.ignore_eos = true;
    if (Status s = eng.add_request(std::move(req)); !s.is_ok()) {
      std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
      return 1;
    }
    auto start = Clock::now();
    while (eng.has_unfinished_requests()) {
      if (auto st = eng.step(); !st.is_ok()) {
        std::fprintf(stderr, "error: %s\n", st.status().to_string().c_str());
        return 1;
      }
    }
    if (r == 0)
      continue;  // warms up
    best_prefill_s = std::min(best_prefill_s, seconds_since(start));
    // The peaks are measured right after each timed prefill and the best kept, as the read-only
    // stream is after each round of decode runs: a VM's core speed moves between moments (its
    // int8 peak read 811-1403 GOP/s within one run), and a peak from another moment than the
    // prefill's moves the ratio more than the prefill itself does.
    peak_gflops = std::max(peak_gflops, kernels::measure_peak_gflops(pool, peak_format));
    if (quantised)
      peak_int8_gops = std::max(peak_int8_gops, kernels::measure_peak_int8_gops(pool));
  }
  // Multiply-adds of the layers' matrices per token (2 flops each), lm_head for the last token
  // only (a prefill needs no other logits), plus causal attention.
  const double lm_head_flops = 2.0 * static_cast<double>(loaded.model->num_lm_head_params());
  const double layer_flops_per_token =
      2.0 * static_cast<double>(loaded.model->num_weight_params()) - lm_head_flops;
  const double attn_flops = 2.0 * 2.0 * cfg.num_hidden_layers * cfg.num_attention_heads *
                            cfg.head_dim * (static_cast<double>(prompt_len) * (prompt_len + 1) / 2);
  const double prefill_gflops =
      (layer_flops_per_token * prompt_len + lm_head_flops + attn_flops) / best_prefill_s / 1e9;

  DecodeFigures best1, best_n;
  // The read-only stream is measured after each round of decode runs and the best kept: on
  // a shared host the memory's rate moves between runs (33-60 GB/s seen on the 2-vCPU VM), and
  // a baseline from another moment can make decode look faster than the memory.
  double read_gbps = 0;
  for (int r = 0; r < reps; ++r) {
    auto d1 = measure_decode(eng, rng, vocab, 1, decode_context, decode_steps, &ids);
    auto dn = measure_decode(eng, rng, vocab, big_batch, decode_context, decode_steps, &ids);
    read_gbps = std::max(read_gbps, kernels::measure_read_gbps(pool));
    if (!d1.is_ok() || !dn.is_ok()) {
      std::fprintf(stderr, "error: %s\n",
                   (d1.is_ok() ? dn.status() : d1.status()).to_string().c_str());
      return 1;
    }
    if (d1->tokens_per_s > best1.tokens_per_s)
      best1 = *d1;
    if (dn->tokens_per_s > best_n.tokens_per_s)
      best_n = *dn;
  }
  const double memcpy_gbps = kernels::measure_memcpy_gbps(pool);
  const double weight_gbps =
      static_cast<double>(loaded.model->num_weight_bytes()) * best1.tokens_per_s / 1e9;

  std::printf("prefill      %6d-token prompt: %8.1f tokens/s  (%.1f ms)\n", prompt_len,
              prompt_len / best_prefill_s, best_prefill_s * 1000);
  std::printf("decode       batch 1:  %8.1f tokens/s  (%.2f ms/step, %d-token context)\n",
              best1.tokens_per_s, best1.step_ms, decode_context);
  std::printf("decode       batch %d: %8.1f tokens/s  (%.2f ms/step, %d-token contexts)\n",
              big_batch, best_n.tokens_per_s, best_n.step_ms, decode_context);
  std::printf(
      "baseline     memcpy %.1f GB/s (bytes copied), read-only stream %.1f GB/s (the best of "
      "%d, one after each round of decode runs); peak %s multiply-add %.1f GFLOP/s (the best "
      "of %d, one after each timed prefill)\n",
      memcpy_gbps, read_gbps, reps, peak_name(peak_format), peak_gflops, reps);
  std::printf("ratio        batch-1 decode weight stream %.1f GB/s = %.2f of memcpy\n", weight_gbps,
              weight_gbps / memcpy_gbps);
  std::printf(
      "ratio        batch-1 decode weight stream = %.2f of the read-only stream (target >= "
      "0.80)\n",
      weight_gbps / read_gbps);
  if (peak_int8_gops > 0) {
    std::printf(
        "baseline     peak int8 multiply-add (vpdpbusd) %.1f GOP/s (the best of %d, one after "
        "each timed prefill)\n",
        peak_int8_gops, reps);
    std::printf(
        "ratio        prefill %.1f GOP/s = %.2f of peak int8 multiply-add     (target >= 0.60)\n",
        prefill_gflops, prefill_gflops / peak_int8_gops);
  } else {
    std::printf(
        "ratio        prefill %.1f GFLOP/s = %.2f of peak %s multiply-add     (target >= 0.60)\n",
        prefill_gflops, prefill_gflops / peak_gflops, peak_name(peak_format));
  }
  if (loaded.is_multimodal()) {
    if (Status s = bench_vision(loaded, pool, reps, peak_format, peak_gflops); !s.is_ok()) {
      std::fprintf(stderr, "error: vision tower: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_engine, "bench engine",
                          "prefill/decode throughput vs same-run memcpy and peak-FLOP baselines",
                          run_bench_engine)

}  // namespace crescent::apps
