// EPD failure cases with real processes on 127.0.0.1 and the tiny Qwen2-VL model (issue 12,
// "Must show", pool tests): a full pool of reserved tensors (refused with 503 without evicting
// them, or waited on until a reservation expires or is released); an unpulled reservation that
// expires; one image in 8 concurrent requests (encoded once); a prefill worker killed before it
// pulls; an encoder killed mid-request (502 naming it, a healthy proxy, fallback to local
// encoding or 502 on the prefill worker, a restarted encoder serving again); the proxy's
// encoder call answered but the prefill worker never pulling. Each case is timed against its
// deadline, ends with the encoder's reservations and reserved bytes at zero (read through the
// crescent_ec_producer_* gauges of /metrics), and is followed by a request that succeeds.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "epd/epd_test_util.h"
#include "proxy/proxy_process.h"
#include "server/serve_process.h"

namespace crescent::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// 128x128 -> 5x5 merged tokens of 64 floats: 6400 bytes. A 16 KiB pool holds two, not three.
std::string image(int seed) {
  return png_data_url(128, 128, seed);
}

json body_with(const std::vector<std::string>& urls, const std::string& text = "Describe.") {
  return chat_body_of_urls(urls, text, /*max_tokens=*/4);
}

json with_params(json body, const Reply& encoded) {
  body["ec_transfer_params"] = encoded.body["ec_transfer_params"];
  return body;
}

std::string message_of(const Reply& r) {
  if (!r.body.is_object() || !r.body.contains("error")) {
    return r.error + r.body.dump();
  }
  return r.body["error"].value("message", "");
}

// 8 concurrent requests of one prompt are batched (and may hit each other's prefix cache), so
// their logprobs carry float rounding of other shapes than the reference's single request:
// measured up to ~1e-3 here; pd_correctness_test allows 5e-3 for the same reason.
constexpr double kBatchRounding = 5e-3;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The encoder's pool holds no reservation (reserved, pulling or entries pinned by one): what
// is left are unreserved entries, which the pool evicts for new images.
void expect_pool_at_baseline(int encoder_port, milliseconds timeout, const std::string& what) {
  EXPECT_EQ(wait_for_metric(encoder_port, "crescent_ec_producer_reservations", 0, timeout), 0)
      << what;
  EXPECT_EQ(metric(encoder_port, "crescent_ec_producer_pool_reserved_bytes"), 0) << what;
  EXPECT_EQ(metric(encoder_port, "crescent_ec_producer_reserved_entries"), 0) << what;
  EXPECT_EQ(metric(encoder_port, "crescent_ec_producer_pulling"), 0) << what;
  EXPECT_LE(metric(encoder_port, "crescent_ec_producer_pool_used_bytes"),
            metric(encoder_port, "crescent_ec_producer_pool_bytes"))
      << what;
}

class EpdFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    colocated_ = new ServeProcess(model_args({"--role", "both"}));
    pd_ = new ServeProcess(model_args({"--role", "both"}));
  }
  static void TearDownTestSuite() {
    delete pd_;
    delete colocated_;
  }
  // The colocated answer (no encoder) for `body`.
  static Reply want(const json& body) { return post_json(colocated_->port(), body); }

  static ServeProcess* colocated_;  // the reference: encodes its own images
  static ServeProcess* pd_;         // a --role both consumer (falls back to local encoding)
};

ServeProcess* EpdFaultTest::colocated_ = nullptr;
ServeProcess* EpdFaultTest::pd_ = nullptr;

