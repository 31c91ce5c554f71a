// The EC connector with synthetic float tensors: EcProducer (encoder side) and EcConsumer
// (prefill side) in one process over real sockets, for the shm and tcp transports (and ucx
// where this build has it): bytes round trip, several encoders at once, one encode for
// concurrent publishes of one image, full pool, expiry, dropped consumers, dead encoders,
// compat refusal.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "disagg/ec_consumer.h"
#include "disagg/ec_producer.h"
#include "disagg/protocol.h"
#include "net/frame.h"
#include "net/socket.h"

namespace crescent::disagg {
namespace {

using std::chrono::milliseconds;
using transfer::TransportKind;

constexpr int64_t kHidden = 64;
// The pool's header before each tensor (its stamp; the default alignment).
constexpr uint64_t kEntryHeader = 64;

EcCompat test_compat() {
  EcCompat c;
  c.vision_model = "test-vit";
  c.hidden_size = kHidden;
  c.preprocess_hash = "pp-1";
  return c;
}

EcProducerOptions producer_options(TransportKind transport, const std::string& engine_id) {
  EcProducerOptions o;
  o.engine_id = engine_id;
  o.transport = transport;
  o.pool_bytes = 1 << 20;
  o.reservation_timeout = milliseconds(5000);
  o.compat = test_compat();
  return o;
}

std::unique_ptr<EcProducer> make_producer(EcProducerOptions o) {
  auto p = EcProducer::create(std::move(o));
  CRESCENT_CHECK(p.is_ok()) << p.status().to_string();
  return std::move(p).value();
}

std::unique_ptr<EcConsumer> make_consumer(TransportKind transport, EcCompat compat = test_compat(),
                                          std::string auth_token = {}) {
  EcConsumerOptions o;
  o.transport = transport;
  o.auth_token = std::move(auth_token);
  o.timeout = milliseconds(5000);
  o.compat = std::move(compat);
  auto c = EcConsumer::create(std::move(o));
  CRESCENT_CHECK(c.is_ok()) << c.status().to_string();
  return std::move(c).value();
}

float value(int seed, int64_t i) {
  return static_cast<float>(seed) * 1000.0f + static_cast<float>(i) * 0.25f;
}

std::function<Status(float*)> writer(int seed, int64_t num_floats,
                                     std::atomic<int>* num_calls = nullptr) {
  return [=](float* dst) {
    if (num_calls != nullptr)
      num_calls->fetch_add(1);
    for (int64_t i = 0; i < num_floats; ++i) {
      dst[i] = value(seed, i);
    }
    return Status::ok();
  };
}

EcTensorRef publish(EcProducer& p, const std::string& hash, int seed, int64_t num_tokens) {
  auto ref = p.publish(hash, num_tokens, kHidden, writer(seed, num_tokens * kHidden),
                       Deadline::after_ms(5000));
  CRESCENT_CHECK(ref.is_ok()) << ref.status().to_string();
  return *ref;
}

std::string name_of(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

bool has_values(const std::vector<float>& v, int seed) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != value(seed, static_cast<int64_t>(i)))
      return false;
  }
  return true;
}

