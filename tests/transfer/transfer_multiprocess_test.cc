// Cross-process tests of the transfer engine on 127.0.0.1 for every transport: random READ and
// WRITE ops verified by checksum, many batches in flight, notification order, the bad-input
// table, SIGKILL of the peer in the middle of a large batch, and a run across two network
// namespaces joined by a veth pair (skipped, with the reason, where the machine forbids it).

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <random>
#include <thread>

#include "net/frame.h"
#include "net/socket.h"
#include "tests/transfer/transfer_test_util.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {
namespace {

using testutil::Child;

constexpr uint64_t kPeerBytes = 16 << 20;  // two regions of 8 MiB
constexpr uint64_t kHalf = kPeerBytes / 2;
constexpr uint64_t kSeed = 42;

std::string peer_path() {
  return std::string(CRESCENT_BINARY_DIR) + "/tests/transfer/transfer_peer";
}

struct Peer {
  Child child;
  SegmentDescriptor desc;
};

Result<Peer> start_peer(TransportKind t, const std::string& token = "", uint64_t bytes = kPeerBytes,
                        std::vector<std::string> prefix = {},
                        const std::string& host = "127.0.0.1") {
  std::vector<std::string> argv = std::move(prefix);
  for (const std::string& a :
       {peer_path(), std::string("--transport"), std::string(transport_name(t)),
        std::string("--bytes"), std::to_string(bytes), std::string("--seed"), std::to_string(kSeed),
        std::string("--token"), token, std::string("--listen-host"), host}) {
    argv.push_back(a);
  }
  ASSIGN_OR_RETURN(Child child, Child::spawn(argv));
  ASSIGN_OR_RETURN(std::string line, child.read_line(Deadline::after_ms(20000)));
  if (line.rfind("DESC ", 0) != 0)
    return internal_error("peer said: " + line);
  ASSIGN_OR_RETURN(SegmentDescriptor desc, SegmentDescriptor::parse(line.substr(5)));
  return Peer{std::move(child), std::move(desc)};
}

std::string sum_line(const uint8_t* data, uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "sum %016" PRIx64, testutil::fnv1a(data, bytes));
  return buf;
}

// Asks the peer for a checksum through a notification from `engine`, which orders it after
// that engine's completed WRITEs; the peer prints the answer on stdout.
Result<std::string> peer_sum(Peer& p, TransferEngine& engine, PeerId peer, uint64_t off,
                             uint64_t len) {
  RETURN_IF_ERROR(engine.notify(peer, "sum " + std::to_string(off) + " " + std::to_string(len),
                                Deadline::after_ms(5000)));
  return p.child.read_line(Deadline::after_ms(20000));
}

std::unique_ptr<TransferEngine> make_engine(TransportKind t, const std::string& name,
                                            const std::string& token = "") {
  EngineOptions o;
  o.transport = t;
  o.name = name;
  o.token = token;
  auto e = TransferEngine::create(o);
  CRESCENT_CHECK(e.is_ok()) << e.status().to_string();
  return std::move(*e);
}

class MultiProcessTest : public ::testing::TestWithParam<TransportKind> {};

