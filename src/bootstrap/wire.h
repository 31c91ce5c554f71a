#pragma once
// The bootstrap protocol's JSON bodies (vLLM Mooncake shapes), written and parsed in one place
// so the server and the client cannot drift apart. Parsers validate everything a peer sends.

#include <string>
#include <string_view>

#include "bootstrap/bootstrap_client.h"
#include "core/status.h"

namespace crescent::bootstrap {

// Bounds on what a registration may carry.
inline constexpr size_t kMaxEngineIdBytes = 256;
inline constexpr int kMaxDpRanks = 1024;  // dp_rank < expected_dp_ranks <= this
inline constexpr int kMaxTpPpRank = 1023;
inline constexpr size_t kMaxRegisterBodyBytes = 16 << 10;
inline constexpr double kMaxLeaseTtlS = 3600;

// {"engine_id","dp_rank","tp_rank","pp_rank","addr"}, plus "role" when it is not empty and
// "lease_ttl_s" when it asks for a lease.
std::string registration_json(const WorkerRegistration& registration);
// Checks types, ranks in [0, bounds], a non-empty printable engine id of at most
// kMaxEngineIdBytes, and a tcp://host:port addr. Unknown extra fields are ignored (vLLM sends
// some). "role" is optional: absent, or "encode" (an encoder; then the ranks may be absent
// and are read as 0). "lease_ttl_s" is optional: a number of seconds in (0, kMaxLeaseTtlS].
// InvalidArgument naming the field otherwise.
Result<WorkerRegistration> parse_registration_json(std::string_view body);

// {"<dp>": {"engine_id": E, "epoch": N, "worker_addr": {"<tp>": {"<pp>": "tcp://host:port"}}}}
// ("epoch" only when known; vLLM's readers ignore it).
std::string query_json(const QueryResult& result);
// DataLoss naming what is wrong when the body is not that shape.
Result<QueryResult> parse_query_json(std::string_view body);

// The 200 answer to POST /register: {"status":"ok","epoch":N[,"lease_ttl_s":T]}.
std::string registered_json(const Registered& registered);
// Lenient: a vLLM-style {"status":"ok"} reads as epoch 0, no lease.
Registered parse_registered_json(std::string_view body);

// GET /query?role=encode: {"<engine_id>": {"role": "encode", "worker_addr": "tcp://host:port"}}.
std::string encoders_json(const EncoderTable& encoders);
// DataLoss naming what is wrong when the body is not that shape.
Result<EncoderTable> parse_encoders_json(std::string_view body);

// {"error": {"message", "type", "code"}} as OpenAI shapes errors.
std::string error_json(std::string_view message, std::string_view type, std::string_view code);
// The "message" (and "code") of an error body; the raw body when it is not that shape.
struct ErrorBody {
  std::string message;
  std::string code;
};
ErrorBody parse_error_json(std::string_view body);

}  // namespace crescent::bootstrap
