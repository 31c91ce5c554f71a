#include "proxy/proxy_options.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "bootstrap/etcd_client.h"
#include "bootstrap/etcd_registry.h"
#include "net/http/api_key.h"

namespace crescent::proxy {
namespace {

std::string bracket_host(const std::string& host) {
  return host.find(':') == std::string::npos ? host : "[" + host + "]";
}

// "8000" -> 8000 when it is a whole number in [min_port, 65535].
Result<int> parse_port(std::string_view text, int min_port, std::string_view what) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < min_port ||
      value > 65535) {
    return invalid_argument(std::string(what) + " must be a port number in [" +
                            std::to_string(min_port) + ", 65535], got '" + std::string(text) + "'");
  }
  return value;
}

bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '.' || c == '_';
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) {
    return false;
  }
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) {
      return false;
    }
  }
  return true;
}

Result<double> parse_seconds(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0) {
    return invalid_argument(flag + " expects a positive number of seconds, got '" + text + "'");
  }
  return v;
}

}  // namespace

std::string UpstreamUrl::host_port() const {
  return bracket_host(host) + ":" + std::to_string(port);
}

std::string PrefillSpec::bootstrap_addr() const {
  if (!etcd_url.empty()) {
    return etcd_url;
  }
  return "http://" + bracket_host(server.host) + ":" + std::to_string(bootstrap_port);
}

Result<UpstreamUrl> parse_upstream_url(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return invalid_argument("bad URL '" + std::string(url) + "': " + why +
                            " (expected http://HOST:PORT)");
  };
  if (starts_with_ci(url, "https://")) {
    return bad("https is not supported; prefill and decode servers are reached over plain http");
  }
  if (!starts_with_ci(url, "http://")) {
    return bad("it must start with http://");
  }
  std::string_view rest = url.substr(7);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos && rest.substr(slash) != "/") {
    return bad("a path is not supported");
  }
  UpstreamUrl out;
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      return bad("'[' without ']'");
    }
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        return bad("unexpected text after ']'");
      }
      port_text = after.substr(1);
      if (port_text.empty()) {
        return bad("empty port");
      }
    }
    if (out.host.empty() || !std::all_of(out.host.begin(), out.host.end(), [](char c) {
          return std::isxdigit(static_cast<unsigned char>(c)) != 0 || c == ':' || c == '.';
        })) {
      return bad("not an IPv6 address in brackets");
    }
  } else {
    size_t colon = authority.find(':');
    if (colon != std::string_view::npos &&
        authority.find(':', colon + 1) != std::string_view::npos) {
      return bad("an IPv6 address needs brackets, as in http://[::1]:8000");
    }
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) {
        return bad("empty port");
      }
    }
    if (out.host.empty()) {
      return bad("no host");
    }
    if (!std::all_of(out.host.begin(), out.host.end(), is_host_char)) {
      return bad("the host has characters a host name cannot have");
    }
  }
  if (!port_text.empty()) {
    auto port = parse_port(port_text, 1, "the URL's port");
    if (!port.is_ok()) {
      return bad(port.status().message());
    }
    out.port = *port;
  }
  // Keep the user's spelling (e.g. no explicit :80) for messages, minus a trailing '/'.
  std::string as_given(url);
  if (!as_given.empty() && as_given.back() == '/') {
    as_given.pop_back();
  }
  out.url = as_given;
  return out;
}

