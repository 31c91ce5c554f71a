// The connector's failure paths: every wait has a deadline, failures are reported with a clear
// status and only once no peer can write into the blocks, and bad peers (garbage, silence,
// incompatible) never take the connector down.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "disagg/connector_test_util.h"
#include "disagg/protocol.h"
#include "net/frame.h"
#include "net/socket.h"

namespace crescent::disagg {
namespace {

using namespace std::chrono_literals;
using engine::KvConnectorEvent;
using protocol::MessageType;
using testing::FakeBootstrap;
using testing::FakeEngine;
using testing::SideOptions;
using Ms = std::chrono::milliseconds;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class ConnectorFailureTest : public ::testing::Test {
 protected:
  void start(SideOptions p = {}, SideOptions d = {}) {
    prefill_ = FakeEngine::create("prefill-0", nullptr, p);
    ASSERT_NE(prefill_, nullptr);
    decode_ = FakeEngine::create("decode-0", &bootstrap_, d);
    ASSERT_NE(decode_, nullptr);
    bootstrap_.set("prefill-0", prefill_->conn().worker_addr());
    for (int b = 0; b < prefill_->num_blocks(); ++b) {
      prefill_->fill_pattern(b, 3);
    }
  }
  void ask(const std::string& request_id, const std::string& transfer_id,
           std::vector<int32_t> blocks = {1, 2}, int prompt_len = 20,
           const std::string& engine_id = "prefill-0", int num_local_tokens = 0) {
    decode_->conn().start_remote_prefill(request_id, testing::decode_params(transfer_id, engine_id),
                                         testing::make_prompt(prompt_len), blocks,
                                         num_local_tokens);
  }
  bool hold(const std::string& request_id, const std::string& transfer_id,
            std::vector<int32_t> blocks = {3, 4}, int prompt_len = 20) {
    return prefill_->conn().hold_for_remote_decode(request_id, testing::prefill_params(transfer_id),
                                                   testing::make_prompt(prompt_len), blocks);
  }
  bool prefill_in_flight(int64_t n) {
    return testing::eventually(
        [&] { return prefill_->conn().metrics().prefill.num_in_flight == n; });
  }
  bool decode_untouched() {
    for (int b = 0; b < decode_->num_blocks(); ++b) {
      if (!decode_->block_is(b, testing::kUntouched))
        return false;
    }
    return true;
  }

  FakeBootstrap bootstrap_;
  std::unique_ptr<FakeEngine> prefill_;
  std::unique_ptr<FakeEngine> decode_;
};

TEST_F(ConnectorFailureTest, NotNeededBeforeHoldMakesHoldReturnFalse) {
  start();
  // 33 tokens: 2 blocks to send, both held locally.
  ask("d1", "T1", {1, 2, 3}, 33, "prefill-0", 2 * testing::kBlockSize);
  EXPECT_EQ(decode_->conn().num_pending(), 0);
  ASSERT_TRUE(
      testing::eventually([&] { return prefill_->conn().metrics().prefill.num_not_needed == 1; }));
  EXPECT_FALSE(hold("p1", "T1", {3, 4, 5}, 33));
  EXPECT_EQ(prefill_->conn().num_pending(), 0);
  EXPECT_TRUE(decode_->no_event_within("d1", 200ms));
  EXPECT_EQ(decode_->conn().metrics().decode.num_not_needed, 1u);
}

TEST_F(ConnectorFailureTest, NotNeededAfterHoldReleasesTheBlocks) {
  start();
  ASSERT_TRUE(hold("p1", "T1", {3, 4, 5}, 33));
  ask("d1", "T1", {1, 2, 3}, 33, "prefill-0", 2 * testing::kBlockSize);
  auto ev = prefill_->wait_event("p1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, KvConnectorEvent::Kind::kBlocksReleased);
  EXPECT_TRUE(decode_->no_event_within("d1", 200ms));
  EXPECT_TRUE(decode_untouched());
}

TEST_F(ConnectorFailureTest, PrefillRequestNeverArrivesFailsTheDecodeWithinTheDeadline) {
  SideOptions p, d;
  p.transfer_timeout = 1000ms;  // the prefill placeholder expires first
  d.transfer_timeout = 4000ms;
  start(p, d);
  auto t0 = std::chrono::steady_clock::now();
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 900ms);
  EXPECT_LT(elapsed, 2500ms);
  EXPECT_EQ(ev->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(contains(ev->status.message(), "prefill request for transfer_id T1 never arrived"))
      << ev->status.message();
  EXPECT_EQ(prefill_->conn().metrics().prefill.num_expired, 1u);
  EXPECT_EQ(decode_->conn().metrics().decode.num_expired, 1u);
}

TEST_F(ConnectorFailureTest, DecodeTimeoutCancelsAndReportsAfterTheAck) {
  SideOptions p, d;
  p.transfer_timeout = 5000ms;
  d.transfer_timeout = 1000ms;  // the decode side gives up first
  start(p, d);
  auto t0 = std::chrono::steady_clock::now();
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2500ms);
  EXPECT_EQ(ev->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(contains(ev->status.message(), "transfer T1 timed out after 1 s"))
      << ev->status.message();
  // The CANCEL turned the placeholder into a tombstone: a late prefill request is not held
  // (its blocks are freed at once), nobody asks, nothing is written.
  ASSERT_TRUE(prefill_in_flight(0));
  EXPECT_EQ(prefill_->conn().metrics().prefill.num_cancelled, 1u);
  EXPECT_FALSE(hold("p1", "T1"));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(decode_untouched());
}

TEST_F(ConnectorFailureTest, FailedPrefillRequestAnswersTheAskAtOnce) {
  SideOptions p;
  p.transfer_timeout = 5000ms;
  start(p);
  // ASK first, then the prefill request fails.
  ask("d1", "T1");
  ASSERT_TRUE(prefill_in_flight(1));
  auto t0 = std::chrono::steady_clock::now();
  prefill_->conn().fail_remote_decode("p1", testing::prefill_params("T1"),
                                      cancelled("request p1 aborted"));
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
  EXPECT_EQ(ev->status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(contains(ev->status.message(),
                       "prefill engine prefill-0: prefill request for transfer_id T1 failed: "
                       "request p1 aborted"))
      << ev->status.message();
  // The failure first, then the ASK.
  prefill_->conn().fail_remote_decode("p2", testing::prefill_params("T2"),
                                      internal_error("out of blocks"));
  ask("d2", "T2");
  ev = decode_->wait_event("d2", 1s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(contains(ev->status.message(), "T2 failed: out of blocks")) << ev->status.message();
  EXPECT_EQ(prefill_->conn().metrics().prefill.num_in_flight, 0);
  EXPECT_TRUE(decode_untouched());
}

TEST_F(ConnectorFailureTest, DecodeNeverAsksReleasesWithinTheDeadline) {
  SideOptions p;
  p.transfer_timeout = 1000ms;
  start(p);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(hold("p1", "T1"));
  auto ev = prefill_->wait_event("p1", 5s);
  ASSERT_TRUE(ev.has_value());
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 900ms);
  EXPECT_LT(elapsed, 2000ms);
  EXPECT_EQ(ev->kind, KvConnectorEvent::Kind::kBlocksReleased);
  auto m = prefill_->conn().metrics();
  EXPECT_EQ(m.prefill.num_expired, 1u);
  EXPECT_EQ(m.prefill.num_in_flight, 0);
}

TEST_F(ConnectorFailureTest, CancelBeforeTheWriteIsAckedAndNothingIsWritten) {
  start();
  ask("d1", "T1");
  ASSERT_TRUE(prefill_in_flight(1));
  decode_->conn().cancel("d1");
  EXPECT_EQ(decode_->conn().num_pending(), 1) << "reported only after the ack";
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kCancelled);
  ASSERT_TRUE(prefill_in_flight(0));
  EXPECT_FALSE(hold("p1", "T1"));  // too late: refused by the tombstone, nothing held
  EXPECT_TRUE(hold("p2", "T1")) << "the tombstone answers one late request only";
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(decode_untouched());
  decode_->conn().cancel("unknown-request");  // ignored
}

TEST_F(ConnectorFailureTest, DecodeShutdownReleasesThePrefillSide) {
  SideOptions p;
  p.transfer_timeout = 5000ms;
  start(p);
  ask("d1", "T1");
  ASSERT_TRUE(prefill_in_flight(1));
  auto t0 = std::chrono::steady_clock::now();
  decode_->shutdown();
  auto ev = decode_->wait_event("d1", 1s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_FALSE(ev->status.is_ok());
  ASSERT_TRUE(prefill_in_flight(0));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  EXPECT_EQ(prefill_->conn().metrics().prefill.num_peer_lost, 1u);
  // The ASK left a tombstone: P's late request for T1 is not held (freed at once).
  EXPECT_FALSE(hold("p1", "T1"));
  // A fetch after shutdown fails at once.
  ask("d2", "T2");
  ev = decode_->wait_event("d2", 1s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable);
  decode_->shutdown();  // idempotent
}

TEST_F(ConnectorFailureTest, HeldBlocksAreReleasedWhenThePrefillSideShutsDown) {
  start();
  ASSERT_TRUE(hold("p1", "T1"));
  prefill_->shutdown();
  auto ev = prefill_->wait_event("p1", 1s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, KvConnectorEvent::Kind::kBlocksReleased);
  EXPECT_FALSE(hold("p2", "T2"));
}

TEST_F(ConnectorFailureTest, DuplicateTransferIdOnTheDecodeSideFailsTheSecond) {
  start();
  ask("d1", "T1");
  ask("d2", "T1", {5, 6});
  auto dup = decode_->wait_event("d2", 1s);
  ASSERT_TRUE(dup.has_value());
  EXPECT_EQ(dup->status.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(contains(dup->status.message(), "duplicate transfer_id T1"));
  ASSERT_TRUE(hold("p1", "T1"));
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  EXPECT_EQ(0, std::memcmp(decode_->block(1), prefill_->block(3), decode_->block_bytes()));
  EXPECT_TRUE(decode_->block_is(5, testing::kUntouched));
}

TEST_F(ConnectorFailureTest, DuplicateHoldOnThePrefillSideIsRefused) {
  start();
  ASSERT_TRUE(hold("p1", "T1"));
  EXPECT_FALSE(hold("p2", "T1", {7, 8}));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  EXPECT_EQ(0, std::memcmp(decode_->block(1), prefill_->block(3), decode_->block_bytes()));
  ASSERT_TRUE(prefill_->wait_event("p1", 5s).has_value());
  EXPECT_TRUE(prefill_->no_event_within("p2", 100ms));
}

TEST_F(ConnectorFailureTest, DuplicateAskFromAnotherDecodeEngineIsRefused) {
  start();
  ask("d1", "T1");
  ASSERT_TRUE(prefill_in_flight(1));
  auto other = FakeEngine::create("decode-1", &bootstrap_, SideOptions{});
  ASSERT_NE(other, nullptr);
  other->conn().start_remote_prefill("x1", testing::decode_params("T1", "prefill-0"),
                                     testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
  auto refused = other->wait_event("x1", 5s);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status.code(), StatusCode::kAlreadyExists) << refused->status.to_string();
  EXPECT_TRUE(contains(refused->status.message(), "duplicate transfer_id T1"));
  // The first asker is untouched.
  ASSERT_TRUE(hold("p1", "T1"));
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
  EXPECT_EQ(0, std::memcmp(decode_->block(1), prefill_->block(3), decode_->block_bytes()));
  EXPECT_TRUE(other->block_is(1, testing::kUntouched));
}

TEST_F(ConnectorFailureTest, PromptMismatchFailsBothSides) {
  start();
  ask("d1", "T1", {1, 2}, 20);
  ASSERT_TRUE(prefill_in_flight(1));
  EXPECT_TRUE(prefill_->conn().hold_for_remote_decode("p1", testing::prefill_params("T1"),
                                                      testing::make_prompt(20, /*seed=*/9),
                                                      std::vector<int32_t>{3, 4}));
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(contains(ev->status.message(), "prompt differs")) << ev->status.to_string();
  ASSERT_TRUE(prefill_->wait_event("p1", 5s).has_value());
  EXPECT_TRUE(decode_untouched());
}

TEST_F(ConnectorFailureTest, UnknownEngineIdIsNamed) {
  start();
  ask("d1", "T1", {1, 2}, 20, "prefill-9");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(ev->status.message(),
                       "prefill engine prefill-9 unknown at bootstrap URL http://127.0.0.1:8998"))
      << ev->status.message();
}

TEST_F(ConnectorFailureTest, UnreachableBootstrapIsNamed) {
  start();
  bootstrap_.fail_with(unavailable("connection refused"));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(contains(ev->status.message(),
                       "bootstrap URL http://127.0.0.1:8998 unreachable: connection refused"))
      << ev->status.message();
}

TEST_F(ConnectorFailureTest, UnreachableWorkerIsNamed) {
  start();
  auto dead = net::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(dead.is_ok());
  int port = net::local_port(*dead).value();
  dead->reset();  // nothing listens there now
  bootstrap_.set("prefill-0", "tcp://127.0.0.1:" + std::to_string(port));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(contains(ev->status.message(), "prefill engine prefill-0 at tcp://127.0.0.1:"))
      << ev->status.message();
}

TEST_F(ConnectorFailureTest, CompatMismatchNamesTheField) {
  SideOptions d;
  d.compat.head_dim = 32;
  start({}, d);
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->status.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(ev->status.message(),
                       "compatibility mismatch with prefill engine prefill-0: head_dim: 32 here, "
                       "16 at the peer"))
      << ev->status.message();
}

TEST_F(ConnectorFailureTest, TransportMismatchIsRefused) {
  SideOptions d;
  d.transport = transfer::TransportKind::kTcp;
  start({}, d);
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(contains(ev->status.message(), "transport: tcp here, shm at the peer"))
      << ev->status.message();
}

TEST_F(ConnectorFailureTest, BadRequestInputsFailAtOnce) {
  start();
  decode_->conn().start_remote_prefill("d1", testing::decode_params("", "prefill-0"),
                                       testing::make_prompt(20), std::vector<int32_t>{1, 2}, 0);
  decode_->conn().start_remote_prefill("d2", testing::decode_params("T2", "prefill-0"),
                                       testing::make_prompt(20), std::vector<int32_t>{1, 99}, 0);
  decode_->conn().start_remote_prefill("d3", testing::decode_params("T3", "prefill-0"),
                                       testing::make_prompt(40), std::vector<int32_t>{1, 2}, 0);
  decode_->conn().start_remote_prefill("d4", testing::decode_params("T4", "prefill-0"),
                                       testing::make_prompt(40), std::vector<int32_t>{1, 2, 3}, 5);
  const char* expected[] = {"transfer_id is empty", "block id 99 is outside",
                            "block table has 2 blocks, the prompt needs 3",
                            "num_local_tokens 5 is not a multiple"};
  const char* request_ids[] = {"d1", "d2", "d3", "d4"};
  for (int i = 0; i < 4; ++i) {
    auto ev = decode_->wait_event(request_ids[i], 1s);
    ASSERT_TRUE(ev.has_value()) << i;
    EXPECT_EQ(ev->status.code(), StatusCode::kInvalidArgument) << ev->status.to_string();
    EXPECT_TRUE(contains(ev->status.message(), expected[i])) << ev->status.message();
  }
  // Nothing to fetch: the engine does not wait, so even bad params give no event.
  decode_->conn().start_remote_prefill("d5", testing::decode_params("", "prefill-0"),
                                       testing::make_prompt(33), std::vector<int32_t>{1, 2, 3}, 32);
  EXPECT_TRUE(decode_->no_event_within("d5", 200ms));
  EXPECT_FALSE(hold("p1", ""));
  EXPECT_EQ(decode_->conn().num_pending(), 0);
}

TEST_F(ConnectorFailureTest, CreateRejectsBadOptions) {
  DisaggOptions o;
  o.engine_id = "x";
  auto c = KvTransferConnector::create(o);
  EXPECT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), "KV memory")) << c.status().to_string();
  auto mem = transfer::allocate_shared(4096).value();
  o.memory = KvMemory{mem.data(), mem.size(), 4096, 2};
  o.compat = testing::test_compat();
  c = KvTransferConnector::create(o);
  EXPECT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), "do not fit")) << c.status().to_string();
  o.memory.num_blocks = 1;
  o.engine_id = "";
  c = KvTransferConnector::create(o);
  EXPECT_TRUE(contains(c.status().message(), "engine_id is empty")) << c.status().to_string();
}