// Waits until pred() or 3 s.
template <typename Pred>
bool eventually(Pred pred) {
  auto until = Clock::now() + milliseconds(3000);
  while (Clock::now() < until) {
    if (pred())
      return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return pred();
}

class EcConnectorTest : public ::testing::TestWithParam<TransportKind> {
 protected:
};

TEST_P(EcConnectorTest, RoundTripBytesAreEqualAndReservationsAreReleased) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  auto consumer = make_consumer(GetParam());
  std::vector<EcTensorRef> refs = {publish(*producer, "img0", 1, 100),
                                   publish(*producer, "img1", 2, 7)};
  EXPECT_EQ(refs[0].worker_addr, producer->worker_addr());
  EXPECT_EQ(refs[0].num_bytes, 100u * kHidden * 4);
  EXPECT_EQ(producer->metrics().num_reservations, 2);
  EXPECT_TRUE(producer->holds("img0"));
  std::vector<float> a(100 * kHidden, -1.0f);
  std::vector<float> b(7 * kHidden, -1.0f);
  std::vector<std::span<float>> dsts = {a, b};
  Status s = consumer->fetch(refs, dsts, Deadline::after_ms(5000));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(has_values(a, 1));
  EXPECT_TRUE(has_values(b, 2));
  EcProducerMetrics m = producer->metrics();
  EXPECT_EQ(m.num_reservations, 0);  // RELEASED came back before fetch returned
  EXPECT_EQ(m.num_pulls_served, 2u);
  EXPECT_EQ(m.num_releases, 2u);
  EXPECT_EQ(m.bytes_reserved, 0u);
  EXPECT_TRUE(producer->holds("img0"));  // still cached for the next request

  // The next request reuses the cached entry and the idle connection.
  bool was_cached = false;
  auto again = producer->publish("img0", 100, kHidden, writer(9, 100 * kHidden),
                                 Deadline::after_ms(5000), &was_cached);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(was_cached);
  std::vector<float> c(100 * kHidden, -1.0f);
  std::vector<std::span<float>> dst_c = {c};
  ASSERT_TRUE(consumer->fetch({&*again, 1}, dst_c, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(c, 1));
  EcConsumerMetrics cm = consumer->metrics();
  EXPECT_EQ(cm.num_fetches, 2u);
  EXPECT_EQ(cm.num_tensors, 3u);
  EXPECT_EQ(cm.num_failures, 0u);
  EXPECT_EQ(cm.num_connections_opened, 1u);
  // On shm the second fetch was a mapped copy, whose EC_RELEASE goes out after it returns.
  EXPECT_EQ(cm.num_mapped_copies, GetParam() == TransportKind::kShm ? 1u : 0u);
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EXPECT_EQ(producer->metrics().num_cache_hits, 1u);
  std::string text = producer->render_metrics("m");
  EXPECT_NE(text.find("crescent_ec_producer_pulls_total{model_name=\"m\"} 3\n"), std::string::npos)
      << text;
  EXPECT_NE(consumer->render_metrics("m").find("crescent_ec_consumer_tensors_total"),
            std::string::npos);
}

TEST_P(EcConnectorTest, RefsOfTwoProducersAreFetchedInOneCall) {
  auto p1 = make_producer(producer_options(GetParam(), "enc-1"));
  auto p2 = make_producer(producer_options(GetParam(), "enc-2"));
  auto consumer = make_consumer(GetParam());
  std::vector<EcTensorRef> refs = {publish(*p1, "x", 1, 50), publish(*p2, "y", 2, 60),
                                   publish(*p1, "z", 3, 10)};
  std::vector<float> a(50 * kHidden), b(60 * kHidden), c(10 * kHidden);
  std::vector<std::span<float>> dsts = {a, b, c};
  Status s = consumer->fetch(refs, dsts, Deadline::after_ms(5000));
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(has_values(a, 1));
  EXPECT_TRUE(has_values(b, 2));
  EXPECT_TRUE(has_values(c, 3));
  EXPECT_EQ(p1->metrics().num_reservations, 0);
  EXPECT_EQ(p2->metrics().num_reservations, 0);
  EXPECT_EQ(consumer->metrics().num_connections_opened, 2u);
}

TEST_P(EcConnectorTest, ConcurrentPublishesOfOneImageEncodeOnce) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  std::atomic<int> num_writes{0};
  constexpr int kThreads = 8;
  std::vector<EcTensorRef> refs(kThreads);
  std::vector<int> cached(kThreads, -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto slow = [&](float* dst) {
        num_writes.fetch_add(1);
        std::this_thread::sleep_for(milliseconds(50));
        return writer(4, 20 * kHidden)(dst);
      };
      bool was_cached = false;
      auto r = producer->publish("same", 20, kHidden, slow, Deadline::after_ms(5000), &was_cached);
      CRESCENT_CHECK(r.is_ok()) << r.status().to_string();
      refs[t] = *r;
      cached[t] = was_cached ? 1 : 0;
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_writes.load(), 1);
  int num_cached = 0;
  std::set<uint64_t> ids;
  for (int t = 0; t < kThreads; ++t) {
    num_cached += cached[t];
    ids.insert(refs[t].reservation_id);
  }
  EXPECT_EQ(num_cached, kThreads - 1);
  EXPECT_EQ(ids.size(), static_cast<size_t>(kThreads));
  EcProducerMetrics m = producer->metrics();
  EXPECT_EQ(m.num_reservations, kThreads);
  EXPECT_EQ(m.num_entries, 1);
  EXPECT_EQ(m.num_cache_hits, static_cast<uint64_t>(kThreads - 1));

  auto consumer = make_consumer(GetParam());
  std::vector<std::vector<float>> bufs(kThreads, std::vector<float>(20 * kHidden));
  std::vector<std::span<float>> dsts(bufs.begin(), bufs.end());
  ASSERT_TRUE(consumer->fetch(refs, dsts, Deadline::after_ms(5000)).is_ok());
  for (const auto& b : bufs) {
    EXPECT_TRUE(has_values(b, 4));
  }
  EXPECT_EQ(producer->metrics().num_reservations, 0);
}

