// In-process tests of the engine: two engines in one process talk over the real transports.
// The cross-process tests are in tests/transfer.

#include "transfer/transfer_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>

#include "transfer/shared_memory.h"

namespace crescent::transfer {
namespace {

class EngineTest : public ::testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    EngineOptions t;
    t.transport = GetParam();
    t.name = "target";
    t.on_notification = [this](const std::string& peer, std::string msg) {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(peer + ":" + msg);
    };
    auto target = TransferEngine::create(t);
    ASSERT_TRUE(target.is_ok()) << target.status().to_string();
    target_ = std::move(*target);
    EngineOptions i;
    i.transport = GetParam();
    i.name = "initiator";
    auto initiator = TransferEngine::create(i);
    ASSERT_TRUE(initiator.is_ok()) << initiator.status().to_string();
    initiator_ = std::move(*initiator);
    remote_ = std::move(allocate_shared(kBytes).value());
    local_ = std::move(allocate_shared(kBytes).value());
    region_ = target_->register_region(remote_.data(), kBytes).value();
  }

  Result<PeerId> open() {
    auto desc = SegmentDescriptor::parse(target_->local_segment().serialize());
    if (!desc.is_ok())
      return desc.status();
    return initiator_->open_segment(*desc, Deadline::after_ms(5000));
  }

  Status run(PeerId peer, std::vector<TransferOp> ops, BatchStatus* out = nullptr) {
    ASSIGN_OR_RETURN(BatchId b, initiator_->submit(peer, ops, Deadline::after_ms(10000)));
    Status s = initiator_->wait(b, Deadline::after_ms(10000));
    if (out != nullptr)
      *out = initiator_->poll(b).value();
    initiator_->release(b);
    return s;
  }

  static constexpr uint64_t kBytes = 1 << 20;
  std::unique_ptr<TransferEngine> target_;
  std::unique_ptr<TransferEngine> initiator_;
  SharedBuffer remote_;
  SharedBuffer local_;
  RegionId region_;
  std::mutex mu_;
  std::vector<std::string> notes_;
};