// ---------------------------------------------------------------------------------------------
// Hostile or broken peers, played by raw sockets.

Status send_frame(const net::Fd& fd, MessageType type, const std::string& payload) {
  return net::write_frame(fd, static_cast<uint16_t>(type), payload, Deadline::after_ms(2000));
}

// True when the peer closes the connection (EOF or reset) within the timeout, after
// optionally sending frames; frames before the close are appended to `frames`.
bool closed_by_peer(const net::Fd& fd, std::vector<net::Frame>* frames = nullptr) {
  for (;;) {
    auto f = net::read_frame(fd, 1 << 20, Deadline::after_ms(3000));
    if (!f.is_ok())
      return f.status().code() != StatusCode::kDeadlineExceeded;
    if (frames != nullptr)
      frames->push_back(std::move(*f));
  }
}

TEST_F(ConnectorFailureTest, GarbageOnTheControlPortIsDroppedAndServiceContinues) {
  start();
  std::string host;
  int port = 0;
  ASSERT_TRUE(net::parse_host_port(prefill_->conn().worker_addr().substr(6), &host, &port).is_ok());
  auto connect = [&] { return net::connect_tcp(host, port, Deadline::after_ms(2000)).value(); };
  {  // random bytes
    auto fd = connect();
    std::string junk(100, '\x5a');
    ASSERT_TRUE(net::write_all(fd, junk.data(), junk.size(), Deadline::after_ms(1000)).is_ok());
    EXPECT_TRUE(closed_by_peer(fd));
  }
  {  // a frame header announcing 1 TiB
    auto fd = connect();
    uint8_t header[net::kFrameHeaderBytes];
    net::encode_frame_header({static_cast<uint16_t>(MessageType::kAsk), 1ull << 40}, header);
    ASSERT_TRUE(net::write_all(fd, header, sizeof(header), Deadline::after_ms(1000)).is_ok());
    EXPECT_TRUE(closed_by_peer(fd));
  }
  {  // ASK before HELLO
    auto fd = connect();
    protocol::Ask a{"T9", 20, 1, 0, {1, 2}};
    ASSERT_TRUE(send_frame(fd, MessageType::kAsk, protocol::encode(a)).is_ok());
    EXPECT_TRUE(closed_by_peer(fd));
  }
  {  // a truncated HELLO is refused with a reason
    auto fd = connect();
    ASSERT_TRUE(send_frame(fd, MessageType::kHello, "\x01\x00\x00\x00\x05").is_ok());
    std::vector<net::Frame> frames;
    EXPECT_TRUE(closed_by_peer(fd, &frames));
    ASSERT_EQ(frames.size(), 1u);
    EXPECT_EQ(frames[0].type, static_cast<uint16_t>(MessageType::kRefused));
    auto r = protocol::decode_refused(frames[0].payload);
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(contains(r->message, "HELLO")) << r->message;
  }
  {  // a HELLO of another protocol version
    auto fd = connect();
    ASSERT_TRUE(send_frame(fd, MessageType::kHello, std::string("\x07\x00\x00\x00", 4)).is_ok());
    std::vector<net::Frame> frames;
    EXPECT_TRUE(closed_by_peer(fd, &frames));
    ASSERT_EQ(frames.size(), 1u);
    auto r = protocol::decode_refused(frames[0].payload);
    ASSERT_TRUE(r.is_ok());
    EXPECT_TRUE(contains(r->message, "protocol version 7")) << r->message;
  }
  // The connector still serves a real decode engine.
  ASSERT_TRUE(hold("p1", "T1"));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_TRUE(ev->status.is_ok()) << ev->status.to_string();
}

