// crescent quantize: rewrites a model as a GGUF file of another weight type.

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "model/quantize.h"

namespace crescent::apps {
namespace {

int run_quantize(const std::vector<std::string>& args) {
  FlagParser flags(
      "crescent quantize IN OUT --type TYPE [--force]",
      "Writes OUT, a GGUF file whose 2-D weights are stored as TYPE. IN is a GGUF file of any "
      "type crescent loads, or a Hugging Face checkout (config.json, safetensors, "
      "tokenizer.json). Every metadata key of a GGUF input is carried over (tokenizer and chat "
      "template included); a checkout gets its tokenizer.json and tokenizer_config.json's chat "
      "template. Per-tensor types follow llama-quantize: norms and biases F32; the output "
      "matrix (or tied embedding) Q6_K for the quantised types other than q8_0; q4_k_m/q5_k_m "
      "also put attn_v and ffn_down in Q6_K in llama-quantize's layers; rows that are no "
      "multiple of 256 fall back as in llama-quantize (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to "
      "Q8_0, Q2_K/Q3_K to IQ4_NL). Requantising an "
      "already quantised GGUF compounds the errors: prefer a bf16/f16/f32 source.\n"
      "Example: crescent quantize qwen2.5-0.5b-f16.gguf qwen2.5-0.5b-q4_k_m.gguf --type q4_k_m");
  std::string type;
  bool force = false;
  bool progress = isatty(STDERR_FILENO) != 0;
  flags.add("type", &type,
            "the weight type: q4_k_m, q5_k_m, q6_k, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, "
            "q4_k, q5_k, iq4_nl, bf16, f16, f32");
  flags.add("force", &force, "overwrite OUT if it exists (never the input itself)");
  flags.add("progress", &progress, "show progress on stderr (default: when stderr is a tty)");
  flags.require("type");
  if (int code = flags.parse_or_exit_code(args); code >= 0)
    return code;
  if (flags.positional().size() != 2) {
    std::fprintf(stderr, "error: expected IN and OUT, got %zu arguments\n%s",
                 flags.positional().size(), flags.help_text().c_str());
    return 2;
  }
  Result<model::GgufWeightType> t = model::parse_gguf_weight_type(type);
  if (!t.is_ok()) {
    std::fprintf(stderr, "error: --type: %s\n", t.status().message().c_str());
    return 2;
  }
  model::QuantizeOptions o;
  o.input = flags.positional()[0];
  o.output = flags.positional()[1];
  o.type = *t;
  o.overwrite = force;
  if (progress) {
    o.progress = [](int64_t done, int64_t total) {
      std::fprintf(stderr, "\r%5.1f%% of %.1f MiB", total > 0 ? 100.0 * done / total : 100.0,
                   total / 1048576.0);
      if (done >= total)
        std::fprintf(stderr, "\n");
    };
  }
  Status s = model::quantize_model(o);
  if (!s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s (%s)\n", o.output.c_str(), type.c_str());
  return 0;
}

}  // namespace
}  // namespace crescent::apps

CRESCENT_REGISTER_COMMAND(quantize, "quantize",
                          "rewrite a model (GGUF or HF checkout) as a GGUF of another weight type",
                          crescent::apps::run_quantize)
