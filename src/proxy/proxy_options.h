#pragma once
// What `crescent proxy` is told on its command line: where it listens, the prefill servers
// (each with the port of its bootstrap server) and the decode servers, or colocated
// prefill+decode servers (--pd), the encoder servers of EPD (--encode), and its limits.
// parse_proxy_args() reads the reference proxy's flags (seeds/004) and checks every value, so
// a bad URL or port is a usage error at start, never a failure later.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace crescent::proxy {

// Where the bootstrap server listens when --prefill gives no port (or 'none'), as in the
// reference proxy.
inline constexpr int kDefaultBootstrapPort = 8998;

// An upstream HTTP server: "http://host:port" taken apart.
struct UpstreamUrl {
  std::string url;   // as given, without a trailing '/'
  std::string host;  // "10.0.0.1", "prefill-1" or "::1" (no brackets)
  int port = 80;

  // "host:port", with brackets around an IPv6 address.
  std::string host_port() const;
};

// Parses "http://HOST[:PORT][/]". Anything else (https, a path, a bad port) is InvalidArgument
// with a message naming the problem.
Result<UpstreamUrl> parse_upstream_url(std::string_view url);

struct PrefillSpec {
  UpstreamUrl server;
  int bootstrap_port = kDefaultBootstrapPort;
  // "etcd://HOST:PORT/PREFIX" when the prefill registers in etcd (`--prefill URL ETCD_URL`);
  // "" for its bootstrap server on bootstrap_port.
  std::string etcd_url = {};

  // "http://HOST:BOOTSTRAP_PORT" (or etcd_url): what decode servers are told as
  // remote_bootstrap_addr, and where the proxy asks for the engine ids.
  std::string bootstrap_addr() const;
};

struct ProxyOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  std::vector<PrefillSpec> prefills;
  std::vector<UpstreamUrl> decodes;
  // `crescent serve --role both` servers (1E1PD): each request goes whole to one of them,
  // without kv_transfer_params. Either these or prefills and decodes, never both.
  std::vector<UpstreamUrl> pds;
  // Encoder servers (`--role encode`, DESIGN.md §2b). Empty: images go to the prefill (or pd)
  // server inside the request, as without EPD.
  std::vector<UpstreamUrl> encoders;
  double encode_timeout_s = 60;  // bounds each encoder call
  // What a prefill server gets of each encoded image (--prefill-images). false ("full"): the
  // image itself, which it decodes to check the items' mm_hash and can encode when a pull
  // fails (--ec-fallback-local). true ("ref"): only an ec://MM_HASH reference, as the decode
  // server always gets: no image bytes to receive, parse and decode on P's core, but a failed
  // pull fails the request (502).
  bool prefill_image_refs = false;
  // Images remembered for encoder affinity (the same image goes to the same encoder).
  size_t max_encoder_affinity_entries = 10'000;
  double request_timeout_s = 600;  // bounds a whole request, first byte to last
  int num_io_threads = 2;          // for the listening server, and as many for upstream calls
  // Sent as Authorization to prefill and decode servers when the client sent none
  // ("Bearer $OPENAI_API_KEY" like the reference proxy); "" sends nothing.
  std::string default_authorization;
  // --api-key (vLLM's): clients need `Authorization: Bearer <api_key>` on every path but
  // /health and /metrics (else 401); "" leaves the proxy open.
  std::string api_key;
  // --upstream-api-key: sent as `Authorization: Bearer <key>` to every prefill, decode and
  // encoder server (started with --api-key), instead of the client's header; "" passes the
  // client's header on (or default_authorization).
  std::string upstream_api_key;
  // How often the readiness poller retries a prefill that is not ready, and how often it
  // polls a ready one (to route around a prefill that is down, and to follow new engine ids
  // after a restart).
  int64_t poll_interval_ms = 500;
  int64_t refresh_interval_ms = 2000;
  // Bounds of what the proxy keeps in memory per request.
  uint64_t max_body_bytes = 32ull << 20;
  uint64_t max_buffered_response_bytes = 64ull << 20;
  double drain_timeout_s = 30;  // SIGTERM: how long in-flight requests may take to finish
  // --router: how prefill and decode servers are picked (docs/proxy.md, kv_router.h).
  // kv_aware: P by prefix-cache overlap (from the prefills' /v1/kv_events) against load, D by
  // fewest requests in flight.
  bool kv_aware_router = false;
  double router_overlap_weight = 1.0;           // per matched prefix block
  double router_load_weight = 1.0;              // per request in flight on that prefill
  int64_t router_poll_interval_ms = 100;        // how often each prefill's KV events are read
  size_t router_max_index_entries = 1'000'000;  // block hashes the KV index keeps at most
  int64_t router_tokenize_timeout_ms = 1000;    // the /tokenize call for a prompt's hashes
  // --discover: "etcd://HOST:PORT/CLUSTER" whose members (bootstrap/etcd_members.h) join and
  // leave the prefill and decode pools at run time (discovery.h); "" for none. Then prefills
  // and decodes may be empty.
  std::string discover_url;
  int64_t discover_interval_ms = 1000;  // how often the members are read
};

// The result of reading the command line: options, or a request for --help.
struct ParsedProxyArgs {
  ProxyOptions options;
  bool help_requested = false;
};

// Reads `crescent proxy` arguments (the words after "proxy"). InvalidArgument with a message
// for the user on anything wrong, including no --prefill or no --decode (and no --pd nor
// --discover), or
// --pd together with --prefill or --decode.
Result<ParsedProxyArgs> parse_proxy_args(const std::vector<std::string>& args);

// The --help text: flags and the request flow.
std::string proxy_help_text();

}  // namespace crescent::proxy
