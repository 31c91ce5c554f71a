#pragma once
// A PromptTokenizer that asks the benchmarked server: POST /tokenize and /detokenize in vLLM's
// shapes ({"model", "prompt", "add_special_tokens"} -> {"tokens"}; {"model", "tokens"} ->
// {"prompt"}), or llama.cpp server's ({"content", "add_special"} -> {"tokens"}; {"tokens"} ->
// {"content"}) when the server has no vLLM-shaped endpoint. Which one is decided once, by a
// probe, when it connects.
//
// Random prompts need ids that are text on their own; a server cannot list its vocabulary, so
// they are the ids the server gives for a built-in ASCII text of pseudo-words, digits and
// punctuation (a few thousand distinct ids on a 150k vocabulary), each decoding to whole
// characters next to any neighbour.

#include <memory>
#include <string>

#include "bench/openai_request.h"
#include "bench/prompt_tokenizer.h"
#include "net/http/http_message.h"

namespace crescent::bench {

struct ServerTokenizerOptions {
  ServerAddress address;
  std::string model;           // the "model" field of vLLM-shaped requests
  net::http::Headers headers;  // e.g. authorization, as the benchmark's requests carry
  double timeout_s = 30;       // each call
};

// Connects and probes; FailedPrecondition naming the server when it has neither endpoint.
Result<std::unique_ptr<PromptTokenizer>> connect_server_tokenizer(ServerTokenizerOptions options);

// The built-in text whose token ids random prompts draw from (deterministic).
std::string pseudo_word_text();

}  // namespace crescent::bench