Result<ParsedProxyArgs> parse_proxy_args(const std::vector<std::string>& args) {
  ParsedProxyArgs parsed;
  ProxyOptions& o = parsed.options;
  std::string router_tuning_flag;  // the last --router-* flag seen
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      parsed.help_requested = true;
      return parsed;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      return invalid_argument("unexpected argument '" + a + "' (see --help)");
    }
    std::string name = a.substr(2);
    std::string value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    static const char* const kKnown[] = {"host",
                                         "port",
                                         "prefill",
                                         "decode",
                                         "pd",
                                         "encode",
                                         "encode-timeout-s",
                                         "request-timeout",
                                         "io-threads",
                                         "drain-timeout",
                                         "prefill-images",
                                         "api-key",
                                         "upstream-api-key",
                                         "router",
                                         "router-overlap-weight",
                                         "router-load-weight",
                                         "router-poll-interval-ms",
                                         "router-max-index-entries",
                                         "discover"};
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return name == k; }) == std::end(kKnown)) {
      return invalid_argument("unknown flag --" + name + " (see --help)");
    }
    if (!has_inline_value) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        return invalid_argument("--" + name + " needs a value");
      }
      value = args[++i];
    }
    if (name.starts_with("router-")) {
      router_tuning_flag = "--" + name;
    }
    if (name == "discover") {
      if (!bootstrap::is_etcd_url(value)) {
        return invalid_argument("--discover expects etcd://HOST:PORT[/CLUSTER], got '" + value +
                                "'");
      }
      if (auto url = bootstrap::parse_etcd_url(value); !url.is_ok()) {
        return invalid_argument("--discover: " + url.status().message());
      }
      o.discover_url = value;
      continue;
    }
    if (name == "host") {
      if (value.empty()) {
        return invalid_argument("--host needs an address");
      }
      o.host = value;
    } else if (name == "port") {
      ASSIGN_OR_RETURN(o.port, parse_port(value, 0, "--port"));
    } else if (name == "prefill") {
      PrefillSpec spec;
      ASSIGN_OR_RETURN(spec.server, parse_upstream_url(value));
      // An optional second word: the bootstrap port, or 'none' for the default.
      if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        std::string port_text = args[++i];
        std::string lowered = port_text;
        std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (lowered.rfind("etcd://", 0) == 0) {
          if (Status s = bootstrap::check_bootstrap_url(port_text); !s.is_ok()) {
            return invalid_argument("--prefill " + value + ": " + s.message());
          }
          spec.etcd_url = port_text;
          while (spec.etcd_url.back() == '/') {
            spec.etcd_url.pop_back();
          }
        } else if (lowered != "none") {
          auto port = parse_port(port_text, 1, "the bootstrap port of --prefill " + value);
          if (!port.is_ok()) {
            return invalid_argument(port.status().message() +
                                    " (a port number, 'none' or etcd://HOST:PORT/PREFIX)");
          }
          spec.bootstrap_port = *port;
        }
      }
      o.prefills.push_back(std::move(spec));
    } else if (name == "decode") {
      ASSIGN_OR_RETURN(auto url, parse_upstream_url(value));
      o.decodes.push_back(std::move(url));
    } else if (name == "pd") {
      ASSIGN_OR_RETURN(auto url, parse_upstream_url(value));
      o.pds.push_back(std::move(url));
    } else if (name == "encode") {
      ASSIGN_OR_RETURN(auto url, parse_upstream_url(value));
      o.encoders.push_back(std::move(url));
    } else if (name == "encode-timeout-s") {
      ASSIGN_OR_RETURN(o.encode_timeout_s, parse_seconds("--encode-timeout-s", value));
    } else if (name == "prefill-images") {
      if (value != "full" && value != "ref") {
        return invalid_argument("--prefill-images expects 'full' or 'ref', got '" + value + "'");
      }
      o.prefill_image_refs = value == "ref";
    } else if (name == "api-key" || name == "upstream-api-key") {
      // The key itself never goes into a message.
      if (Status s = net::http::ApiKeyCheck::make(value).status(); !s.is_ok()) {
        return invalid_argument("--" + name + ": " + s.message());
      }
      (name == "api-key" ? o.api_key : o.upstream_api_key) = value;
    } else if (name == "request-timeout") {
      ASSIGN_OR_RETURN(o.request_timeout_s, parse_seconds("--request-timeout", value));
    } else if (name == "drain-timeout") {
      ASSIGN_OR_RETURN(o.drain_timeout_s, parse_seconds("--drain-timeout", value));
    } else if (name == "router") {
      if (value != "round_robin" && value != "kv_aware") {
        return invalid_argument("--router expects 'round_robin' or 'kv_aware', got '" + value +
                                "'");
      }
      o.kv_aware_router = value == "kv_aware";
    } else if (name == "router-overlap-weight" || name == "router-load-weight") {
      char* end = nullptr;
      double w = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(w) || w < 0) {
        return invalid_argument("--" + name + " expects a number >= 0, got '" + value + "'");
      }
      (name == "router-overlap-weight" ? o.router_overlap_weight : o.router_load_weight) = w;
    } else if (name == "router-poll-interval-ms" || name == "router-max-index-entries") {
      int64_t n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || n < 1 ||
          n > 1'000'000'000) {
        return invalid_argument("--" + name + " expects a whole number in [1, 1e9], got '" + value +
                                "'");
      }
      if (name == "router-poll-interval-ms") {
        o.router_poll_interval_ms = n;
      } else {
        o.router_max_index_entries = static_cast<size_t>(n);
      }
    } else if (name == "io-threads") {
      int n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc() || ptr != value.data() + value.size() || n < 1 ||
          n > 256) {
        return invalid_argument("--io-threads expects a whole number in [1, 256], got '" + value +
                                "'");
      }
      o.num_io_threads = n;
    }
  }
  if (!router_tuning_flag.empty() && !o.kv_aware_router) {
    return invalid_argument(router_tuning_flag + " tunes --router kv_aware; add --router kv_aware");
  }
  if (!o.pds.empty()) {
    if (o.kv_aware_router) {
      return invalid_argument(
          "--router kv_aware routes prefill servers by their KV events; it does not apply to "
          "--pd servers");
    }
    if (!o.prefills.empty() || !o.decodes.empty()) {
      return invalid_argument(
          "--pd (colocated prefill+decode servers) cannot be combined with --prefill or "
          "--decode");
    }
    if (!o.discover_url.empty()) {
      return invalid_argument(
          "--discover finds prefill and decode servers; it cannot be combined with --pd");
    }
    return parsed;
  }
  if (!o.discover_url.empty()) {
    if (o.kv_aware_router) {
      return invalid_argument(
          "--router kv_aware needs a fixed set of --prefill servers; it cannot be combined with "
          "--discover");
    }
    return parsed;  // --prefill and --decode may add static servers, or be left out
  }
  if (o.prefills.empty()) {
    return invalid_argument(
        "at least one --prefill URL [BOOTSTRAP_PORT] is required (or --pd URL for "
        "colocated prefill+decode servers)");
  }
  if (o.decodes.empty()) {
    return invalid_argument("at least one --decode URL is required");
  }
  if (o.kv_aware_router && o.prefills.size() > 64) {
    return invalid_argument("--router kv_aware handles at most 64 --prefill servers");
  }
  return parsed;
}