// (a) Every tensor of a 16 KiB pool is reserved: a third image is refused with 503 at once,
// directly and through the proxy, and the reserved tensors are not evicted (P still pulls them).
TEST_F(EpdFaultTest, FullPoolOfReservedTensorsAnswers503WithoutEvicting) {
  ServeProcess encoder(model_args(
      {"--role", "encode", "--ec-pool-size", "16KiB", "--ec-reservation-timeout-s", "20"}));
  ProxyProcess proxy({"--encode", url_of(encoder.port()), "--pd", url_of(pd_->port())});
  wait_until_healthy(proxy.port(), "the 1E1PD proxy");
  const json held = body_with({image(101), image(102)});
  Reply e = post_json(encoder.port(), held);
  ASSERT_EQ(e.status, 200) << e.error << e.body.dump();
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), 2);
  // Each tensor is preceded by the pool's 64-byte header (its stamp).
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pool_reserved_bytes"), 2 * (6400 + 64));

  const json third = body_with({image(103)});
  Reply direct = post_json(encoder.port(), third);
  EXPECT_EQ(direct.status, 503) << direct.body.dump();
  EXPECT_TRUE(contains(message_of(direct), "pool is full")) << direct.body.dump();
  EXPECT_LT(direct.seconds, 2.0) << "without --ec-full-pool-wait-s a full pool answers at once";
  Reply proxied = post_json(proxy.port(), third);
  EXPECT_EQ(proxied.status, 503) << proxied.body.dump();
  EXPECT_TRUE(contains(message_of(proxied), url_of(encoder.port())))
      << "the proxy names the encoder: " << proxied.body.dump();
  EXPECT_TRUE(contains(message_of(proxied), "pool is full")) << proxied.body.dump();
  EXPECT_LT(proxied.seconds, 2.0);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_evictions_total"), 0);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), 2);
  EXPECT_GE(metric(encoder.port(), "crescent_ec_producer_refusals_total"), 2);

  // The reserved tensors are intact: P pulls both and answers as colocated.
  const double pulled = metric(pd_->port(), "crescent_ec_images_pulled_total");
  const double fallback = metric(pd_->port(), "crescent_ec_fallback_local_total");
  expect_same_answer(post_json(pd_->port(), with_params(held, e)), want(held), "held images");
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_images_pulled_total") - pulled, 2);
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_fallback_local_total"), fallback);
  expect_pool_at_baseline(encoder.port(), seconds(2), "after the pull");

  // Released entries are evictable: the refused image now goes through the proxy.
  expect_same_answer(post_json(proxy.port(), third), want(third), "after the release");
  EXPECT_GE(metric(encoder.port(), "crescent_ec_producer_evictions_total"), 1);
  expect_pool_at_baseline(encoder.port(), seconds(2), "at the end");
}

// (a) With --ec-full-pool-wait-s the refused image waits instead: for the expiry of the
// reservations that fill the pool, or (with long reservations) for P's pull to release them.
TEST_F(EpdFaultTest, FullPoolWaitsForAnExpiryOrARelease) {
  {
    ServeProcess encoder(
        model_args({"--role", "encode", "--ec-pool-size", "16KiB", "--ec-reservation-timeout-s",
                    "1.5", "--ec-full-pool-wait-s", "10"}));
    ASSERT_EQ(post_json(encoder.port(), body_with({image(111), image(112)})).status, 200);
    const json third = body_with({image(113)});
    Reply waited = post_json(encoder.port(), third);
    ASSERT_EQ(waited.status, 200) << waited.body.dump();
    EXPECT_GT(waited.seconds, 0.8) << "it could only fit once a reservation expired";
    EXPECT_LT(waited.seconds, 5.0) << "1.5 s reservations, expiry checked every 150 ms";
    // One expiry frees room for the third image; the second reservation may or may not have
    // expired by then (the two were written a few ms apart, more under sanitizers).
    const double expired =
        metric(encoder.port(), "crescent_ec_producer_expired_reservations_total");
    EXPECT_GE(expired, 1);
    EXPECT_LE(expired, 2);
    expect_same_answer(post_json(pd_->port(), with_params(third, waited)), want(third),
                       "the waited image");
    expect_pool_at_baseline(encoder.port(), seconds(2), "expiry variant");
  }
  ServeProcess encoder(
      model_args({"--role", "encode", "--ec-pool-size", "16KiB", "--ec-reservation-timeout-s", "60",
                  "--ec-full-pool-wait-s", "10"}));
  const json held = body_with({image(121), image(122)});
  Reply e = post_json(encoder.port(), held);
  ASSERT_EQ(e.status, 200) << e.body.dump();
  const json third = body_with({image(123)});
  Reply waited;
  std::atomic<bool> is_done{false};
  std::thread waiter([&] {
    waited = post_json(encoder.port(), third);
    is_done = true;
  });
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_FALSE(is_done.load()) << "the pool is full of reserved tensors: it must wait";
  const auto pulled_at = Clock::now();
  expect_same_answer(post_json(pd_->port(), with_params(held, e)), want(held), "held images");
  waiter.join();
  ASSERT_EQ(waited.status, 200) << waited.body.dump();
  EXPECT_LT(seconds_since(pulled_at), 3.0) << "P's release wakes the waiting request";
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_expired_reservations_total"), 0);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_refusals_total"), 0);
  expect_same_answer(post_json(pd_->port(), with_params(third, waited)), want(third),
                     "the waited image");
  expect_pool_at_baseline(encoder.port(), seconds(2), "release variant");
}

