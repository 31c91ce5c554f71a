// `crescent generate`: offline generation from a prompt, streamed to stdout as it is decoded.

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "apps/model_flags.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "engine/loader.h"

namespace crescent::apps {
namespace {

int run_generate(const std::vector<std::string>& args) {
  ModelFlags model_flags;
  std::string prompt;
  bool chat = false;
  std::string system_prompt;
  engine::SamplingParams sampling;
  sampling.max_tokens = 64;
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  int top_k = 0;
  int64_t seed = -1;
  int logprobs = -1;
  bool ignore_eos = false;
  std::vector<std::string> stop;

  FlagParser flags(
      "crescent generate --model DIR|FILE --prompt TEXT [flags]",
      "Generates text offline from one prompt and streams it to stdout; timing to stderr.");
  model_flags.add_to(flags);
  flags.add("prompt", &prompt, "the prompt text");
  flags.add("chat", &chat, "wrap the prompt as a user message with the model's chat template");
  flags.add("system", &system_prompt, "a system message (with --chat)");
  flags.add("max-tokens", &sampling.max_tokens, "tokens to generate at most");
  flags.add("temperature", &temperature, "sampling temperature; 0 is greedy");
  flags.add("top-p", &top_p, "nucleus sampling: keep the smallest set of tokens with this mass");
  flags.add("top-k", &top_k, "keep the k most likely tokens; 0 keeps all");
  flags.add("min-p", &min_p, "drop tokens less likely than min_p times the most likely one");
  flags.add("seed", &seed, "random seed for sampling; -1 picks one");
  flags.add("logprobs", &logprobs, "print the N most likely alternatives of each token; -1 off");
  flags.add("ignore-eos", &ignore_eos, "keep generating after an end-of-sequence token");
  flags.add_repeated("stop", &stop, "stop when this string is generated (repeatable)");
  flags.require("prompt");
  if (int code = flags.parse_or_exit_code(args); code >= 0)
    return code;

  sampling.temperature = static_cast<float>(temperature);
  sampling.top_p = static_cast<float>(top_p);
  sampling.top_k = top_k;
  sampling.min_p = static_cast<float>(min_p);
  if (seed >= 0)
    sampling.seed = static_cast<uint64_t>(seed);
  if (logprobs >= 0)
    sampling.logprobs = logprobs;
  sampling.ignore_eos = ignore_eos;
  sampling.stop = stop;

  auto loaded_or = model_flags.load();
  if (!loaded_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", loaded_or.status().to_string().c_str());
    return 1;
  }
  engine::LoadedEngine& loaded = **loaded_or;

  std::string text = prompt;
  if (chat) {
    if (!loaded.chat_template) {
      std::fprintf(stderr, "error: --chat: this model has no usable chat template\n");
      return 1;
    }
    std::vector<model::ChatMessage> messages;
    if (!system_prompt.empty())
      messages.push_back({"system", system_prompt});
    messages.push_back({"user", prompt});
    auto rendered = loaded.chat_template->render(messages, /*add_generation_prompt=*/true);
    if (!rendered.is_ok()) {
      std::fprintf(stderr, "error: %s\n", rendered.status().to_string().c_str());
      return 1;
    }
    text = *rendered;
  }
  auto ids = loaded.tokenizer->encode(text, /*add_special_tokens=*/!chat);
  if (!ids.is_ok()) {
    std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
    return 1;
  }

  engine::Engine engine(loaded.engine_options, loaded.runner.get());
  engine::EngineRequest request;
  request.request_id = "generate-0";
  request.prompt_token_ids = *ids;
  request.sampling = sampling;
  if (Status s = engine.add_request(std::move(request)); !s.is_ok()) {
    std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
    return 1;
  }

  auto start = std::chrono::steady_clock::now();
  double ttft_ms = -1;
  int num_prompt_tokens = 0, num_output_tokens = 0;
  engine::FinishReason finish = engine::FinishReason::kNone;
  while (engine.has_unfinished_requests()) {
    auto outputs = engine.step();
    if (!outputs.is_ok()) {
      std::fprintf(stderr, "\nerror: %s\n", outputs.status().to_string().c_str());
      return 1;
    }
    for (const auto& out : *outputs) {
      if (ttft_ms < 0 && !out.new_token_ids.empty()) {
        ttft_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
      }
      std::fwrite(out.new_text.data(), 1, out.new_text.size(), stdout);
      std::fflush(stdout);
      if (logprobs >= 0) {
        for (const auto& lp : out.logprobs) {
          std::fprintf(stderr, "[token %d logprob %.4f; top:", lp.sampled.token_id,
                       lp.sampled.logprob);
          for (const auto& alt : lp.top) {
            std::fprintf(stderr, " %d:%.4f", alt.token_id, alt.logprob);
          }
          std::fprintf(stderr, "]\n");
        }
      }
      num_prompt_tokens = out.num_prompt_tokens;
      num_output_tokens = out.num_output_tokens;
      if (out.finished)
        finish = out.finish_reason;
    }
  }
  double total_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double decode_tps =
      num_output_tokens > 1 ? (num_output_tokens - 1) / ((total_ms - ttft_ms) / 1000.0) : 0;
  std::printf("\n");
  std::fprintf(stderr,
               "[%d prompt tokens, %d generated, finish=%s, time to first token %.1f ms, "
               "decode %.1f tokens/s]\n",
               num_prompt_tokens, num_output_tokens, engine::finish_reason_name(finish), ttft_ms,
               decode_tps);
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(generate, "generate", "generate text offline from a prompt", run_generate)

}  // namespace crescent::apps