TEST_P(MultiProcessTest, RandomReadWriteManyBatchesInFlightChecksummed) {
  TransportKind t = GetParam();
  Peer peer = start_peer(t).value();
  auto engine = make_engine(t, "initiator");
  PeerId pid = engine->open_segment(peer.desc, Deadline::after_ms(5000)).value();
  RegionId regions[2] = {peer.desc.regions.at(0).id, peer.desc.regions.at(1).id};

  // The expected content of the peer's buffer, updated as we write.
  std::vector<uint8_t> shadow(kPeerBytes);
  testutil::fill_pattern(shadow.data(), kPeerBytes, kSeed);
  SharedBuffer src = allocate_shared(kPeerBytes).value();
  testutil::fill_pattern(src.data(), kPeerBytes, 777);

  // 4 threads x 6 batches in flight each; every batch owns a disjoint slice of the peer.
  constexpr int kThreads = 4;
  constexpr int kBatchesPerThread = 6;
  constexpr uint64_t kSlice = kPeerBytes / (kThreads * kBatchesPerThread);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937_64 rng(1000 + th);
      std::vector<BatchId> ids;
      for (int b = 0; b < kBatchesPerThread; ++b) {
        uint64_t slice_begin = (th * kBatchesPerThread + b) * kSlice;
        // Random non-overlapping ops inside the slice, never across the region boundary.
        std::vector<TransferOp> ops;
        uint64_t pos = slice_begin;
        while (true) {
          pos += rng() % 4096;
          uint64_t len = 1 + rng() % (rng() % 2 ? 4096 : 96 << 10);
          if (pos + len > slice_begin + kSlice)
            break;
          int r = pos >= kHalf ? 1 : 0;
          if (r == 0 && pos + len > kHalf)
            break;
          uint64_t off = pos - (r == 1 ? kHalf : 0);
          ops.push_back({OpKind::kWrite, src.data() + pos, regions[r], off, len});
          std::memcpy(shadow.data() + pos, src.data() + pos, len);
          pos += len;
        }
        auto id = engine->submit(pid, ops, Deadline::after_ms(60000));
        if (!id.is_ok()) {
          errors[th] = id.status().to_string();
          return;
        }
        ids.push_back(*id);
      }
      for (BatchId id : ids) {
        Status s = engine->wait(id, Deadline::after_ms(60000));
        if (!s.is_ok())
          errors[th] = s.to_string();
        engine->release(id);
      }
    });
  }
  for (auto& th : threads)
    th.join();
  for (const auto& e : errors)
    ASSERT_EQ(e, "");

  // The peer's own checksum of each region matches the shadow.
  ASSERT_EQ(peer_sum(peer, *engine, pid, 0, kHalf).value(), sum_line(shadow.data(), kHalf));
  ASSERT_EQ(peer_sum(peer, *engine, pid, kHalf, kHalf).value(),
            sum_line(shadow.data() + kHalf, kHalf));

  // Random READs, many per batch, compared with the shadow.
  std::mt19937_64 rng(5);
  std::vector<uint8_t> dst(kPeerBytes);
  std::vector<TransferOp> reads;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  uint64_t pos = 0;
  while (true) {
    pos += rng() % 8192;
    uint64_t len = 1 + rng() % (200 << 10);
    if (pos + len > kPeerBytes)
      break;
    int r = pos >= kHalf ? 1 : 0;
    if (r == 0 && pos + len > kHalf)
      len = kHalf - pos;
    reads.push_back({OpKind::kRead, dst.data() + pos, regions[r], pos - (r ? kHalf : 0), len});
    spans.push_back({pos, len});
    pos += len;
  }
  BatchId rb = engine->submit(pid, reads, Deadline::after_ms(60000)).value();
  ASSERT_TRUE(engine->wait(rb, Deadline::after_ms(60000)).is_ok());
  BatchStatus st = engine->poll(rb).value();
  uint64_t expected_bytes = 0;
  for (auto [p, l] : spans) {
    ASSERT_EQ(std::memcmp(dst.data() + p, shadow.data() + p, l), 0) << "READ at " << p;
    expected_bytes += l;
  }
  EXPECT_EQ(st.num_bytes, expected_bytes);
  EXPECT_EQ(st.op_status.size(), reads.size());
}