// (b) Params asked of E directly and never given to P: the bytes come back at the expiry.
TEST_F(EpdFaultTest, UnpulledReservationExpiresAndGivesItsBytesBack) {
  ServeProcess encoder(model_args({"--role", "encode", "--ec-reservation-timeout-s", "1"}));
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pool_reserved_bytes"), 0);
  const auto start = Clock::now();
  Reply e = post_json(encoder.port(), body_with({image(201), png_data_url(64, 64, 202)}));
  ASSERT_EQ(e.status, 200) << e.body.dump();
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), 2);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pool_reserved_bytes"),
            6400 + 4 * 256 + 2 * 64);  // two tensors and their 64-byte headers
  EXPECT_EQ(
      wait_for_metric(encoder.port(), "crescent_ec_producer_reservations", 0, milliseconds(4000)),
      0);
  const double took = seconds_since(start);
  EXPECT_GT(took, 0.9) << "not before the reservation timeout";
  EXPECT_LT(took, 3.0) << "1 s timeout, expiry checked every 100 ms";
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_expired_reservations_total"), 2);
  expect_pool_at_baseline(encoder.port(), seconds(1), "after the expiry");
  // The expired params are refused by the producer: P encodes locally (default fallback).
  const json body = body_with({image(201)});
  const double fallback = metric(pd_->port(), "crescent_ec_fallback_local_total");
  expect_same_answer(post_json(pd_->port(), with_params(body, e)), want(body), "expired params");
  EXPECT_GE(metric(pd_->port(), "crescent_ec_fallback_local_total") - fallback, 1);
  // Unaffected: a fresh request is pulled.
  Reply fresh = post_json(encoder.port(), body);
  ASSERT_EQ(fresh.status, 200);
  const double pulled = metric(pd_->port(), "crescent_ec_images_pulled_total");
  expect_same_answer(post_json(pd_->port(), with_params(body, fresh)), want(body), "fresh params");
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_images_pulled_total") - pulled, 1);
  expect_pool_at_baseline(encoder.port(), seconds(1), "at the end");
}