TEST_P(EngineTest, WriteThenReadBackWithCoalescing) {
  PeerId peer = open().value();
  for (uint64_t i = 0; i < kBytes; ++i) {
    local_.data()[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  // 64 adjacent 1 KiB ops (coalesced into one run) and one separate op.
  std::vector<TransferOp> ops;
  for (int k = 0; k < 64; ++k) {
    ops.push_back({OpKind::kWrite, local_.data() + k * 1024, region_, 4096 + k * 1024ull, 1024});
  }
  ops.push_back({OpKind::kWrite, local_.data() + 500000, region_, 900000, 777});
  BatchStatus st;
  ASSERT_TRUE(run(peer, ops, &st).is_ok());
  EXPECT_EQ(st.num_bytes, 64 * 1024 + 777u);
  EXPECT_EQ(std::memcmp(remote_.data() + 4096, local_.data(), 64 * 1024), 0);
  EXPECT_EQ(std::memcmp(remote_.data() + 900000, local_.data() + 500000, 777), 0);
  EXPECT_EQ(remote_.data()[4095], 0);

  std::vector<uint8_t> back(64 * 1024);
  ASSERT_TRUE(run(peer, {{OpKind::kRead, back.data(), region_, 4096, back.size()}}).is_ok());
  EXPECT_EQ(std::memcmp(back.data(), local_.data(), back.size()), 0);
}

// Many small non-adjacent ops in one batch (tcp sends them as grouped frames, one
// acknowledgement per group): valid and refused ops interleaved, WRITE then READ.
TEST_P(EngineTest, MixedBatchOfSmallOpsLandsValidOnesAndRefusesTheRest) {
  PeerId peer = open().value();
  constexpr uint64_t kSubOffset = 256 << 10;
  constexpr uint64_t kSubBytes = 128 << 10;
  constexpr uint64_t kOpBytes = 1024;
  RegionId sub = target_->register_region(remote_.data() + kSubOffset, kSubBytes).value();
  for (uint64_t i = 0; i < kBytes; ++i) {
    local_.data()[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  struct Bad {
    RegionId region;
    uint64_t offset;
    StatusCode code;
  };
  const Bad bad[] = {
      {sub, kSubBytes - kOpBytes / 2, StatusCode::kOutOfRange},  // would spill past the end
      {sub, UINT64_MAX - 10, StatusCode::kOutOfRange},
      {RegionId(999), 0, StatusCode::kNotFound},
  };
  constexpr int kNumGood = static_cast<int>(kSubBytes / (2 * kOpBytes));  // every other KiB
  std::vector<TransferOp> ops;
  std::vector<StatusCode> want;
  for (int k = 0; k < kNumGood; ++k) {
    ops.push_back({OpKind::kWrite, local_.data() + k * kOpBytes, sub, k * 2 * kOpBytes, kOpBytes});
    want.push_back(StatusCode::kOk);
    const Bad& b = bad[k % 3];
    ops.push_back({OpKind::kWrite, local_.data() + 512 * 1024, b.region, b.offset, kOpBytes});
    want.push_back(b.code);
  }
  BatchStatus st;
  Status s = run(peer, ops, &st);
  EXPECT_FALSE(s.is_ok());
  ASSERT_EQ(st.op_status.size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(st.op_status[i].code(), want[i]) << "op " << i << ": " << st.op_status[i].to_string();
  }
  EXPECT_EQ(st.num_bytes, kNumGood * kOpBytes);
  for (int k = 0; k < kNumGood; ++k) {
    const uint8_t* at = remote_.data() + kSubOffset + k * 2 * kOpBytes;
    EXPECT_EQ(std::memcmp(at, local_.data() + k * kOpBytes, kOpBytes), 0) << "op " << 2 * k;
    for (uint64_t j = 0; j < kOpBytes; ++j) {
      ASSERT_EQ(at[kOpBytes + j], 0) << "gap after op " << 2 * k << " was written";
    }
  }
  for (uint64_t i = 0; i < kBytes; ++i) {
    if (i < kSubOffset || i >= kSubOffset + kSubBytes) {
      ASSERT_EQ(remote_.data()[i], 0) << "byte " << i << " outside the region was written";
    }
  }

  // READ the same ops back into a fresh buffer: refused ops leave their destination alone.
  std::vector<uint8_t> back(2 * kNumGood * kOpBytes, 0xee);
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].kind = OpKind::kRead;
    ops[i].local_addr = back.data() + i * kOpBytes;
  }
  s = run(peer, ops, &st);
  EXPECT_FALSE(s.is_ok());
  ASSERT_EQ(st.op_status.size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(st.op_status[i].code(), want[i]) << "read op " << i;
    const uint8_t* got = back.data() + i * kOpBytes;
    if (i % 2 == 0) {
      EXPECT_EQ(std::memcmp(got, local_.data() + (i / 2) * kOpBytes, kOpBytes), 0) << i;
    } else {
      EXPECT_TRUE(std::all_of(got, got + kOpBytes, [](uint8_t b) { return b == 0xee; })) << i;
    }
  }
  ASSERT_TRUE(target_->unregister_region(sub, Deadline::after_ms(5000)).is_ok());
}

TEST_P(EngineTest, RefusesBadOpsAndWritesNothing) {
  PeerId peer = open().value();
  std::memset(local_.data(), 0xab, 8192);
  struct Case {
    const char* name;
    RegionId region;
    uint64_t offset;
    uint64_t length;
    StatusCode code;
  };
  const Case cases[] = {
      {"past the end", region_, kBytes - 100, 200, StatusCode::kOutOfRange},
      {"offset beyond", region_, kBytes + 1, 1, StatusCode::kOutOfRange},
      {"overflowing", region_, UINT64_MAX - 10, 4096, StatusCode::kOutOfRange},
      {"unregistered", RegionId(999), 0, 16, StatusCode::kNotFound},
  };
  for (const Case& c : cases) {
    for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
      BatchStatus st;
      // A good op beside the bad one still runs: per-op status.
      Status s = run(peer,
                     {{kind, local_.data(), c.region, c.offset, c.length},
                      {OpKind::kWrite, local_.data() + 4096, region_, 0, 64}},
                     &st);
      EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.to_string();
      EXPECT_EQ(st.op_status[0].code(), c.code) << c.name;
      EXPECT_TRUE(st.op_status[1].is_ok()) << c.name;
    }
  }
  for (uint64_t i = 64; i < kBytes; ++i) {
    ASSERT_EQ(remote_.data()[i], 0) << "byte " << i << " was written";
  }
  ASSERT_TRUE(target_->unregister_region(region_, Deadline::after_ms(1000)).is_ok());
  Status s = run(peer, {{OpKind::kWrite, local_.data(), region_, 0, 16}});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("was unregistered"), std::string::npos) << s.to_string();
}