TEST_P(EcConnectorTest, AFailedEncodeIsSharedWithConcurrentPublishesAndFreesTheSpace) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  std::atomic<int> num_writes{0};
  auto failing = [&](float*) {
    num_writes.fetch_add(1);
    std::this_thread::sleep_for(milliseconds(50));
    return internal_error("vision tower exploded");
  };
  std::vector<std::future<Status>> results;
  for (int t = 0; t < 4; ++t) {
    results.push_back(std::async(std::launch::async, [&] {
      return producer->publish("bad", 10, kHidden, failing, Deadline::after_ms(5000)).status();
    }));
  }
  for (auto& r : results) {
    Status s = r.get();
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("vision tower exploded"), std::string::npos) << s.to_string();
  }
  EXPECT_EQ(num_writes.load(), 1);
  EXPECT_FALSE(producer->holds("bad"));
  EXPECT_EQ(producer->metrics().bytes_used, 0u);
}

TEST_P(EcConnectorTest, FullPoolOfReservedEntriesIsRefusedAtOnce) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  o.pool_bytes = 4 * ((16 << 10) + kEntryHeader);
  auto producer = make_producer(o);
  constexpr int64_t kTokens = 64;  // 16 KiB: four fill the pool
  for (int i = 0; i < 4; ++i) {
    publish(*producer, "img" + std::to_string(i), i, kTokens);
  }
  auto start = Clock::now();
  auto r = producer->publish("one-more", kTokens, kHidden, writer(9, kTokens * kHidden),
                             Deadline::after_ms(5000));
  EXPECT_LT(Clock::now() - start, milliseconds(200));
  ASSERT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("65792 bytes"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("reserved"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(producer->metrics().num_refusals, 1u);
  EXPECT_FALSE(producer->holds("one-more"));
}

TEST_P(EcConnectorTest, FullPoolWaitSucceedsOnceAReleaseFreesSpace) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  o.pool_bytes = 4 * ((16 << 10) + kEntryHeader);
  o.full_pool_wait = milliseconds(3000);
  auto producer = make_producer(o);
  constexpr int64_t kTokens = 64;
  std::vector<EcTensorRef> refs;
  for (int i = 0; i < 4; ++i) {
    refs.push_back(publish(*producer, "img" + std::to_string(i), i, kTokens));
  }
  auto start = Clock::now();
  auto waiting = std::async(std::launch::async, [&] {
    return producer->publish("one-more", kTokens, kHidden, writer(9, kTokens * kHidden),
                             Deadline::after_ms(5000));
  });
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(waiting.wait_for(milliseconds(0)), std::future_status::timeout);
  ASSERT_TRUE(producer->release(refs[2].reservation_id).is_ok());
  auto r = waiting.get();
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_FALSE(producer->holds("img2"));  // the released entry was evicted for it
  EXPECT_TRUE(producer->holds("one-more"));
  EXPECT_EQ(producer->metrics().num_evictions, 1u);
}

TEST_P(EcConnectorTest, UnpulledReservationExpiresAndItsBytesReturn) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  o.pool_bytes = (64 << 10) + kEntryHeader;
  o.reservation_timeout = milliseconds(100);
  auto producer = make_producer(o);
  const EcProducerMetrics baseline = producer->metrics();
  EcTensorRef ref = publish(*producer, "img", 1, 256);  // the whole pool
  EXPECT_EQ(producer->metrics().bytes_reserved, (64u << 10) + kEntryHeader);
  // The background expiry thread ends it.
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EcProducerMetrics m = producer->metrics();
  EXPECT_EQ(m.num_expired_reservations, 1u);
  EXPECT_EQ(m.bytes_reserved, baseline.bytes_reserved);
  EXPECT_EQ(m.num_reserved_entries, baseline.num_reserved_entries);
  // The bytes are reusable: a new image takes the whole pool (the cached entry is evicted).
  publish(*producer, "next", 2, 256);
  EXPECT_FALSE(producer->holds("img"));

  // A late consumer is told the reservation expired.
  auto consumer = make_consumer(GetParam());
  std::vector<float> dst(256 * kHidden);
  std::vector<std::span<float>> dsts = {dst};
  Status s = consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("enc-a"), std::string::npos) << s.to_string();
}