TEST_P(MultiProcessTest, NotificationsInOrderPerPeer) {
  TransportKind t = GetParam();
  Peer peer = start_peer(t).value();
  constexpr int kNotes = 300;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<TransferEngine>> engines;
  for (int i = 0; i < 2; ++i)
    engines.push_back(make_engine(t, "initiator-" + std::to_string(i)));
  SharedBuffer src = allocate_shared(4096).value();
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      TransferEngine& e = *engines[i];
      PeerId p = e.open_segment(peer.desc, Deadline::after_ms(5000)).value();
      for (int n = 0; n < kNotes; ++n) {
        if (n % 50 == 0) {
          // Interleave data with notifications, as the disaggregation layer will.
          TransferOp op{OpKind::kWrite, src.data(), peer.desc.regions[0].id, 4096u * i, 4096};
          BatchId b = e.submit(p, std::span(&op, 1), Deadline::after_ms(10000)).value();
          CRESCENT_CHECK(e.wait(b, Deadline::after_ms(10000)).is_ok()) << "write failed";
        }
        CRESCENT_CHECK(e.notify(p, std::to_string(n), Deadline::after_ms(5000)).is_ok())
            << "notify failed";
      }
    });
  }
  for (auto& th : threads)
    th.join();
  std::string reply;
  for (int tries = 0; tries < 200; ++tries) {
    reply = peer.child.ask("notes", Deadline::after_ms(5000)).value();
    if (reply == "notes " + std::to_string(2 * kNotes) + " 1")
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(reply, "notes " + std::to_string(2 * kNotes) + " 1");
}

// Connects to the peer's listener and sends raw bytes; returns whether the peer closed it.
bool peer_drops_raw_connection(const SegmentDescriptor& desc, const std::string& bytes) {
  Result<net::Fd> fd =
      desc.address.rfind("unix:@", 0) == 0
          ? net::connect_unix_abstract(desc.address.substr(6), Deadline::after_ms(2000))
          : [&]() -> Result<net::Fd> {
    std::string host;
    int port = 0;
    RETURN_IF_ERROR(net::parse_host_port(desc.address.substr(4), &host, &port));
    return net::connect_tcp(host, port, Deadline::after_ms(2000));
  }();
  if (!fd.is_ok())
    return false;
  if (!net::write_all(*fd, bytes.data(), bytes.size(), Deadline::after_ms(2000)).is_ok())
    return true;
  char c;
  // The peer closes (or answers with an ERROR frame and then closes).
  for (int i = 0; i < 64; ++i) {
    Status s = net::read_exact(*fd, &c, 1, Deadline::after_ms(3000));
    if (s.code() == StatusCode::kUnavailable)
      return true;
    if (!s.is_ok())
      return false;
  }
  return false;
}