// A prefill worker played by the test: answers HELLO, then runs `behave` on the connection.
class FakePrefillWorker {
 public:
  explicit FakePrefillWorker(std::function<void(net::Fd&)> behave) {
    listener_ = net::listen_tcp("127.0.0.1", 0).value();
    addr_ = "tcp://127.0.0.1:" + std::to_string(net::local_port(listener_).value());
    thread_ = std::thread([this, behave = std::move(behave)] {
      auto fd = net::accept_with_deadline(listener_, Deadline::after_ms(5000));
      if (!fd.is_ok())
        return;
      auto hello = net::read_frame(*fd, 1 << 20, Deadline::after_ms(2000));
      if (!hello.is_ok())
        return;
      protocol::HelloOk ok{protocol::kProtocolVersion, "prefill-0"};
      if (!send_frame(*fd, MessageType::kHelloOk, protocol::encode(ok)).is_ok())
        return;
      behave(*fd);
    });
  }
  ~FakePrefillWorker() { thread_.join(); }
  const std::string& addr() const { return addr_; }

 private:
  net::Fd listener_;
  std::string addr_;
  std::thread thread_;
};

// Reads frames until EOF or the deadline; returns their types.
std::vector<uint16_t> read_until_eof(net::Fd& fd, int64_t ms) {
  std::vector<uint16_t> types;
  Deadline deadline = Deadline::after_ms(ms);
  while (!deadline.is_expired()) {
    auto f = net::read_frame(fd, 1 << 20, deadline);
    if (!f.is_ok())
      break;
    types.push_back(f->type);
  }
  return types;
}