TEST_P(EcConnectorTest, NormalPathReadsAtTheRefsLocationWithoutAcquire) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  std::atomic<int> num_acquired{0};
  o.on_acquired = [&](uint64_t) { num_acquired.fetch_add(1); };
  auto producer = make_producer(o);
  auto consumer = make_consumer(GetParam());
  std::vector<EcTensorRef> refs = {publish(*producer, "a", 1, 10), publish(*producer, "b", 2, 20),
                                   publish(*producer, "c", 3, 30)};
  for (const EcTensorRef& r : refs) {
    EXPECT_TRUE(r.has_location);
    EXPECT_NE(r.instance, 0u);
  }
  std::vector<float> a(10 * kHidden), b(20 * kHidden), c(30 * kHidden);
  std::vector<std::span<float>> dsts = {a, b, c};
  ASSERT_TRUE(consumer->fetch(refs, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(a, 1) && has_values(b, 2) && has_values(c, 3));
  EcProducerMetrics m = producer->metrics();
  EXPECT_EQ(num_acquired.load(), 0);
  EXPECT_EQ(m.num_acquires_served, 0u);
  EXPECT_EQ(m.num_pulls_served, 3u);
  EXPECT_EQ(m.num_bytes_served, 60u * kHidden * 4);
  EXPECT_EQ(m.num_reservations, 0);
  EXPECT_EQ(m.num_releases, 3u);

  // A ref without a location (an older encoder's) still works, through EC_ACQUIRE, in the
  // same call as a located one.
  std::vector<EcTensorRef> mixed = {publish(*producer, "a", 4, 10), publish(*producer, "d", 5, 5)};
  mixed[1].has_location = false;
  mixed[1].stamp = 0;  // older encoders had neither
  std::vector<float> d(5 * kHidden);
  std::vector<std::span<float>> mixed_dsts = {a, d};
  ASSERT_TRUE(consumer->fetch(mixed, mixed_dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(a, 1) && has_values(d, 5));
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  m = producer->metrics();
  EXPECT_EQ(num_acquired.load(), 1);
  EXPECT_EQ(m.num_acquires_served, 1u);
  EXPECT_EQ(m.num_pulls_served, 5u);
  EXPECT_EQ(m.num_reservations, 0);
  EXPECT_NE(producer->render_metrics("m").find(
                "crescent_ec_producer_acquires_total{model_name=\"m\"} 1\n"),
            std::string::npos);
}

// The reservation expires before the READ and another image takes its bytes: the READ gets
// the other image's bytes, and EC_RELEASED (was_held false) must fail the fetch.
TEST_P(EcConnectorTest, ReadOfAnExpiredReservationFailsInsteadOfReturningReusedBytes) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  o.pool_bytes = (64 << 10) + kEntryHeader;
  // Long enough that next's reservation outlives the rest of the test on a loaded machine
  // under TSan (100 ms was not), short enough for eventually() to see img's expire.
  o.reservation_timeout = milliseconds(1500);
  auto producer = make_producer(o);
  EcTensorRef stale = publish(*producer, "img", 1, 256);  // the whole pool
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EcTensorRef next = publish(*producer, "next", 2, 256);  // the same bytes, reused
  ASSERT_EQ(next.offset, stale.offset);
  ASSERT_FALSE(producer->holds("img"));
  auto consumer = make_consumer(GetParam());
  std::vector<float> dst(256 * kHidden, -1.0f);
  std::vector<std::span<float>> dsts = {dst};
  Status s = consumer->fetch({&stale, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_NE(s.message().find("expired"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("enc-a"), std::string::npos) << s.to_string();
  EXPECT_EQ(consumer->metrics().num_failures, 1u);
  EcProducerMetrics m = producer->metrics();
  EXPECT_EQ(m.num_pulls_served, 0u);
  EXPECT_EQ(m.num_reservations, 1);  // next's reservation is untouched
  // The live reservation still serves.
  ASSERT_TRUE(consumer->fetch({&next, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(dst, 2));
}

// A located release is confirmed only for this producer instance and the entry's location
// (a restarted encoder counts reservation ids from the start again).
TEST_P(EcConnectorTest, LocatedReleaseOfAnotherInstanceOrLocationIsNotHeld) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  auto consumer = make_consumer(GetParam());
  EcTensorRef ref = publish(*producer, "img", 1, 4);
  std::vector<float> dst(4 * kHidden);
  std::vector<std::span<float>> dsts = {dst};
  EcTensorRef other_instance = ref;
  other_instance.instance = ref.instance == 1 ? 2 : ref.instance - 1;
  Status s = consumer->fetch({&other_instance, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EcTensorRef other_offset = ref;
  other_offset.offset += 64;
  s = consumer->fetch({&other_offset, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.to_string();
  EXPECT_EQ(producer->metrics().num_reservations, 1);  // not ended by a release not its own
  ASSERT_TRUE(consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(dst, 1));
  EXPECT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
}

// shm: once the consumer has met the encoder (EC_HELLO, segment open), later refs are copied
// straight out of the mapped pool on the caller's thread, checked by their stamp; a stamp that
// does not match (here: a forged one; in life: an entry evicted during the copy) sends the ref
// down the control-connection path, which decides. tcp and ucx always take that path.
TEST_P(EcConnectorTest, LaterRefsAreCopiedFromTheMappedPoolAndCheckedByStamp) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  auto consumer = make_consumer(GetParam());
  const bool mapped = GetParam() == TransportKind::kShm;
  std::vector<float> dst(16 * kHidden, -1.0f);
  std::vector<std::span<float>> dsts = {dst};
  EcTensorRef first = publish(*producer, "first", 1, 16);
  EXPECT_NE(first.stamp, 0u);
  ASSERT_TRUE(consumer->fetch({&first, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_EQ(consumer->metrics().num_mapped_copies, 0u);  // first contact: the slow path

  for (int seed = 2; seed < 6; ++seed) {
    EcTensorRef ref = publish(*producer, name_of("img", seed), seed, 16);
    ASSERT_TRUE(consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(5000)).is_ok());
    EXPECT_TRUE(has_values(dst, seed)) << seed;
  }
  EXPECT_EQ(consumer->metrics().num_mapped_copies, mapped ? 4u : 0u);
  // The encoder still hears of every pull: the located EC_RELEASE follows asynchronously.
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EXPECT_EQ(producer->metrics().num_pulls_served, 5u);
  EXPECT_EQ(producer->metrics().bytes_reserved, 0u);

  // A stamp that is not the entry's: not trusted, the slow path serves it (the reservation is
  // live, so the bytes are confirmed by EC_RELEASED).
  EcTensorRef forged = publish(*producer, "forged", 7, 16);
  forged.stamp = forged.stamp == 1 ? 2 : forged.stamp - 1;
  ASSERT_TRUE(consumer->fetch({&forged, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(dst, 7));
  EXPECT_EQ(consumer->metrics().num_stale_mapped_copies, mapped ? 1u : 0u);
  EXPECT_EQ(consumer->metrics().num_mapped_copies, mapped ? 4u : 0u);
  // An expired ref is not copied either: the encoder says what became of it.
  EcTensorRef expired = publish(*producer, "expired", 8, 16);
  expired.expires_at_unix_ms = 1;
  ASSERT_TRUE(consumer->fetch({&expired, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_EQ(consumer->metrics().num_mapped_copies, mapped ? 4u : 0u);
  EXPECT_NE(consumer->render_metrics("m").find("crescent_ec_consumer_mapped_copies_total"),
            std::string::npos);
}

// A location outside every region the encoder has: the READ fails cleanly.
TEST_P(EcConnectorTest, ReadOfARegionTheEncoderDoesNotHaveFails) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  auto consumer = make_consumer(GetParam());
  EcTensorRef ref = publish(*producer, "img", 1, 4);
  EcTensorRef bad = ref;
  bad.region_id += 1000;
  std::vector<float> dst(4 * kHidden);
  std::vector<std::span<float>> dsts = {dst};
  Status s = consumer->fetch({&bad, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("enc-a"), std::string::npos) << s.to_string();
  // The failed fetch released the reservation (EC_RELEASE queued before closing).
  EXPECT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EXPECT_EQ(producer->metrics().num_pulls_served, 0u);
  // The consumer recovers (a new connection, the segment reopened).
  EcTensorRef good = publish(*producer, "img", 1, 4);
  ASSERT_TRUE(consumer->fetch({&good, 1}, dsts, Deadline::after_ms(5000)).is_ok());
  EXPECT_TRUE(has_values(dst, 1));
}

TEST_P(EcConnectorTest, ReleaseOfUnknownIdIsNotFound) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  EXPECT_EQ(producer->release(12345).code(), StatusCode::kNotFound);
  EcTensorRef ref = publish(*producer, "img", 1, 4);
  EXPECT_TRUE(producer->release(ref.reservation_id).is_ok());
  EXPECT_EQ(producer->release(ref.reservation_id).code(), StatusCode::kNotFound);
}

TEST_P(EcConnectorTest, ConsumerReleaseEndsReservationsWithoutFetching) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  auto consumer = make_consumer(GetParam());
  std::vector<EcTensorRef> refs = {publish(*producer, "a", 1, 4), publish(*producer, "b", 2, 4)};
  consumer->release(refs);
  EXPECT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EXPECT_EQ(producer->metrics().num_releases, 2u);
}

TEST_P(EcConnectorTest, CompatMismatchIsRefusedNamingBothSides) {
  auto producer = make_producer(producer_options(GetParam(), "enc-a"));
  EcCompat other = test_compat();
  other.vision_model = "other-vit";
  auto consumer = make_consumer(GetParam(), other);
  EcTensorRef ref = publish(*producer, "img", 1, 4);
  std::vector<float> dst(4 * kHidden);
  std::vector<std::span<float>> dsts = {dst};
  Status s = consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("\"other-vit\" at the prefill worker"), std::string::npos)
      << s.to_string();
  EXPECT_NE(s.message().find("\"test-vit\" at encoder enc-a"), std::string::npos) << s.to_string();

  // A hidden size that disagrees with the ref's shape is refused before connecting.
  EcCompat wide = test_compat();
  wide.hidden_size = 2 * kHidden;
  auto wide_consumer = make_consumer(GetParam(), wide);
  s = wide_consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s.to_string();
}

TEST_P(EcConnectorTest, AuthTokenMustMatchOnTheControlAndTransferConnections) {
  EcProducerOptions o = producer_options(GetParam(), "enc-auth");
  o.auth_token = "ec-shared-token-0123456789";
  auto producer = make_producer(o);
  EcTensorRef ref = publish(*producer, "img", 3, 4);
  std::vector<float> dst(4 * kHidden, -1.0f);
  std::vector<std::span<float>> dsts = {dst};
  auto good = make_consumer(GetParam(), test_compat(), "ec-shared-token-0123456789");
  Status ok = good->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  ASSERT_TRUE(ok.is_ok()) << ok.to_string();
  EXPECT_TRUE(has_values(dst, 3));
  auto wrong = make_consumer(GetParam(), test_compat(), "ec-another-token-012345678");
  Status denied = wrong->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(denied.code(), StatusCode::kPermissionDenied) << denied.to_string();
  EXPECT_NE(denied.message().find("another token"), std::string::npos) << denied.to_string();
  auto none = make_consumer(GetParam());
  Status refused = none->fetch({&ref, 1}, dsts, Deadline::after_ms(5000));
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.to_string();
  EXPECT_NE(refused.message().find("requires authentication"), std::string::npos)
      << refused.to_string();
  ASSERT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
}

TEST_P(EcConnectorTest, DestroyedProducerFailsTheFetchWithinItsDeadline) {
  EcProducerOptions o = producer_options(GetParam(), "enc-doomed");
  std::promise<void> acquired;
  std::atomic<bool> fired{false};
  o.on_acquired = [&](uint64_t) {
    if (!fired.exchange(true)) {
      acquired.set_value();
      // Holds the reader until the producer's destructor aborts the connection.
      std::this_thread::sleep_for(milliseconds(100));
    }
  };
  auto producer = make_producer(o);
  auto consumer = make_consumer(GetParam());
  EcTensorRef ref = publish(*producer, "img", 1, 1024);
  ref.has_location = false;  // the EC_ACQUIRE path, where on_acquired can hold the producer
  ref.stamp = 0;
  std::vector<float> dst(1024 * kHidden);
  auto start = Clock::now();
  auto fetched = std::async(std::launch::async, [&] {
    std::vector<std::span<float>> dsts = {dst};
    return consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(3000));
  });
  ASSERT_EQ(acquired.get_future().wait_for(std::chrono::seconds(5)), std::future_status::ready)
      << "the fetch never reached EC_ACQUIRE";
  producer.reset();
  Status s = fetched.get();
  EXPECT_LT(Clock::now() - start, milliseconds(3500));
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded)
      << s.to_string();
  EXPECT_NE(s.message().find("enc-doomed"), std::string::npos) << s.to_string();
  EXPECT_EQ(consumer->metrics().num_failures, 1u);
}

TEST_P(EcConnectorTest, SilentEncoderFailsTheFetchAtTheDeadline) {
  // A listener that accepts and never answers (a frozen encoder process).
  auto listener = net::listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.is_ok());
  int port = *net::local_port(*listener);
  EcTensorRef ref;
  ref.mm_hash = "img";
  ref.engine_id = "enc-frozen";
  ref.worker_addr = "tcp://127.0.0.1:" + std::to_string(port);
  ref.reservation_id = 1;
  ref.shape = {4, kHidden};
  ref.num_bytes = 4 * kHidden * 4;
  auto consumer = make_consumer(GetParam());
  std::vector<float> dst(4 * kHidden);
  std::vector<std::span<float>> dsts = {dst};
  auto start = Clock::now();
  Status s = consumer->fetch({&ref, 1}, dsts, Deadline::after_ms(500));
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
  EXPECT_NE(s.message().find("enc-frozen"), std::string::npos) << s.to_string();
}

// A hand-driven consumer: HELLO + ACQUIRE on a raw socket, then the socket is dropped.
TEST_P(EcConnectorTest, DroppedConsumerConnectionReleasesWhatItAcquired) {
  EcProducerOptions o = producer_options(GetParam(), "enc-a");
  // Room for HELLO + ACQUIRE before the reservation would expire, on a loaded TSan run.
  o.reservation_timeout = milliseconds(1000);
  auto producer = make_producer(o);
  EcTensorRef ref = publish(*producer, "img", 1, 4);
  std::string host;
  int port = 0;
  ASSERT_TRUE(net::parse_host_port(ref.worker_addr.substr(6), &host, &port).is_ok());
  auto fd = net::connect_tcp(host, port, Deadline::after_ms(2000));
  ASSERT_TRUE(fd.is_ok());
  auto send = [&](ec_protocol::MessageType type, const std::string& payload) {
    ASSERT_TRUE(
        net::write_frame(*fd, static_cast<uint16_t>(type), payload, Deadline::after_ms(2000))
            .is_ok());
  };
  auto receive = [&]() {
    auto f = net::read_frame(*fd, protocol::kMaxPayloadBytes, Deadline::after_ms(2000));
    CRESCENT_CHECK(f.is_ok()) << f.status().to_string();
    return *f;
  };
  ec_protocol::Hello hello;
  hello.compat = test_compat();
  hello.consumer_name = "raw";
  hello.heartbeat_interval_ms = 10'000;
  send(ec_protocol::MessageType::kHello, ec_protocol::encode(hello));
  EXPECT_EQ(receive().type, static_cast<uint16_t>(ec_protocol::MessageType::kHelloOk));
  send(ec_protocol::MessageType::kAcquire,
       ec_protocol::encode(ec_protocol::Acquire{ref.reservation_id, ref.mm_hash, ref.num_bytes}));
  net::Frame f = receive();
  ASSERT_EQ(f.type, static_cast<uint16_t>(ec_protocol::MessageType::kAcquired));
  EXPECT_EQ(producer->metrics().num_pulling, 1);
  // Pinned: the reservation timeout passes without expiring it.
  std::this_thread::sleep_for(milliseconds(1150));
  producer->expire_now();
  EXPECT_EQ(producer->metrics().num_reservations, 1);
  EXPECT_EQ(producer->metrics().num_expired_reservations, 0u);
  fd->reset();  // the consumer goes away
  EXPECT_TRUE(eventually([&] { return producer->metrics().num_reservations == 0; }));
  EXPECT_EQ(producer->metrics().num_releases, 1u);
  EXPECT_EQ(producer->metrics().num_pulling, 0);
}

std::string transport_test_name(const ::testing::TestParamInfo<TransportKind>& info) {
  return std::string(transfer::transport_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(Transports, EcConnectorTest,
                         ::testing::ValuesIn(transfer::available_transports()),
                         transport_test_name);

}  // namespace
}  // namespace crescent::disagg