TEST_P(MultiProcessTest, BadInputIsRefusedNothingWrittenPeerStillServing) {
  TransportKind t = GetParam();
  Peer peer = start_peer(t, "tok").value();
  std::vector<uint8_t> pattern(kPeerBytes);
  testutil::fill_pattern(pattern.data(), kPeerBytes, kSeed);

  // Wrong and missing tokens.
  auto wrong = make_engine(t, "intruder", "not-the-token");
  EXPECT_EQ(wrong->open_segment(peer.desc, Deadline::after_ms(3000)).status().code(),
            StatusCode::kPermissionDenied);
  auto none = make_engine(t, "tokenless");
  EXPECT_EQ(none->open_segment(peer.desc, Deadline::after_ms(3000)).status().code(),
            StatusCode::kPermissionDenied);

  auto engine = make_engine(t, "initiator", "tok");
  PeerId pid = engine->open_segment(peer.desc, Deadline::after_ms(5000)).value();
  RegionId r1 = peer.desc.regions[0].id;
  RegionId r2 = peer.desc.regions[1].id;
  ASSERT_EQ(
      peer.child.ask("unregister " + std::to_string(r2.value()), Deadline::after_ms(5000)).value(),
      "ok");
  SharedBuffer src = allocate_shared(1 << 20).value();
  std::memset(src.data(), 0xEE, 1 << 20);

  struct Case {
    const char* name;
    RegionId region;
    uint64_t offset;
    uint64_t length;
    StatusCode code;
  };
  const Case cases[] = {
      {"out of region", r1, kHalf - 10, 4096, StatusCode::kOutOfRange},
      {"offset past the end", r1, kHalf, 1, StatusCode::kOutOfRange},
      {"offset+length overflows", r1, UINT64_MAX - 100, 4096, StatusCode::kOutOfRange},
      {"unregistered", RegionId(12345), 0, 64, StatusCode::kNotFound},
      {"already unregistered", r2, 0, 64, StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
      TransferOp op{kind, src.data(), c.region, c.offset, c.length};
      auto b = engine->submit(pid, std::span(&op, 1), Deadline::after_ms(5000));
      ASSERT_TRUE(b.is_ok()) << c.name;
      Status s = engine->wait(*b, Deadline::after_ms(5000));
      EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.to_string();
      engine->release(*b);
    }
  }
  // A length that wraps the local address space is refused before anything is sent.
  TransferOp wrapping{OpKind::kRead, src.data(), r1, 0, UINT64_MAX};
  EXPECT_EQ(engine->submit(pid, std::span(&wrapping, 1), Deadline::after_ms(5000)).status().code(),
            StatusCode::kInvalidArgument);
  // Garbage and oversized control frames: the peer drops those connections.
  std::string garbage(64, '\0');
  std::mt19937 rng(3);
  for (char& ch : garbage)
    ch = static_cast<char>(rng());
  EXPECT_TRUE(peer_drops_raw_connection(peer.desc, garbage));
  uint8_t header[net::kFrameHeaderBytes];
  net::encode_frame_header({1, uint64_t{1} << 40}, header);
  EXPECT_TRUE(
      peer_drops_raw_connection(peer.desc, std::string(reinterpret_cast<char*>(header), 16)));

  // Nothing was written, and the peer still serves the good connection.
  EXPECT_EQ(peer_sum(peer, *engine, pid, 0, kPeerBytes).value(),
            sum_line(pattern.data(), kPeerBytes));
  TransferOp good{OpKind::kWrite, src.data(), r1, 100, 1000};
  BatchId b = engine->submit(pid, std::span(&good, 1), Deadline::after_ms(5000)).value();
  ASSERT_TRUE(engine->wait(b, Deadline::after_ms(5000)).is_ok());
  std::memset(pattern.data() + 100, 0xEE, 1000);
  EXPECT_EQ(peer_sum(peer, *engine, pid, 0, kPeerBytes).value(),
            sum_line(pattern.data(), kPeerBytes));
}

TEST_P(MultiProcessTest, PeerKilledMidLargeBatchFailsWithinDeadline) {
  TransportKind t = GetParam();
  constexpr uint64_t kBig = 64 << 20;
  Peer peer = start_peer(t, "", kBig).value();
  auto engine = make_engine(t, "initiator");
  PeerId pid = engine->open_segment(peer.desc, Deadline::after_ms(5000)).value();
  SharedBuffer src = allocate_shared(kBig / 2).value();
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kBig / 2; off += 1 << 20) {
    ops.push_back({OpKind::kWrite, src.data() + off, peer.desc.regions[0].id, off, 1 << 20});
  }
  // Several large batches so that the kill lands while one is moving.
  std::vector<BatchId> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back(engine->submit(pid, ops, Deadline::after_ms(8000)).value());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  peer.child.kill_now(SIGKILL);
  auto t0 = Clock::now();
  int num_failed = 0;
  for (BatchId id : ids) {
    Status s = engine->wait(id, Deadline::after_ms(8000));
    EXPECT_NE(s.code(), StatusCode::kDeadlineExceeded) << "wait itself timed out";
    if (!s.is_ok())
      ++num_failed;
  }
  EXPECT_GE(num_failed, 1);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(9));
  EXPECT_FALSE(engine->submit(pid, ops, Deadline::after_ms(1000)).is_ok() &&
               engine->wait(ids.back(), Deadline::after_ms(1000)).is_ok());

  // A new peer can be opened and served by the same engine.
  Peer fresh = start_peer(t).value();
  PeerId p2 = engine->open_segment(fresh.desc, Deadline::after_ms(5000)).value();
  testutil::fill_pattern(src.data(), 4096, 9);
  TransferOp op{OpKind::kWrite, src.data(), fresh.desc.regions[0].id, 0, 4096};
  BatchId b = engine->submit(p2, std::span(&op, 1), Deadline::after_ms(5000)).value();
  ASSERT_TRUE(engine->wait(b, Deadline::after_ms(5000)).is_ok());
  EXPECT_EQ(peer_sum(fresh, *engine, p2, 0, 4096).value(), sum_line(src.data(), 4096));
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessTest, ::testing::ValuesIn(available_transports()),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