// (c) One image in 8 concurrent requests to E: encoded once, 8 reservations, all pulled by P;
// and 8 concurrent requests with one new image through the proxy: encoded once.
TEST_F(EpdFaultTest, SameImageInEightConcurrentRequestsIsEncodedOnce) {
  ServeProcess encoder(model_args({"--role", "encode"}));
  ProxyProcess proxy({"--encode", url_of(encoder.port()), "--pd", url_of(pd_->port())});
  wait_until_healthy(proxy.port(), "the 1E1PD proxy");
  constexpr int kRequests = 8;
  const json body = body_with({png_data_url(300, 300, 301)});
  std::vector<Reply> encoded(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { encoded[i] = post_json(encoder.port(), body); });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  threads.clear();
  std::set<uint64_t> reservation_ids;
  for (const Reply& e : encoded) {
    ASSERT_EQ(e.status, 200) << e.error << e.body.dump();
    const json& item = e.body["ec_transfer_params"]["items"][0];
    EXPECT_EQ(item["mm_hash"], encoded[0].body["ec_transfer_params"]["items"][0]["mm_hash"]);
    reservation_ids.insert(item["reservation_id"].get<uint64_t>());
  }
  EXPECT_EQ(reservation_ids.size(), size_t{kRequests}) << "one reservation per request";
  EXPECT_EQ(metric(encoder.port(), "crescent_encoder_images_total"), 1);
  EXPECT_EQ(metric(encoder.port(), "crescent_encoder_pool_hits_total"), kRequests - 1);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_cache_hits_total"), kRequests - 1);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_publishes_total"), kRequests);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), kRequests);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_entries"), 1);

  const Reply reference = want(body);
  const double pulled = metric(pd_->port(), "crescent_ec_images_pulled_total");
  const double encoded_on_pd = metric(pd_->port(), "crescent_encoder_images_total");
  std::vector<Reply> answers(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back(
        [&, i] { answers[i] = post_json(pd_->port(), with_params(body, encoded[i])); });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  threads.clear();
  for (int i = 0; i < kRequests; ++i) {
    expect_same_tokens(answers[i], reference, "concurrent pull " + std::to_string(i),
                       kBatchRounding);
  }
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_images_pulled_total") - pulled, kRequests);
  EXPECT_EQ(metric(pd_->port(), "crescent_encoder_images_total"), encoded_on_pd);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pulls_total"), kRequests);
  expect_pool_at_baseline(encoder.port(), seconds(2), "after the pulls");

  // Through the proxy: a new image in 8 concurrent requests.
  const json other = body_with({jpeg_data_url(200, 120, 302)});
  const Reply other_reference = want(other);
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { answers[i] = post_json(proxy.port(), other); });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  for (int i = 0; i < kRequests; ++i) {
    expect_same_tokens(answers[i], other_reference, "through the proxy " + std::to_string(i),
                       kBatchRounding);
  }
  EXPECT_EQ(metric(encoder.port(), "crescent_encoder_images_total"), 2);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pulls_total"), 2 * kRequests);
  expect_pool_at_baseline(encoder.port(), seconds(2), "at the end");
}

// (d) P dies before it pulls: SIGKILLed after E answered (while it held a control connection
// to E), or SIGKILLed with the request in hand (stopped before it could read it). E drops the
// connection, and the reservations end by expiry.
TEST_F(EpdFaultTest, ConsumerKilledBeforePullingLeavesReservationsToExpiry) {
  ServeProcess encoder(model_args({"--role", "encode", "--ec-reservation-timeout-s", "1.5"}));
  {
    ServeProcess doomed(model_args({"--role", "both"}));
    // A first pull leaves an idle control connection from P to E.
    const json warm = body_with({image(401)});
    Reply e = post_json(encoder.port(), warm);
    ASSERT_EQ(e.status, 200);
    expect_same_answer(post_json(doomed.port(), with_params(warm, e)), want(warm), "warm-up");
    EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_connections"), 1);

    Reply orphan = post_json(encoder.port(), body_with({image(402), image(403)}));
    ASSERT_EQ(orphan.status, 200);
    const auto killed_at = Clock::now();
    ASSERT_EQ(::kill(doomed.pid(), SIGKILL), 0);
    EXPECT_EQ(wait_for_metric(encoder.port(), "crescent_ec_producer_connections", 0, seconds(5)), 0)
        << "E notices the dead consumer's connection";
    EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), 2)
        << "unpulled reservations are not the connection's: they wait for their deadline";
    expect_pool_at_baseline(encoder.port(), seconds(4), "P killed after E answered");
    EXPECT_LT(seconds_since(killed_at), 3.0);
    EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_expired_reservations_total"), 2);
  }
  {
    ServeProcess doomed(model_args({"--role", "both"}));
    const json body = body_with({image(404)});
    Reply e = post_json(encoder.port(), body);
    ASSERT_EQ(e.status, 200);
    ASSERT_EQ(::kill(doomed.pid(), SIGSTOP), 0);
    Reply lost;
    std::thread client([&] {
      lost = post_json(doomed.port(), with_params(body, e), "/v1/chat/completions", seconds(20));
    });
    std::this_thread::sleep_for(milliseconds(300));
    const auto killed_at = Clock::now();
    ASSERT_EQ(::kill(doomed.pid(), SIGKILL), 0);
    client.join();
    EXPECT_EQ(lost.status, 0) << "the client loses its connection: " << lost.body.dump();
    EXPECT_LT(seconds_since(killed_at), 2.0);
    expect_pool_at_baseline(encoder.port(), seconds(4), "P killed holding the request");
    EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_expired_reservations_total"), 3);
    EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_pulls_total"), 1);
  }
  // Unaffected: another P pulls from the same encoder.
  const json body = body_with({image(405)});
  Reply e = post_json(encoder.port(), body);
  ASSERT_EQ(e.status, 200);
  expect_same_answer(post_json(pd_->port(), with_params(body, e)), want(body), "afterwards");
  expect_pool_at_baseline(encoder.port(), seconds(2), "at the end");
}

