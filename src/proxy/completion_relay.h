#pragma once
// One completion request through the proxy (DESIGN.md §2): the prefill and the decode request
// are sent at once (or, for a colocated prefill+decode server, only the "decode" one), the decode
// server's answer is relayed to the client as it arrives, and every failure reaches the client:
//   - the decode server fails or answers an error: its status and an OpenAI-shaped error (its
//     own body when it is one), and the prefill request, if still pending, is abandoned (its
//     connection closed, so the prefill server aborts it and holds no KV for a dead decode);
//   - the prefill server fails before the decode server produced a byte: the decode request is
//     abandoned (its connection closed, so the server aborts) and the client gets 502 (or the
//     prefill's own status) with a message naming the prefill;
//   - anything failing after the stream began: `data: {"error": ...}`, `data: [DONE]`, end;
//   - the client going away: both upstream connections are closed at once.
// The relay owns itself (its upstream calls hold it) and is gone once both calls ended.

#include <memory>
#include <string>

#include "core/clock.h"
#include "net/http/http_server.h"
#include "proxy/proxy_metrics.h"
#include "proxy/proxy_options.h"
#include "proxy/upstream_client.h"

namespace crescent::proxy {

// Everything one relay needs, decided by the caller (ProxyServer).
struct RelayPlan {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string request_id;
  int64_t arrival_ns = 0;
  Deadline deadline = Deadline::never();
  // False for a colocated prefill+decode server (--pd): only the decode call is made.
  bool has_prefill = true;
  UpstreamUrl prefill;
  UpstreamRequest prefill_request;
  // How messages name the decode server: "decode", or "pd" for a colocated one.
  std::string decode_role = "decode";
  UpstreamUrl decode;
  UpstreamRequest decode_request;
  uint64_t max_buffered_response_bytes = 64ull << 20;
  // Runs when both upstream calls have ended (the caller frees the request id there).
  std::function<void()> on_released;
  // Runs once when the prefill call has ended, however (at the latest with on_released): the
  // kv_aware router counts prefill load with it.
  std::function<void()> on_prefill_ended;
  // Runs when the decode call got no answer at all (refused, reset or timed out connecting,
  // closed before a status line): the caller takes that server out of rotation.
  std::function<void(const Status& why)> on_decode_unreachable;
  // The same for the prefill call.
  std::function<void(const Status& why)> on_prefill_unreachable;
  // Runs when the decode call failed (no answer, or a 5xx) while the prefill call was still
  // waiting, which the relay then cancels. The prefill may be what failed: a decode server
  // that cannot pull KV from a dead prefill fails first, and the cancelled call never learns
  // that the prefill is unreachable. The caller checks the prefill at once.
  std::function<void()> on_prefill_abandoned;
};

// Starts the relay; returns at once. `upstream` and `metrics` must outlive every relay (the
// UpstreamClient's destructor ends all calls, so destroying it first is enough).
void start_completion_relay(RelayPlan plan, UpstreamClient* upstream, ProxyMetrics* metrics,
                            std::shared_ptr<net::http::ResponseWriter> writer);

}  // namespace crescent::proxy
