#pragma once
// Mutual challenge-response over the shared token, run on a freshly connected framed socket
// (net/frame.h) before the protocol's own HELLO, by the transfer, KV control and EC control
// connections alike. No token or token-derived value that could be replayed crosses the wire:
//
//   client -> server  AUTH_HELLO      client_nonce[32]
//   server -> client  AUTH_CHALLENGE  server_nonce[32] || HMAC(token, "crescent-v1 server" ||
//                                                             client_nonce || server_nonce)
//   client -> server  AUTH_PROOF      HMAC(token, "crescent-v1 client" || server_nonce ||
//                                          client_nonce)
//   server -> client  AUTH_OK (empty) or AUTH_REFUSED (a reason)
//
// The client speaks first so that a client with a token and a server without one fail at once
// (the server's protocol refuses the unknown frame) instead of both waiting for each other; the
// client checks the server's proof before it proves anything itself. With no token on either
// side nothing is exchanged: the protocols run byte for byte as they always did. A server with a
// token answers any other first frame with AUTH_REFUSED, which protocol clients report through
// refusal_in_reply(). Thread-safety: stateless; one call per connection.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "net/frame.h"
#include "net/socket.h"

namespace crescent::net::auth {

// Frame types, chosen outside the ranges of every crescent protocol sharing the frame header.
inline constexpr uint16_t kAuthHello = 0xA001;
inline constexpr uint16_t kAuthChallenge = 0xA002;
inline constexpr uint16_t kAuthProof = 0xA003;
inline constexpr uint16_t kAuthOk = 0xA004;
inline constexpr uint16_t kAuthRefused = 0xA005;
inline constexpr size_t kNonceBytes = 32;
inline constexpr uint64_t kMaxAuthFrameBytes = 1024;
// How long a server waits for a connecting peer to finish the handshake.
inline constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{5000};

// Client side. Empty token: returns OK without touching the socket. Otherwise
// PermissionDenied naming `peer` when the server refuses us or fails its own proof, and
// FailedPrecondition when the server does not authenticate at all.
Status authenticate_to_server(const Fd& fd, const std::string& token, const std::string& peer,
                              Deadline deadline);

// Server side. Empty token: returns OK without touching the socket. Otherwise reads the
// client's first frame; anything but a correct handshake within `timeout` is refused
// (AUTH_REFUSED sent when the socket still takes it), counted, logged with the peer's address,
// and returned as PermissionDenied / DeadlineExceeded; a peer that closes before sending a byte
// (a liveness probe) is Unavailable, neither logged nor counted. The caller closes the
// connection.
Status authenticate_client(const Fd& fd, const std::string& token,
                           std::chrono::milliseconds timeout = kDefaultHandshakeTimeout);

// For protocol clients without a token: the status to report when the first reply to their
// HELLO is the server's AUTH_REFUSED ("peer requires authentication"); OK for any other frame.
Status refusal_in_reply(const Frame& reply, const std::string& peer);

// Connections refused by authenticate_client() in this process, for /metrics.
uint64_t num_refused_connections();

// "ip:port" of the connected peer, or "unknown peer" (unix sockets, closed sockets).
std::string peer_address(const Fd& fd);

}  // namespace crescent::net::auth
