// Fuzz target: the OpenAI request parser of src/server (openai_protocol) and the JSON parse it
// sits on (core/json.h). The first input byte picks the endpoint (chat or completions); the
// rest is the request body. Invariants: a parse returns OK or an ApiError with a 4xx status and
// a message; nothing throws (an escaping exception aborts, which libFuzzer reports); what the
// parser keeps (kv_transfer_params, ec_transfer_params, messages) can be dumped back to text
// as the server does when it answers.

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/json.h"
#include "server/openai_protocol.h"

using crescent::server::Endpoint;
using crescent::server::GenerationRequest;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  Endpoint endpoint = (data[0] & 1) != 0 ? Endpoint::kChat : Endpoint::kCompletions;
  std::string body(reinterpret_cast<const char*>(data + 1), size - 1);

  // The raw parse: OK, or an InvalidArgument with a message naming the body.
  auto raw = crescent::parse_json(body, "the request body");
  if (raw.is_ok()) {
    (void)crescent::server::dump_json(*raw);
  } else {
    CRESCENT_CHECK(!raw.status().message().empty());
  }

  GenerationRequest request;
  auto error = crescent::server::parse_generation_request(body, endpoint, &request);
  if (error.has_value()) {
    CRESCENT_CHECK(error->http_status >= 400 && error->http_status < 500)
        << "status " << error->http_status << " for bad input: " << error->message;
    CRESCENT_CHECK(!error->message.empty());
    (void)crescent::server::dump_json(crescent::server::error_json(*error));
    return 0;
  }
  // A request the parser accepted: exactly one prompt form for completions, messages for chat.
  if (endpoint == Endpoint::kCompletions) {
    CRESCENT_CHECK(request.prompt_text.has_value() != request.prompt_token_ids.has_value());
  } else {
    CRESCENT_CHECK(!request.messages.empty());
  }
  if (request.kv_transfer_params.has_value()) {
    (void)crescent::server::dump_json(*request.kv_transfer_params);
  }
  if (request.ec_transfer_params.has_value()) {
    (void)crescent::server::dump_json(*request.ec_transfer_params);
  }
  return 0;
}