TEST_P(EngineTest, RegionViewSeesThePeersBytesAndOutlivesTheRegion) {
  PeerId peer = open().value();
  auto view = initiator_->view_region(peer, region_, Deadline::after_ms(5000));
  if (GetParam() != TransportKind::kShm) {
    ASSERT_EQ(view.status().code(), StatusCode::kUnimplemented) << view.status().to_string();
    return;
  }
  ASSERT_TRUE(view.is_ok()) << view.status().to_string();
  ASSERT_EQ(view->length, kBytes);
  remote_.data()[12345] = 77;  // the target writes; the view sees it without a transfer
  EXPECT_EQ(view->data[12345], 77);
  // A second view answers from the mapping; an unknown region is NotFound.
  auto again = initiator_->view_region(peer, region_, Deadline::after_ms(5000));
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->data, view->data);
  EXPECT_EQ(initiator_->view_region(peer, RegionId(region_.value() + 99), Deadline::after_ms(5000))
                .status()
                .code(),
            StatusCode::kNotFound);
  // The target unregisters and the link closes: the mapping lives on while the view does.
  ASSERT_TRUE(target_->unregister_region(region_, Deadline::after_ms(5000)).is_ok());
  ASSERT_TRUE(initiator_->close_segment(peer).is_ok());
  EXPECT_EQ(view->data[12345], 77);
}

TEST_P(EngineTest, NotificationsArriveInOrder) {
  PeerId peer = open().value();
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(initiator_->notify(peer, std::to_string(i), Deadline::after_ms(1000)).is_ok());
  }
  // Notifications are delivered asynchronously; a READ round trip on the same peer flushes
  // tcp's connection 0 and the one-sided control channel.
  for (int tries = 0; tries < 200; ++tries) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (notes_.size() == 100)
        break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(notes_.size(), 100u);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(notes_[i], "initiator:" + std::to_string(i));
  }
}

TEST_P(EngineTest, WrongTokenIsRefused) {
  EngineOptions t;
  t.transport = GetParam();
  t.token = "s3cret";
  auto guarded = TransferEngine::create(t).value();
  auto desc = guarded->local_segment();
  auto refused = initiator_->open_segment(desc, Deadline::after_ms(2000));
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied) << refused.status().to_string();
  EngineOptions i;
  i.transport = GetParam();
  i.token = "s3cret";
  auto good = TransferEngine::create(i).value();
  EXPECT_TRUE(good->open_segment(desc, Deadline::after_ms(2000)).is_ok());
  EngineOptions w;
  w.transport = GetParam();
  w.token = "another";
  auto wrong = TransferEngine::create(w).value();
  auto denied = wrong->open_segment(desc, Deadline::after_ms(2000));
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status().to_string();
  // A token on the initiator only: the target (no token) refuses the handshake at once.
  const auto start = Clock::now();
  auto unguarded = wrong->open_segment(target_->local_segment(), Deadline::after_ms(5000));
  EXPECT_EQ(unguarded.status().code(), StatusCode::kFailedPrecondition)
      << unguarded.status().to_string();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