// (e) An encoder SIGKILLed while the proxy waits for it (stopped first, so that the kill lands
// mid-request): the client gets 502 naming it at once, the proxy stays healthy, the other
// encoder's reservation for the failed request expires; a P holding params of the dead encoder
// encodes locally (default) or answers 502 (--no-ec-fallback-local) within
// --ec-transfer-timeout-s; an encoder restarted on the same port serves again.
TEST_F(EpdFaultTest, EncoderKilledMidRequestGives502AndTheRestRecovers) {
  const int dead_port = free_port();
  auto dead = std::make_unique<ServeProcess>(
      model_args({"--role", "encode", "--port", std::to_string(dead_port)}));
  ServeProcess other(model_args({"--role", "encode", "--ec-reservation-timeout-s", "1.5"}));
  ServeProcess strict(
      model_args({"--role", "both", "--no-ec-fallback-local", "--ec-transfer-timeout-s", "3"}));
  ProxyProcess proxy({"--encode", url_of(dead_port), "--encode", url_of(other.port()), "--pd",
                      url_of(pd_->port()), "--encode-timeout-s", "30"});

  // Params of the encoder about to die, with P and the strict P connected to it.
  const json held = body_with({image(501)});
  Reply e1 = post_json(dead_port, held);
  Reply e2 = post_json(dead_port, held);
  ASSERT_EQ(e1.status, 200);
  ASSERT_EQ(e2.status, 200);
  for (int port : {pd_->port(), strict.port()}) {
    const json warm = body_with({image(port == strict.port() ? 502 : 503)});
    Reply w = post_json(dead_port, warm);
    ASSERT_EQ(w.status, 200);
    expect_same_answer(post_json(port, with_params(warm, w)), want(warm), "warm-up");
  }

  // Two images: round-robin sends one to each encoder.
  const json two = body_with({image(504), image(505)});
  ASSERT_EQ(::kill(dead->pid(), SIGSTOP), 0);
  Reply failed;
  std::thread client([&] { failed = post_json(proxy.port(), two); });
  std::this_thread::sleep_for(milliseconds(500));
  const auto killed_at = Clock::now();
  ASSERT_EQ(::kill(dead->pid(), SIGKILL), 0);
  client.join();
  EXPECT_EQ(failed.status, 502) << failed.error << failed.body.dump();
  EXPECT_TRUE(contains(message_of(failed), url_of(dead_port)))
      << "the 502 names the dead encoder: " << failed.body.dump();
  EXPECT_LT(seconds_since(killed_at), 3.0);
  int health = 0;
  http_get(proxy.port(), "/health", &health);
  EXPECT_EQ(health, 200) << "the proxy stays healthy";
  // The other encoder's half of the failed request is never pulled: it expires.
  expect_pool_at_baseline(other.port(), seconds(4), "the other encoder");

  // P holds params of the dead encoder: local encoding by default, 502 when strict, both
  // within --ec-transfer-timeout-s (3 s for the strict one).
  const double fallback = metric(pd_->port(), "crescent_ec_fallback_local_total");
  Reply local = post_json(pd_->port(), with_params(held, e1));
  expect_same_answer(local, want(held), "fallback after the encoder died");
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_fallback_local_total") - fallback, 1);
  EXPECT_LT(local.seconds, 30.0);
  Reply refused = post_json(strict.port(), with_params(held, e2));
  EXPECT_EQ(refused.status, 502) << refused.error << refused.body.dump();
  EXPECT_TRUE(contains(message_of(refused), "encoder")) << refused.body.dump();
  EXPECT_LT(refused.seconds, 4.0);
  // The strict P still serves what it can encode.
  expect_same_answer(post_json(strict.port(), held), want(held), "strict P without params");

  // Restarted on the same port: requests through the proxy succeed again, on both encoders.
  dead.reset();
  ServeProcess restarted(model_args({"--role", "encode", "--port", std::to_string(dead_port)}));
  ASSERT_EQ(restarted.port(), dead_port);
  for (int i = 0; i < 3; ++i) {
    const json body = body_with({image(510 + i), image(504)}, "Again " + std::to_string(i));
    expect_same_answer(post_json(proxy.port(), body), want(body), "after the restart");
  }
  EXPECT_GE(metric(restarted.port(), "crescent_ec_producer_pulls_total"), 1);
  expect_pool_at_baseline(restarted.port(), seconds(2), "restarted encoder");
  expect_pool_at_baseline(other.port(), seconds(2), "the other encoder at the end");
}

