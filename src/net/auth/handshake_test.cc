#include "net/auth/handshake.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <future>
#include <thread>

namespace crescent::net::auth {
namespace {

struct Pair {
  Fd client;
  Fd server;
};

Pair socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  for (int fd : fds)
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return {Fd(fds[0]), Fd(fds[1])};
}

struct Outcome {
  Status client;
  Status server;
};

// Both sides hold a token (the one-sided cases have their own tests below).
Outcome run(const std::string& client_token, const std::string& server_token) {
  Pair p = socket_pair();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_client(p.server, server_token, std::chrono::milliseconds(2000));
  });
  Status client =
      authenticate_to_server(p.client, client_token, "test server", Deadline::after_ms(3000));
  return {client, server.get()};
}

TEST(AuthHandshake, SameTokenSucceedsBothWays) {
  Outcome o = run("shared-secret-0123456789", "shared-secret-0123456789");
  EXPECT_TRUE(o.client.is_ok()) << o.client.to_string();
  EXPECT_TRUE(o.server.is_ok()) << o.server.to_string();
}

TEST(AuthHandshake, NoTokenOnEitherSideSendsNothing) {
  Pair p = socket_pair();
  EXPECT_TRUE(authenticate_client(p.server, "").is_ok());
  EXPECT_TRUE(authenticate_to_server(p.client, "", "peer", Deadline::after_ms(100)).is_ok());
  // Nothing was written by either side.
  char c;
  EXPECT_LT(::recv(p.client.get(), &c, 1, 0), 0);
  EXPECT_LT(::recv(p.server.get(), &c, 1, 0), 0);
}

TEST(AuthHandshake, WrongTokenIsRefusedOnBothSides) {
  const uint64_t before = num_refused_connections();
  Outcome o = run("token-number-one-0000", "token-number-two-0000");
  EXPECT_EQ(o.client.code(), StatusCode::kPermissionDenied) << o.client.to_string();
  EXPECT_NE(o.client.message().find("another token"), std::string::npos) << o.client.message();
  EXPECT_EQ(o.server.code(), StatusCode::kPermissionDenied) << o.server.to_string();
  EXPECT_GT(num_refused_connections(), before);
}

TEST(AuthHandshake, ClientWithoutTokenGetsAClearRefusal) {
  Pair p = socket_pair();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_client(p.server, "server-token-0123456", std::chrono::milliseconds(2000));
  });
  // A protocol client without a token sends its HELLO straight away.
  ASSERT_TRUE(write_frame(p.client, 1, "hello payload", Deadline::after_ms(1000)).is_ok());
  auto reply = read_frame(p.client, 4096, Deadline::after_ms(3000));
  ASSERT_TRUE(reply.is_ok()) << reply.status().to_string();
  Status refusal = refusal_in_reply(*reply, "prefill engine P");
  EXPECT_EQ(refusal.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(refusal.message().find("requires authentication"), std::string::npos);
  Status s = server.get();
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("did not authenticate"), std::string::npos) << s.message();
}

TEST(AuthHandshake, ServerWithoutTokenIsReportedByTheClient) {
  Pair p = socket_pair();
  // The server's protocol reads one frame, refuses it with its own error frame and closes.
  std::thread server([&] {
    auto f = read_frame(p.server, 4096, Deadline::after_ms(2000));
    EXPECT_TRUE(f.is_ok());
    (void)write_frame(p.server, 3, "expected HELLO", Deadline::after_ms(1000));
    p.server.reset();
  });
  Status client = authenticate_to_server(p.client, "client-token-0123456", "transfer peer",
                                         Deadline::after_ms(3000));
  server.join();
  EXPECT_EQ(client.code(), StatusCode::kFailedPrecondition) << client.to_string();
  EXPECT_NE(client.message().find("did not authenticate"), std::string::npos);
}

TEST(AuthHandshake, SilentPeerIsCutAfterTheTimeout) {
  Pair p = socket_pair();
  const auto start = Clock::now();
  Status s = authenticate_client(p.server, "server-token-0123456", std::chrono::milliseconds(300));
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_LT(elapsed, std::chrono::seconds(2));
}

TEST(AuthHandshake, ConnectAndCloseIsAQuietProbe) {
  Pair p = socket_pair();
  const uint64_t before = num_refused_connections();
  p.client.reset();
  Status s = authenticate_client(p.server, "server-token-0123456", std::chrono::milliseconds(2000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_EQ(num_refused_connections(), before);
}

TEST(AuthHandshake, GarbageFirstBytesAreRefused) {
  Pair p = socket_pair();
  const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(
      write_all(p.client, garbage.data(), garbage.size(), Deadline::after_ms(1000)).is_ok());
  Status s = authenticate_client(p.server, "server-token-0123456", std::chrono::milliseconds(2000));
  EXPECT_EQ(s.code(), StatusCode::kPermissionDenied) << s.to_string();
}

TEST(AuthHandshake, ReplayedProofFromAnotherConnectionFails) {
  // A recorded AUTH_PROOF is bound to the server nonce of its own connection.
  Pair p = socket_pair();
  auto server = std::async(std::launch::async, [&] {
    return authenticate_client(p.server, "server-token-0123456", std::chrono::milliseconds(2000));
  });
  ASSERT_TRUE(
      write_frame(p.client, kAuthHello, std::string(kNonceBytes, 'n'), Deadline::after_ms(1000))
          .is_ok());
  auto challenge = read_frame(p.client, kMaxAuthFrameBytes, Deadline::after_ms(2000));
  ASSERT_TRUE(challenge.is_ok());
  ASSERT_EQ(challenge->type, kAuthChallenge);
  ASSERT_TRUE(
      write_frame(p.client, kAuthProof, std::string(32, 'x'), Deadline::after_ms(1000)).is_ok());
  EXPECT_EQ(server.get().code(), StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace crescent::net::auth