TEST_P(EngineTest, DescriptorRoundTripsAndRejectsGarbage) {
  SegmentDescriptor d = target_->local_segment();
  auto back = SegmentDescriptor::parse(d.serialize());
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->address, d.address);
  ASSERT_EQ(back->regions.size(), 1u);
  EXPECT_EQ(back->regions[0].length, kBytes);
  EXPECT_FALSE(SegmentDescriptor::parse("{not json").is_ok());
  EXPECT_FALSE(SegmentDescriptor::parse(R"({"version":1,"transport":"tcp"})").is_ok());
  EXPECT_FALSE(SegmentDescriptor::parse(R"({"version":1,"engine_name":"x","transport":"pigeon",
      "address":"tcp:1.2.3.4:5","regions":[]})")
                   .is_ok());
  // Numbers of the wrong kind are refused by type, never converted: nlohmann's get<int64_t>()
  // of 1e300 is undefined behaviour (control_frame_fuzz found the version field).
  const std::string head = R"({"engine_name":"x","transport":"tcp","address":"tcp:1.2.3.4:5",)";
  for (const char* tail :
       {R"("version":1e300,"regions":[]})", R"("version":1.0,"regions":[]})",
        R"("version":-1,"regions":[]})", R"("version":1,"regions":{"id":1,"length":2}})",
        R"("version":1,"regions":[7]})", R"("version":1,"regions":[{"id":1e300,"length":2}]})",
        R"("version":1,"regions":[{"id":1,"length":-2e300}]})",
        R"("version":1,"regions":[{"id":-1,"length":2}]})",
        R"("version":1,"regions":[{"id":1,"length":2.5}]})",
        R"("version":1,"transport_info":5,"regions":[]})"}) {
    auto bad = SegmentDescriptor::parse(head + tail);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << tail;
    EXPECT_FALSE(bad.status().message().empty()) << tail;
  }
  auto second_region = SegmentDescriptor::parse(
      head + R"("version":1,"regions":[{"id":1,"length":2},{"id":1e300,"length":2}]})");
  EXPECT_EQ(second_region.status().message(),
            "segment descriptor regions[1]: field 'id' must be an integer, got 1e+300");
}

// The transport-parametrised tests run over available_transports(), so a build that lost UCX
// would silently test less: only ThreadSanitizer builds leave it out (its memory hooks crash
// TSan), and this says so.
TEST(TransportsTest, UcxIsInEveryBuildButThreadSanitizer) {
#if defined(__SANITIZE_THREAD__)
  constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
  constexpr bool kThreadSanitizer = __has_feature(thread_sanitizer);
#else
  constexpr bool kThreadSanitizer = false;
#endif
  EXPECT_EQ(is_transport_available(TransportKind::kUcx), !kThreadSanitizer);
  const std::vector<std::string> expected = kThreadSanitizer
                                                ? std::vector<std::string>{"shm", "tcp"}
                                                : std::vector<std::string>{"shm", "tcp", "ucx"};
  EXPECT_EQ(available_transport_names(), expected);
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineTest, ::testing::ValuesIn(available_transports()),
                         [](const auto& info) { return std::string(transport_name(info.param)); });

TEST(SharedMemoryTest, FindsRangesAndRejectsOthers) {
  auto b = allocate_shared(10000).value();
  EXPECT_GE(b.size(), 10000u);
  auto r = find_shared(b.data() + 100, 200);
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->file_offset, 100u);
  ::close(r->memfd);
  EXPECT_FALSE(find_shared(b.data() + 100, b.size()).is_ok());
  int x = 0;
  EXPECT_FALSE(find_shared(&x, sizeof(x)).is_ok());
  std::vector<char> heap(100);
  EngineOptions o;
  o.transport = TransportKind::kShm;
  auto e = TransferEngine::create(o).value();
  EXPECT_EQ(e->register_region(heap.data(), heap.size()).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(capabilities(TransportKind::kShm).needs_shared_memory);
  EXPECT_TRUE(capabilities(TransportKind::kTcp).supports_remote_host);
}

}  // namespace
}  // namespace crescent::transfer