// Runs a command, returns its exit status.
int sh(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

TEST(NetworkNamespaceTest, TcpAcrossTwoNamespacesJoinedByVeth) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "network namespaces need root; running as uid " << ::geteuid();
  ASSERT_EQ(sh("command -v ip"), 0) << "the `ip` tool (iproute2) is missing: run scripts/setup.sh";
  std::string tag = std::to_string(::getpid() % 100000);
  std::string ns = "crtr" + tag;
  std::string va = "crva" + tag;
  std::string vb = "crvb" + tag;
  if (sh("ip netns add " + ns) != 0) {
    GTEST_SKIP() << "`ip netns add` failed: this machine does not allow creating network "
                    "namespaces (no CAP_SYS_ADMIN or no netns support)";
  }
  struct Cleanup {
    std::string ns, va;
    ~Cleanup() {
      sh("ip link del " + va);
      sh("ip netns del " + ns);
    }
  } cleanup{ns, va};
  // One end stays in this namespace (10.77.x.1), the other goes into `ns` (10.77.x.2).
  std::string subnet = "10.77." + std::to_string(::getpid() % 250) + ".";
  if (sh("ip link add " + va + " type veth peer name " + vb) != 0 ||
      sh("ip link set " + vb + " netns " + ns) != 0) {
    GTEST_SKIP() << "creating a veth pair failed: the machine does not allow it";
  }
  ASSERT_EQ(sh("ip addr add " + subnet + "1/24 dev " + va), 0);
  ASSERT_EQ(sh("ip link set " + va + " up"), 0);
  ASSERT_EQ(sh("ip netns exec " + ns + " ip addr add " + subnet + "2/24 dev " + vb), 0);
  ASSERT_EQ(sh("ip netns exec " + ns + " ip link set " + vb + " up"), 0);
  ASSERT_EQ(sh("ip netns exec " + ns + " ip link set lo up"), 0);

  Peer peer = start_peer(TransportKind::kTcp, "", kPeerBytes, {"/usr/sbin/ip", "netns", "exec", ns},
                         subnet + "2")
                  .value();
  EXPECT_EQ(peer.desc.address,
            "tcp:" + subnet + "2:" + peer.desc.address.substr(peer.desc.address.rfind(':') + 1));
  EngineOptions o;
  o.transport = TransportKind::kTcp;
  o.listen_host = subnet + "1";
  auto engine = TransferEngine::create(o).value();
  PeerId pid = engine->open_segment(peer.desc, Deadline::after_ms(5000)).value();
  SharedBuffer src = allocate_shared(4 << 20).value();
  testutil::fill_pattern(src.data(), 4 << 20, 11);
  TransferOp op{OpKind::kWrite, src.data(), peer.desc.regions[0].id, 0, 4 << 20};
  BatchId b = engine->submit(pid, std::span(&op, 1), Deadline::after_ms(10000)).value();
  ASSERT_TRUE(engine->wait(b, Deadline::after_ms(10000)).is_ok());
  EXPECT_EQ(peer_sum(peer, *engine, pid, 0, 4 << 20).value(), sum_line(src.data(), 4 << 20));
  std::vector<uint8_t> back(4 << 20);
  TransferOp rd{OpKind::kRead, back.data(), peer.desc.regions[0].id, 0, back.size()};
  b = engine->submit(pid, std::span(&rd, 1), Deadline::after_ms(10000)).value();
  ASSERT_TRUE(engine->wait(b, Deadline::after_ms(10000)).is_ok());
  EXPECT_EQ(std::memcmp(back.data(), src.data(), back.size()), 0);
}

}  // namespace
}  // namespace crescent::transfer