std::string proxy_help_text() {
  return R"(usage: crescent proxy [--host 127.0.0.1] [--port 8000]
                      [--encode URL ...] [--encode-timeout-s S] [--prefill-images full|ref]
                      --prefill URL [BOOTSTRAP_PORT|none] [--prefill ...]
                      --decode URL [--decode ...]
                      [--request-timeout S] [--io-threads N] [--drain-timeout S]
                      [--api-key KEY] [--upstream-api-key KEY]
                      [--router round_robin|kv_aware] [--router-overlap-weight W]
                      [--router-load-weight W] [--router-poll-interval-ms MS]
                      [--router-max-index-entries N]
       crescent proxy --discover etcd://HOST:PORT/CLUSTER [--prefill ...] [--decode ...] [...]
       crescent proxy [--encode URL ...] --pd URL [--pd ...] [...]

An OpenAI-compatible router for disaggregated serving: each request is prefilled on one
prefill server and decoded (and streamed back) by one decode server.

Flow of one POST /v1/completions or /v1/chat/completions:
  1. request_id = the client's X-Request-Id (or a new uuid), transfer_id = "xfer-" + request_id.
  2. The next (prefill, dp rank) pair and the next decode server are picked round-robin, over
     the servers that are up: a decode (or --pd) server that a call could not reach (refused,
     reset, connect timeout) leaves the rotation until a GET /health probe (after 0.25 s,
     doubling up to 8 s) answers 200. With no decode server up the answer is 503 at once and
     no prefill server is asked.
  3. Both are sent AT ONCE:
     - prefill: the body with max_tokens=1, stream=false, no stream_options and
       kv_transfer_params {do_remote_decode: true, do_remote_prefill: false, transfer_id};
       headers X-Request-Id, X-data-parallel-rank, Authorization. Its answer is discarded.
     - decode: the client's body with kv_transfer_params {do_remote_decode: false,
       do_remote_prefill: true, remote_bootstrap_addr: http://PREFILL_HOST:BOOTSTRAP_PORT,
       remote_engine_id: the dp rank's engine id, transfer_id}. Its answer (status, content
       type, body) goes to the client as it arrives.
  4. A decode failure before its answer closes the prefill request (the prefill server aborts
     it and holds no KV for it). A prefill failure before the decode server produced anything
     aborts the decode request and answers the client with an error naming the prefill; a
     failure after streaming began ends the stream with one `data: {"error": ...}` event and
     `data: [DONE]`. A client that goes away closes both upstream connections, which makes the
     servers abort.

Images (EPD), with --encode: a /v1/chat/completions request whose messages hold image parts
({"type": "image_url", "image_url": {"url": ...}} or "image_url": "...") first sends each image
alone to an encoder ({"model", "messages": [one user message with that part], "max_tokens": 1,
"stream": false}), all at once. Their answers' ec_transfer_params.items are merged in image
order into "ec_transfer_params": {"items": [...]}, which the prefill (or --pd) server pulls
(D gets them too, for each image's mm_hash and grid, with each image's URL replaced by
"ec://MM_HASH": no pixels); then the flow above runs. An image seen before goes to the encoder
that had it (an LRU of 10000 image URL hashes); new ones go round-robin. An encoder's 4xx reaches the client
unchanged; its 503 is 503, anything else failing 502 naming the encoder; P/D never start.
Requests without images, and every request without --encode, never touch an encoder.

