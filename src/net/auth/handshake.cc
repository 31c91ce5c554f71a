#include "net/auth/handshake.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "core/logging.h"
#include "net/auth/auth_token.h"

namespace crescent::net::auth {
namespace {

std::atomic<uint64_t> g_num_refused{0};

constexpr std::string_view kServerLabel = "crescent-v1 server";
constexpr std::string_view kClientLabel = "crescent-v1 client";

std::string proof(const std::string& token, std::string_view label, std::string_view first,
                  std::string_view second) {
  std::string message;
  message.reserve(label.size() + first.size() + second.size());
  message.append(label).append(first).append(second);
  return std::string(as_view(hmac_sha256(token, message)));
}

// After a refusal: lets the peer read it. Closing with its unread bytes (a protocol HELLO) still
// in our receive buffer would send a reset that may destroy the refusal before it is read.
void drain_briefly(const Fd& fd) {
  ::shutdown(fd.get(), SHUT_WR);
  const Deadline deadline = Deadline::after_ms(500);
  char buf[4096];
  size_t total = 0;
  while (total < (1u << 20)) {
    pollfd p{fd.get(), POLLIN, 0};
    const int ms = static_cast<int>(deadline.remaining_ms());
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0)
      return;
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n <= 0)
      return;
    total += static_cast<size_t>(n);
  }
}

constexpr std::string_view kHint =
    " (is --auth-token-file or CRESCENT_AUTH_TOKEN the same on both?)";

}  // namespace

std::string peer_address(const Fd& fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return "unknown peer";
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in = reinterpret_cast<sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
    std::string out = "[";
    out.append(text).append("]:").append(std::to_string(ntohs(in->sin6_port)));
    return out;
  }
  return "local peer";
}

Status authenticate_to_server(const Fd& fd, const std::string& token, const std::string& peer,
                              Deadline deadline) {
  if (token.empty())
    return Status::ok();
  const std::string client_nonce = random_bytes(kNonceBytes);
  Status sent = write_frame(fd, kAuthHello, client_nonce, deadline);
  if (!sent.is_ok())
    return sent.with_context("authenticating to " + peer);
  auto challenge = read_frame(fd, kMaxAuthFrameBytes, deadline);
  if (!challenge.is_ok()) {
    if (challenge.status().code() == StatusCode::kUnavailable ||
        challenge.status().code() == StatusCode::kDataLoss) {
      return failed_precondition(peer +
                                 " did not authenticate: it closed the connection or "
                                 "answered garbage to the authentication handshake" +
                                 std::string(kHint));
    }
    return challenge.status().with_context("authenticating to " + peer);
  }
  if (challenge->type == kAuthRefused)
    return permission_denied(peer + " refused our authentication: " + challenge->payload);
  if (challenge->type != kAuthChallenge) {
    return failed_precondition(
        peer + " did not authenticate: it answered frame type " + std::to_string(challenge->type) +
        " instead of a challenge; it runs without an auth token" + std::string(kHint));
  }
  if (challenge->payload.size() != 2 * kNonceBytes)
    return data_loss(peer + " sent a malformed authentication challenge");
  std::string_view server_nonce = std::string_view(challenge->payload).substr(0, kNonceBytes);
  std::string_view server_proof = std::string_view(challenge->payload).substr(kNonceBytes);
  if (!digests_equal(proof(token, kServerLabel, client_nonce, server_nonce), server_proof)) {
    (void)write_frame(fd, kAuthRefused, "your authentication proof is wrong", deadline);
    return permission_denied(peer + " failed authentication: it holds another token" +
                             std::string(kHint));
  }
  RETURN_IF_ERROR(
      write_frame(fd, kAuthProof, proof(token, kClientLabel, server_nonce, client_nonce), deadline)
          .with_context("authenticating to " + peer));
  auto verdict = read_frame(fd, kMaxAuthFrameBytes, deadline);
  if (!verdict.is_ok())
    return verdict.status().with_context("authenticating to " + peer);
  if (verdict->type == kAuthRefused)
    return permission_denied(peer + " refused our authentication: " + verdict->payload);
  if (verdict->type != kAuthOk || !verdict->payload.empty())
    return data_loss(peer + " answered the authentication proof with an unexpected frame");
  return Status::ok();
}

Status authenticate_client(const Fd& fd, const std::string& token,
                           std::chrono::milliseconds timeout) {
  if (token.empty())
    return Status::ok();
  const Deadline deadline = Deadline::after(timeout);
  auto refuse = [&](Status why, std::string_view reply) {
    g_num_refused.fetch_add(1, std::memory_order_relaxed);
    CRESCENT_LOG(kWarn) << "auth: refused the connection from " << peer_address(fd) << ": "
                        << why.message();
    if (!reply.empty())
      (void)write_frame(fd, kAuthRefused, reply, Deadline::after_ms(200));
    drain_briefly(fd);
    return why;
  };
  auto hello = read_frame(fd, kMaxAuthFrameBytes, deadline);
  if (!hello.is_ok()) {
    if (hello.status().code() == StatusCode::kDeadlineExceeded) {
      return refuse(deadline_exceeded("peer did not authenticate within " +
                                      std::to_string(timeout.count()) + " ms"),
                    "authentication timed out");
    }
    if (hello.status().code() == StatusCode::kUnavailable) {
      // Connected and closed without a byte: a liveness probe (the bootstrap's), not a refusal.
      return unavailable("peer closed the connection before authenticating");
    }
    return refuse(permission_denied("peer did not authenticate: " + hello.status().message()),
                  "authentication required");
  }
  if (hello->type != kAuthHello || hello->payload.size() != kNonceBytes) {
    return refuse(permission_denied("peer did not authenticate (first frame type " +
                                    std::to_string(hello->type) + ")"),
                  "authentication required");
  }
  const std::string& client_nonce = hello->payload;
  const std::string server_nonce = random_bytes(kNonceBytes);
  std::string challenge = server_nonce;
  challenge.append(proof(token, kServerLabel, client_nonce, server_nonce));
  RETURN_IF_ERROR(write_frame(fd, kAuthChallenge, challenge, deadline));
  auto answer = read_frame(fd, kMaxAuthFrameBytes, deadline);
  if (!answer.is_ok()) {
    return refuse(
        permission_denied("peer did not finish authentication: " + answer.status().message()),
        "authentication not finished");
  }
  if (answer->type == kAuthRefused) {
    return refuse(permission_denied("peer refused our proof (another token?): " + answer->payload),
                  "");
  }
  if (answer->type != kAuthProof ||
      !digests_equal(proof(token, kClientLabel, server_nonce, client_nonce), answer->payload)) {
    return refuse(permission_denied("peer failed authentication: wrong token"),
                  "wrong authentication proof: the tokens differ");
  }
  return write_frame(fd, kAuthOk, "", deadline);
}

Status refusal_in_reply(const Frame& reply, const std::string& peer) {
  if (reply.type != kAuthRefused)
    return Status::ok();
  return permission_denied(
      peer + " requires authentication (it answered: " + reply.payload.substr(0, 256) +
      ") and this worker has no auth token; set --auth-token-file or "
      "CRESCENT_AUTH_TOKEN");
}

uint64_t num_refused_connections() {
  return g_num_refused.load(std::memory_order_relaxed);
}

}  // namespace crescent::net::auth
