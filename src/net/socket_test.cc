#include "net/socket.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "core/ids.h"
#include "net/frame.h"

namespace crescent::net {
namespace {

struct Pair {
  Fd client;
  Fd server;
};

Pair tcp_pair() {
  auto listener = listen_tcp("127.0.0.1", 0);
  EXPECT_TRUE(listener.is_ok()) << listener.status().to_string();
  int port = local_port(*listener).value();
  auto client = connect_tcp("127.0.0.1", port, Deadline::after_ms(2000));
  EXPECT_TRUE(client.is_ok()) << client.status().to_string();
  auto server = accept_with_deadline(*listener, Deadline::after_ms(2000));
  EXPECT_TRUE(server.is_ok());
  return {std::move(*client), std::move(*server)};
}

TEST(SocketTest, FrameRoundTripAndLargePayload) {
  Pair p = tcp_pair();
  std::string big(8 << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4096)
    big[i] = static_cast<char>(i >> 12);
  std::thread writer(
      [&] { ASSERT_TRUE(write_frame(p.client, 7, big, Deadline::after_ms(5000)).is_ok()); });
  auto f = read_frame(p.server, 16 << 20, Deadline::after_ms(5000));
  writer.join();
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->type, 7);
  EXPECT_EQ(f->payload, big);
}

TEST(SocketTest, RefusesGarbageAndOversizedHeaders) {
  Pair p = tcp_pair();
  std::string garbage(16, '\x5a');
  ASSERT_TRUE(
      write_all(p.client, garbage.data(), garbage.size(), Deadline::after_ms(1000)).is_ok());
  auto bad = read_frame(p.server, 1024, Deadline::after_ms(1000));
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);

  uint8_t header[kFrameHeaderBytes];
  encode_frame_header({1, uint64_t{1} << 40}, header);
  ASSERT_TRUE(write_all(p.client, header, sizeof(header), Deadline::after_ms(1000)).is_ok());
  auto big = read_frame(p.server, 1024, Deadline::after_ms(1000));
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
}

TEST(SocketTest, ReadTimesOutAndSeesClose) {
  Pair p = tcp_pair();
  char c;
  auto t0 = Clock::now();
  EXPECT_EQ(read_exact(p.server, &c, 1, Deadline::after_ms(50)).code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(50));
  p.client.reset();
  EXPECT_EQ(read_exact(p.server, &c, 1, Deadline::after_ms(1000)).code(), StatusCode::kUnavailable);
}

TEST(SocketTest, BindsOnlyTheGivenAddressAndRejectsNames) {
  EXPECT_EQ(listen_tcp("localhost", 0).status().code(), StatusCode::kInvalidArgument);
  auto l = listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(l.is_ok());
  std::string host;
  int port = 0;
  EXPECT_TRUE(parse_host_port("127.0.0.1:8998", &host, &port).is_ok());
  EXPECT_EQ(port, 8998);
  EXPECT_FALSE(parse_host_port("127.0.0.1:0", &host, &port).is_ok());
  EXPECT_FALSE(parse_host_port("nohost", &host, &port).is_ok());
}

TEST(SocketTest, PassesDescriptorsOverUnixSockets) {
  std::string name = "crescent-net-test-" + random_uuid();
  auto listener = listen_unix_abstract(name);
  ASSERT_TRUE(listener.is_ok()) << listener.status().to_string();
  auto client = connect_unix_abstract(name, Deadline::after_ms(1000));
  ASSERT_TRUE(client.is_ok());
  auto server = accept_with_deadline(*listener, Deadline::after_ms(1000));
  ASSERT_TRUE(server.is_ok());

  int memfd = ::memfd_create("net-test", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  Fd owned(memfd);
  ASSERT_EQ(::write(memfd, "hello", 5), 5);
  int fds[1] = {memfd};
  ASSERT_TRUE(write_with_fds(*client, "abc", 3, fds, Deadline::after_ms(1000)).is_ok());
  char buf[3];
  std::vector<Fd> got;
  ASSERT_TRUE(read_exact(*server, buf, 3, Deadline::after_ms(1000), &got).is_ok());
  ASSERT_EQ(got.size(), 1u);
  char text[5];
  ASSERT_EQ(::pread(got[0].get(), text, 5, 0), 5);
  EXPECT_EQ(std::string(text, 5), "hello");
}

TEST(SocketTest, ByteReaderFlagsTruncation) {
  ByteWriter w;
  w.u32(5);
  w.bytes("abc");
  std::string s = w.take();
  ByteReader r(s);
  EXPECT_EQ(r.u32(), 5u);
  EXPECT_EQ(r.bytes(10), "abc");
  EXPECT_TRUE(r.finish("msg").is_ok());
  ByteReader short_reader(std::string_view(s).substr(0, 6));
  short_reader.u32();
  short_reader.bytes(10);
  EXPECT_EQ(short_reader.finish("msg").code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace crescent::net
