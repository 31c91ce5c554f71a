#pragma once
// Client side of the disaggregation tests: one OpenAI request (whole or streamed) read into a
// Reply that looks the same either way (text, sampled tokens and logprobs, usage, the error
// message from an error body or an SSE error event), kv_transfer_params for driving P and D
// directly, and /metrics read as numbers.

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/clock.h"
#include "net/http/http_message.h"

namespace crescent::testing {

using json = nlohmann::json;

struct Reply {
  int status = 0;               // HTTP status; 0 when the request itself failed
  std::string transport_error;  // why, when status is 0
  bool streamed = false;
  bool done = false;  // streamed: "data: [DONE]" seen
  std::string text;
  std::vector<std::string> tokens;  // sampled tokens (when logprobs were asked for)
  std::vector<double> logprobs;     // their logprobs
  // Per sampled token: best minus second-best logprob among the returned top logprobs
  // (infinity when fewer than two were returned). Small margins are near ties, where two
  // numerically valid computations may pick different tokens.
  std::vector<double> margins;
  json usage;
  std::string finish_reason;
  std::string error_message;  // from {"error": {...}} (body or SSE event); empty if none
  json error;                 // that error object
  int num_chunks = 0;         // streamed: content events
  double seconds = 0;         // request start -> end
  std::string raw;            // whole body, or the concatenated SSE data (for messages)

  // usage[field], or -1 when there is no such number.
  int usage_of(const std::string& field) const;
  // 200, no error, and (streamed) [DONE] seen.
  bool is_ok() const;
  // One line for failure messages.
  std::string describe() const;
};

struct SendOptions {
  net::http::Headers headers;
  // Streamed only: stop reading (close the connection) after this many body pieces.
  int disconnect_after_pieces = 0;
  // Streamed only: called (on the sending thread) after each body piece was read.
  std::function<void()> on_piece;
  int timeout_ms = 60'000;
};

// A /v1/completions body for the test model (kModelName): greedy, exactly max_tokens tokens
// (ignore_eos); a streamed one asks for the usage chunk.
json completion(const std::string& prompt, int max_tokens, bool stream = false);

// POSTs body to 127.0.0.1:port path; streams when body["stream"] is true.
Reply send(int port, const std::string& path, const json& body, const SendOptions& options = {});

// kv_transfer_params as the proxy sends them (DESIGN.md §2).
json prefill_params(const std::string& transfer_id);
json decode_params(const std::string& transfer_id, const std::string& bootstrap_url,
                   const std::string& engine_id);
// body as the proxy makes it for P: max_tokens 1, not streamed, prefill params.
json prefill_body(json body, const std::string& transfer_id);
// body with the decode params.
json decode_body(json body, const std::string& transfer_id, const std::string& bootstrap_url,
                 const std::string& engine_id);

// GET /query of a bootstrap server: the engine_id of dp rank 0 ("" with why in *error).
std::string query_engine_id(const std::string& bootstrap_url, std::string* error);

// /metrics of a server as name{labels} -> value ("" on failure with the reason in *error).
std::map<std::string, double> read_metrics(int port, std::string* error = nullptr);
// Sum of the samples of family `name` (exact metric name before '{') whose labels contain
// every `label="value"` in label_filters.
double metric_sum(const std::map<std::string, double>& metrics, const std::string& name,
                  const std::vector<std::string>& label_filters = {});

// Polls until metric_sum(name, label_filters) of the server at port is >= value or the
// deadline; returns the last value seen.
double wait_metric_at_least(int port, const std::string& name,
                            const std::vector<std::string>& label_filters, double value,
                            Deadline deadline);

// crescent_kv_cache_blocks_used of the server at port (-1 if /metrics fails).
double blocks_used(int port);
// Polls until blocks_used(port) == expected or the deadline; returns the last value seen.
double wait_blocks_used(int port, double expected, Deadline deadline);

}  // namespace crescent::testing