Readiness: the proxy polls each prefill's /health, then its bootstrap server's /query (every
0.5 s) to learn its dp ranks and engine ids. Until every prefill is ready, /health and the
completion endpoints answer 503; /health also answers 503 while no decode server is up. /v1/models is forwarded to a decode server; /metrics is
Prometheus text.

Discovery, with --discover etcd://HOST:PORT/CLUSTER: the proxy reads CLUSTER/members/ in etcd
every second, where `crescent serve --cluster ... --advertise-url ...` workers publish
themselves under a lease; prefill and decode members join the rotation (next to any --prefill
and --decode given) and leave it as soon as their key is gone (the worker stopped, or died and
its lease expired). With etcd unreachable the last known set stays; /metrics has
crescent_proxy_discovered_members and crescent_proxy_discovery_up. Not with --pd or --router
kv_aware.

flags:
  --discover URL         etcd://HOST:PORT/CLUSTER: follow the cluster's prefill and decode
                         members (see Discovery); --prefill and --decode become optional
  --host ADDR            address to listen on (default 127.0.0.1)
  --port N               port to listen on; 0 picks a free one, printed at start (default 8000)
  --prefill URL [PORT]   a prefill server (http://HOST:PORT) and the port of its bootstrap
                         server (default 8998; 'none' means the default), or the
                         etcd://HOST:PORT/PREFIX it registers in (its serve
                         --bootstrap-addr; docs/bootstrap.md). Repeatable.
  --decode URL           a decode server (http://HOST:PORT). Repeatable.
  --pd URL               instead of --prefill/--decode: a `crescent serve --role both` server
                         that prefills and decodes; gets the client's body (plus the encoders'
                         ec_transfer_params) without kv_transfer_params. Repeatable (1E1PD).
  --encode URL           an encoder server (`crescent serve --role encode`). Repeatable.
  --encode-timeout-s S   bounds each encoder call (default 60)
  --prefill-images full|ref
                         what the prefill server gets of each encoded image: 'full' (default)
                         the image itself, which it decodes to check the items' mm_hash and
                         encodes itself if the pull fails; 'ref' only "ec://MM_HASH", as D:
                         nothing to receive or decode, but a failed pull fails the request
  --request-timeout S    bounds each whole request, first byte to last (default 600)
  --io-threads N         I/O threads for clients, and as many for upstream calls (default 2)
  --drain-timeout S      on SIGTERM/SIGINT, how long in-flight requests may finish (default 30)
  --api-key KEY          clients must send 'Authorization: Bearer KEY' (compared in constant
                         time; else 401) on every path but /health and /metrics, which stay
                         open for health checks and scrapes. Default: $CRESCENT_API_KEY if
                         set, else no key (vLLM's --api-key / VLLM_API_KEY)
  --upstream-api-key KEY sent as 'Authorization: Bearer KEY' to every prefill, decode and
                         encoder server (those started with `crescent serve --api-key KEY`),
                         in place of the client's header. Default: $CRESCENT_UPSTREAM_API_KEY
  --router round_robin|kv_aware
                         how P and D are picked (default round_robin, as in the flow above).
                         kv_aware: each prefill's GET /v1/kv_events is read every
                         --router-poll-interval-ms into an index of which prefill holds which
                         prefix-cache block; a request's block hashes come from one prefill's
                         POST /tokenize (return_block_hashes), each prefill that is up scores
                         OVERLAP_W * matched prefix blocks - LOAD_W * its requests in flight,
                         the highest wins (ties round-robin); D is the one with the fewest
                         requests in flight. A prefill that goes down or restarts leaves the
                         index at once. Not with --pd
  --router-overlap-weight W  score per matched prefix block (default 1)
  --router-load-weight W     score taken per request in flight on a prefill (default 1)
  --router-poll-interval-ms MS  how often each prefill's KV events are read (default 100)
  --router-max-index-entries N  block hashes the index keeps; the oldest go first
                         (default 1000000)

Authorization upstream: with --upstream-api-key, that key; otherwise the client's header is
passed on, and without one OPENAI_API_KEY (if set) is sent as "Bearer $OPENAI_API_KEY", as the
reference proxy does. A key on the command line shows in `ps`: prefer the environment variables.
The bootstrap servers' /query, which the proxy polls, has no authentication (docs/deployment.md).

examples:
  crescent proxy --port 8000 --prefill http://10.0.0.1:8010 8998 --decode http://10.0.0.2:8020
  crescent proxy --port 8000 --encode http://10.0.0.3:8030 --prefill http://10.0.0.1:8010 8998 \
                 --decode http://10.0.0.2:8020                               # 1E1P1D
  crescent proxy --port 8000 --encode http://10.0.0.3:8030 --pd http://10.0.0.1:8000   # 1E1PD
)";
}

}  // namespace crescent::proxy