// (e) An encoder that stops answering (SIGSTOP: its sockets stay open) with P connected to it:
// P's pull fails by --ec-transfer-timeout-s, then P encodes locally (default) or answers an
// error (--no-ec-fallback-local). Once the encoder runs again, its reservations end.
TEST_F(EpdFaultTest, SilentEncoderFailsThePullWithinTheTransferTimeout) {
  ServeProcess encoder(model_args({"--role", "encode", "--ec-reservation-timeout-s", "3"}));
  ServeProcess lenient(model_args({"--role", "both", "--ec-transfer-timeout-s", "2"}));
  ServeProcess strict(
      model_args({"--role", "both", "--no-ec-fallback-local", "--ec-transfer-timeout-s", "2"}));
  const json body = body_with({image(701)});
  std::vector<Reply> params;
  for (int i = 0; i < 4; ++i) {
    params.push_back(post_json(encoder.port(), body));
    ASSERT_EQ(params.back().status, 200);
  }
  // Both hold a control connection to E.
  expect_same_answer(post_json(lenient.port(), with_params(body, params[0])), want(body), "warm");
  expect_same_answer(post_json(strict.port(), with_params(body, params[1])), want(body), "warm");
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_connections"), 2);

  // Without their stamps, so that P cannot copy them out of E's mapped pool (which it would,
  // correctly, for the first 3 heartbeat intervals of the silence): the pull must go to E.
  for (Reply* p : {&params[2], &params[3]}) {
    for (json& item : p->body["ec_transfer_params"]["items"]) {
      item.erase("stamp");
    }
  }
  ASSERT_EQ(::kill(encoder.pid(), SIGSTOP), 0);
  Reply local;
  Reply refused;
  std::thread a([&] { local = post_json(lenient.port(), with_params(body, params[2])); });
  std::thread b([&] { refused = post_json(strict.port(), with_params(body, params[3])); });
  a.join();
  b.join();
  ASSERT_EQ(::kill(encoder.pid(), SIGCONT), 0);
  expect_same_answer(local, want(body), "fallback from a silent encoder");
  EXPECT_LT(local.seconds, 4.5) << "--ec-transfer-timeout-s 2, then a local encode";
  EXPECT_GT(local.seconds, 1.5) << "the pull waited for the timeout";
  EXPECT_EQ(metric(lenient.port(), "crescent_ec_fallback_local_total"), 1);
  EXPECT_TRUE(refused.status == 502 || refused.status == 504)
      << refused.status << " " << refused.body.dump();
  EXPECT_TRUE(contains(message_of(refused), "encoder")) << refused.body.dump();
  EXPECT_LT(refused.seconds, 4.0) << "--ec-transfer-timeout-s 2";
  // E resumes: what the failed pulls held ends (closed connections, or expiry at 3 s).
  expect_pool_at_baseline(encoder.port(), seconds(5), "after the silence");
  const json other = body_with({image(702)});
  Reply e = post_json(encoder.port(), other);
  ASSERT_EQ(e.status, 200);
  expect_same_answer(post_json(strict.port(), with_params(other, e)), want(other), "afterwards");
  expect_pool_at_baseline(encoder.port(), seconds(2), "at the end");
}