TEST_F(ConnectorFailureTest, SilentPrefillIsDetectedByMissedHeartbeats) {
  SideOptions d;
  d.transfer_timeout = 10'000ms;
  d.heartbeat_interval = 100ms;
  d.cancel_grace = 300ms;
  start({}, d);
  std::atomic<bool> release{false};
  FakePrefillWorker fake([&](net::Fd&) {
    // Open but silent: no HEARTBEAT_ACK, no DONE, no EOF.
    testing::eventually([&] { return release.load(); }, 10s);
  });
  bootstrap_.set("prefill-0", fake.addr());
  auto t0 = std::chrono::steady_clock::now();
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  release = true;
  ASSERT_TRUE(ev.has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms);
  EXPECT_EQ(ev->status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(contains(ev->status.message(), "heartbeats missed")) << ev->status.message();
}

TEST_F(ConnectorFailureTest, MissingCancelAckClosesTheConnectionAfterTheGrace) {
  SideOptions d;
  d.transfer_timeout = 10'000ms;
  d.cancel_grace = 300ms;
  start({}, d);
  std::vector<uint16_t> seen;
  FakePrefillWorker fake([&](net::Fd& fd) {
    // Acks heartbeats but ignores CANCEL; closes once the decode engine closes.
    Deadline deadline = Deadline::after_ms(5000);
    while (!deadline.is_expired()) {
      auto f = net::read_frame(fd, 1 << 20, deadline);
      if (!f.is_ok())
        break;
      seen.push_back(f->type);
      if (f->type == static_cast<uint16_t>(MessageType::kHeartbeat))
        (void)send_frame(fd, MessageType::kHeartbeatAck, "");
    }
  });
  bootstrap_.set("prefill-0", fake.addr());
  ask("d1", "T1");
  ASSERT_TRUE(
      testing::eventually([&] { return decode_->conn().metrics().decode.num_in_flight == 1; }));
  std::this_thread::sleep_for(100ms);  // let the ASK go out
  auto t0 = std::chrono::steady_clock::now();
  decode_->conn().cancel("d1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(elapsed, 250ms);   // waited for the ack
  EXPECT_LT(elapsed, 2000ms);  // then closed the connection
  EXPECT_EQ(ev->status.code(), StatusCode::kCancelled) << ev->status.to_string();
}

TEST_F(ConnectorFailureTest, MalformedDoneClosesTheConnectionAndFailsTheFetch) {
  start();
  FakePrefillWorker fake([&](net::Fd& fd) {
    auto ask = net::read_frame(fd, 1 << 20, Deadline::after_ms(3000));
    if (!ask.is_ok())
      return;
    (void)send_frame(fd, MessageType::kDone, "\x02\x00\x00\x00T1");  // truncated
    read_until_eof(fd, 3000);
  });
  bootstrap_.set("prefill-0", fake.addr());
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value());
  EXPECT_FALSE(ev->status.is_ok());
  EXPECT_TRUE(contains(ev->status.message(), "DONE")) << ev->status.message();
}

TEST_F(ConnectorFailureTest, MetricsCountAndRender) {
  start();
  ASSERT_TRUE(hold("p1", "T1"));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value() && ev->status.is_ok());
  ASSERT_TRUE(prefill_->wait_event("p1", 5s).has_value());
  ask("d2", "T2", {1, 2}, 20, "prefill-9");  // an error
  ASSERT_TRUE(decode_->wait_event("d2", 5s).has_value());

  auto p = prefill_->conn().metrics();
  EXPECT_EQ(p.prefill.num_ok, 1u);
  EXPECT_EQ(p.prefill.num_bytes, 2 * prefill_->block_bytes());
  EXPECT_EQ(p.prefill.num_in_flight, 0);
  EXPECT_EQ(p.prefill.num_write_latency_samples, 1u);
  auto d = decode_->conn().metrics();
  EXPECT_EQ(d.decode.num_ok, 1u);
  EXPECT_EQ(d.decode.num_error, 1u);
  EXPECT_EQ(d.decode.num_bytes, 2 * decode_->block_bytes());
  EXPECT_EQ(d.decode.num_in_flight, 0);
  ASSERT_EQ(d.recent_fetches.size(), 2u);
  EXPECT_EQ(d.recent_fetches[0].request_id, "d1");
  EXPECT_TRUE(d.recent_fetches[0].is_ok);
  EXPECT_GT(d.recent_fetches[0].total_s, 0.0);
  EXPECT_GE(d.recent_fetches[0].total_s, d.recent_fetches[0].transfer_s);
  EXPECT_FALSE(d.recent_fetches[1].is_ok);

  std::string text;
  decode_->conn().render_metrics(&text);
  for (const char* line : {
           "# TYPE crescent_kv_transfer_transfers_total counter\n",
           "crescent_kv_transfer_transfers_total{role=\"decode\",result=\"ok\"} 1\n",
           "crescent_kv_transfer_transfers_total{role=\"decode\",result=\"error\"} 1\n",
           "crescent_kv_transfer_bytes_total{role=\"decode\"} 16384\n",
           "crescent_kv_transfer_in_flight{role=\"decode\"} 0\n",
           "crescent_kv_transfer_write_seconds_count{role=\"decode\"} 1\n",
           "crescent_kv_transfer_write_seconds_bucket{role=\"decode\",le=\"+Inf\"} 1\n",
           "crescent_kv_transfer_fetch_seconds_count 1\n",
           "crescent_kv_transfer_wait_seconds_count 1\n",
           "crescent_kv_transfer_bootstrap_seconds_count 1\n",
       }) {
    EXPECT_TRUE(contains(text, line)) << "missing: " << line << "\nin:\n" << text;
  }
  text.clear();
  prefill_->conn().render_metrics(&text);
  EXPECT_TRUE(
      contains(text, "crescent_kv_transfer_transfers_total{role=\"prefill\",result=\"ok\"} 1\n"));
}

TEST_F(ConnectorFailureTest, ConnectorsCanShareOneMetricsRegistry) {
  SideOptions p, d;
  p.metrics = d.metrics = std::make_shared<TransferMetrics>();
  start(p, d);
  ASSERT_TRUE(hold("p1", "T1"));
  ask("d1", "T1");
  auto ev = decode_->wait_event("d1", 5s);
  ASSERT_TRUE(ev.has_value() && ev->status.is_ok());
  ASSERT_TRUE(prefill_->wait_event("p1", 5s).has_value());
  auto m = p.metrics->snapshot();
  EXPECT_EQ(m.prefill.num_ok, 1u);
  EXPECT_EQ(m.decode.num_ok, 1u);
  EXPECT_EQ(decode_->conn().metrics().prefill.num_ok, 1u);
  std::string text;
  p.metrics->render(&text);
  size_t first = text.find("# TYPE crescent_kv_transfer_transfers_total");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(text.find("# TYPE crescent_kv_transfer_transfers_total", first + 1), std::string::npos);
}

}  // namespace
}  // namespace crescent::disagg
