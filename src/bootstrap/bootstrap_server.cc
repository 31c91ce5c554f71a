// Routes the three endpoints onto WorkerRegistry. Handlers run on the HTTP I/O threads and
// only take the registry's mutex briefly, so they never block.

#include "bootstrap/bootstrap_server.h"

#include <string>
#include <utility>

#include "bootstrap/request_signing.h"
#include "bootstrap/wire.h"
#include "bootstrap/worker_registry.h"
#include "core/logging.h"
#include "net/http/http_server.h"
#include "net/socket.h"

namespace crescent::bootstrap {

struct BootstrapServer::Impl {
  explicit Impl(BootstrapServerOptions o)
      : options(std::move(o)), registry(registry_options()), verifier(options.auth_token) {}

  WorkerRegistryOptions registry_options() const;

  void handle(net::http::Request request, const std::shared_ptr<net::http::ResponseWriter>& w);
  void handle_register(const net::http::Request& request, net::http::ResponseWriter& w);
  void handle_query(const net::http::Request& request, net::http::ResponseWriter& w);

  BootstrapServerOptions options;
  WorkerRegistry registry;
  RequestVerifier verifier;
  std::unique_ptr<net::http::Server> http;
};

namespace {

constexpr const char* kJson = "application/json";

// True when something accepts a TCP connection at "tcp://host:port" within the timeout: a
// worker killed with -9 refuses at once; a host that is gone does not answer.
bool answers(const std::string& addr, std::chrono::milliseconds timeout) {
  auto host_port = parse_tcp_addr(addr);
  if (!host_port.is_ok()) {
    return false;
  }
  return net::connect_tcp(host_port->first, host_port->second, Deadline::after(timeout)).is_ok();
}

void send_error(net::http::ResponseWriter& w, int status, const std::string& message,
                std::string_view type, std::string_view code, net::http::Headers headers = {}) {
  w.send(status, kJson, error_json(message, type, code), std::move(headers));
}

// The one method a path answers to, or "" for an unknown path.
std::string_view method_of(std::string_view path) {
  if (path == "/register") {
    return "POST";
  }
  if (path == "/query" || path == "/health") {
    return "GET";
  }
  return "";
}

// The value of `name` in the target's query string ("/query?role=encode"); "" when absent.
// No percent-decoding: the values this server knows are plain words.
std::string query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) {
    return "";
  }
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    const size_t eq = pair.find('=');
    if (pair.substr(0, eq) == name) {
      return eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) {
      break;
    }
    rest = rest.substr(amp + 1);
  }
  return "";
}

}  // namespace

WorkerRegistryOptions BootstrapServer::Impl::registry_options() const {
  WorkerRegistryOptions o;
  o.expected_dp_ranks = options.expected_dp_ranks;
  o.max_lease_ttl_s = options.max_lease_ttl_s;
  o.is_alive = [timeout = options.probe_timeout](const std::string& addr) {
    return answers(addr, timeout);
  };
  return o;
}

void BootstrapServer::Impl::handle(net::http::Request request,
                                   const std::shared_ptr<net::http::ResponseWriter>& w) {
  std::string_view method = method_of(request.path);
  if (method.empty()) {
    send_error(*w, 404, "no such endpoint: " + request.path + " (try /register, /query, /health)",
               "not_found_error", "not_found");
    return;
  }
  if (request.method != method) {
    send_error(
        *w, 405,
        request.method + " is not allowed on " + request.path + "; use " + std::string(method),
        "invalid_request_error", "method_not_allowed", {{"Allow", std::string(method)}});
    return;
  }
  if (request.path == "/register" && !options.auth_token.empty()) {
    Status signed_ok = verifier.verify(request.method, request.target, request.body,
                                       request.header("authorization"), unix_seconds_now());
    if (!signed_ok.is_ok()) {
      CRESCENT_LOG(kWarn) << "bootstrap: refused an unauthenticated registration from "
                          << request.remote_address << ": " << signed_ok.message();
      send_error(*w, 401, signed_ok.message(), "authentication_error", "unauthorized",
                 {{"WWW-Authenticate", std::string(kSignatureScheme)}});
      return;
    }
  }
  if (request.path == "/register") {
    handle_register(request, *w);
  } else if (request.path == "/query") {
    handle_query(request, *w);
  } else {
    w->send(200, kJson, R"({"status":"ok"})");
  }
}