// (f) The proxy's call to E succeeds but P never pulls: P refuses the request before pulling
// (a parameter E never sees), or P is down. E's reservation expires; P's blocks are free.
TEST_F(EpdFaultTest, PrefillRefusesOrNeverPullsAndTheReservationEnds) {
  ServeProcess encoder(model_args({"--role", "encode", "--ec-reservation-timeout-s", "1.5"}));
  ProxyProcess proxy({"--encode", url_of(encoder.port()), "--pd", url_of(pd_->port())});
  wait_until_healthy(proxy.port(), "the 1E1PD proxy");
  const int nobody = free_port();
  ProxyProcess to_nobody({"--encode", url_of(encoder.port()), "--pd", url_of(nobody)});
  const double pulled = metric(pd_->port(), "crescent_ec_images_pulled_total");

  json bad = body_with({image(601)});
  bad["top_logprobs"] = 50;  // the encoder's body carries no top_logprobs; P refuses it
  const auto start = Clock::now();
  Reply refused = post_json(proxy.port(), bad);
  EXPECT_EQ(refused.status, 400) << refused.body.dump();
  EXPECT_TRUE(contains(message_of(refused), "top_logprobs")) << refused.body.dump();
  // P refused the request before pulling: it ends the reservation at once, not by expiry.
  EXPECT_EQ(wait_for_metric(encoder.port(), "crescent_ec_producer_reservations", 0, seconds(1)), 0);
  EXPECT_LT(seconds_since(start), 1.4);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_releases_total"), 1);
  Reply unreachable = post_json(to_nobody.port(), body_with({image(602)}));
  EXPECT_EQ(unreachable.status, 502) << unreachable.body.dump();
  EXPECT_TRUE(contains(message_of(unreachable), url_of(nobody))) << unreachable.body.dump();
  EXPECT_EQ(metric(encoder.port(), "crescent_encoder_images_total"), 2);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_reservations"), 1);

  expect_pool_at_baseline(encoder.port(), seconds(4), "P never pulled");
  EXPECT_LT(seconds_since(start), 4.0);
  EXPECT_EQ(metric(encoder.port(), "crescent_ec_producer_expired_reservations_total"), 1);
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_images_pulled_total"), pulled);
  EXPECT_EQ(wait_for_metric(pd_->port(), "crescent_kv_cache_blocks_used", 0, seconds(2)), 0);

  // Unaffected: the same image through the proxy (a pool hit on E) is pulled.
  const json good = body_with({image(601)});
  expect_same_answer(post_json(proxy.port(), good), want(good), "afterwards");
  EXPECT_EQ(metric(pd_->port(), "crescent_ec_images_pulled_total") - pulled, 1);
  EXPECT_EQ(metric(encoder.port(), "crescent_encoder_images_total"), 2);
  expect_pool_at_baseline(encoder.port(), seconds(2), "at the end");
}

}  // namespace
}  // namespace crescent::testing