void BootstrapServer::Impl::handle_register(const net::http::Request& request,
                                            net::http::ResponseWriter& w) {
  auto parsed = parse_registration_json(request.body);
  if (!parsed.is_ok()) {
    CRESCENT_LOG(kWarn) << "bootstrap: refused a registration from " << request.remote_address
                        << ": " << parsed.status().message();
    send_error(w, 400, "bad registration: " + parsed.status().message(), "invalid_request_error",
               "invalid_registration");
    return;
  }
  const WorkerRegistration& r = *parsed;
  auto added = registry.add(r);
  if (!added.is_ok()) {
    const Status& s = added.status();
    CRESCENT_LOG(kWarn) << "bootstrap: refused a registration from " << request.remote_address
                        << ": " << s.message();
    if (s.code() == StatusCode::kFailedPrecondition) {
      send_error(w, 409, s.message(), "invalid_request_error", "registration_fenced");
      return;
    }
    bool conflict = s.code() == StatusCode::kAlreadyExists;
    send_error(
        w, 400, (conflict ? "conflicting registration: " : "bad registration: ") + s.message(),
        "invalid_request_error", conflict ? "registration_conflict" : "invalid_registration");
    return;
  }
  // Renewals repeat every few seconds: only new entries are worth a line.
  if (added->is_renewal) {
    // nothing to say
  } else if (r.role == kEncodeRole) {
    CRESCENT_LOG(kInfo) << "bootstrap: registered encoder '" << r.engine_id << "' at " << r.addr;
  } else {
    CRESCENT_LOG(kInfo) << "bootstrap: registered engine '" << r.engine_id << "' dp " << r.dp_rank
                        << " tp " << r.tp_rank << " pp " << r.pp_rank << " at " << r.addr
                        << " (epoch " << added->epoch << ")";
  }
  w.send(200, kJson, registered_json(*added));
}

void BootstrapServer::Impl::handle_query(const net::http::Request& request,
                                         net::http::ResponseWriter& w) {
  const std::string role = query_param(request.target, "role");
  if (role == kEncodeRole) {
    w.send(200, kJson, encoders_json(registry.encoders()));
    return;
  }
  if (!role.empty()) {
    send_error(w, 400,
               "unknown role '" + role.substr(0, 64) +
                   "' in /query (omit it for the dp ranks, or role=encode for the encoders)",
               "invalid_request_error", "invalid_role");
    return;
  }
  auto table = registry.snapshot();
  if (!table.is_ok()) {
    send_error(w, 503, table.status().message(), "service_unavailable", "not_ready",
               {{"Retry-After", "1"}});
    return;
  }
  w.send(200, kJson, query_json(*table));
}

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(BootstrapServerOptions options) {
  if (options.expected_dp_ranks < 1 || options.expected_dp_ranks > kMaxDpRanks) {
    return invalid_argument("expected_dp_ranks must be in 1.." + std::to_string(kMaxDpRanks) +
                            ", got " + std::to_string(options.expected_dp_ranks));
  }
  if (options.port < 0 || options.port > 65535) {
    return invalid_argument("bootstrap port must be in 0..65535, got " +
                            std::to_string(options.port));
  }
  if (!(options.max_lease_ttl_s > 0) || options.max_lease_ttl_s > kMaxLeaseTtlS) {
    return invalid_argument("max_lease_ttl_s (--bootstrap-lease-ttl) must be in (0, " +
                            std::to_string(static_cast<int>(kMaxLeaseTtlS)) + "] seconds");
  }
  if (options.threads < 1) {
    return invalid_argument("bootstrap threads must be at least 1, got " +
                            std::to_string(options.threads));
  }
  auto impl = std::make_unique<Impl>(options);
  net::http::ServerOptions http_options;
  http_options.host = options.host;
  http_options.port = options.port;
  http_options.num_io_threads = options.threads;
  http_options.max_body_bytes = kMaxRegisterBodyBytes;
  http_options.max_header_bytes = 16u << 10;
  http_options.read_timeout_ms = 30'000;
  Impl* raw = impl.get();
  auto http = net::http::Server::start(
      http_options,
      [raw](net::http::Request request, std::shared_ptr<net::http::ResponseWriter> writer) {
        raw->handle(std::move(request), writer);
      });
  if (!http.is_ok()) {
    return http.status().with_context("bootstrap server on " + options.host + ":" +
                                      std::to_string(options.port));
  }
  impl->http = std::move(http).value();
  return std::unique_ptr<BootstrapServer>(new BootstrapServer(std::move(impl)));
}

BootstrapServer::BootstrapServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BootstrapServer::~BootstrapServer() {
  stop();
}

int BootstrapServer::port() const {
  return impl_->http->port();
}

std::string BootstrapServer::url() const {
  const std::string& host = impl_->options.host;
  bool is_v6 = host.find(':') != std::string::npos;
  return "http://" + (is_v6 ? "[" + host + "]" : host) + ":" + std::to_string(port());
}

void BootstrapServer::stop() {
  impl_->http->stop();
}

}  // namespace crescent::bootstrap
