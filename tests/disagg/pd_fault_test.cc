// Faults in a disaggregated deployment, each made with real processes on 127.0.0.1: the
// affected request ends within the transfer deadline with a clear error, every KV block on the
// prefill (P) and decode (D) side comes back (crescent_kv_cache_blocks_used returns to 0), and
// requests that the fault does not touch, running at the same time, still succeed.
// Most cases drive P and D directly with kv_transfer_params (DESIGN.md §2), which is how a
// lost or duplicated half of a request is made; the proxy is used where it is the subject.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "core/ids.h"
#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"

namespace crescent::testing {
namespace {

// --kv-transfer-timeout of every process here: short, so the deadline cases are quick, and
// doubled under sanitizers, where a healthy transfer's steps take several times longer.
double timeout_s() {
  return test_scale() < 1 ? 6 : 3;
}
// How long an affected request may take to end: the deadline plus slack for a loaded machine.
int64_t end_within_ms() {
  return static_cast<int64_t>((timeout_s() + 4) * 1000 / std::min(1.0, test_scale()));
}
// How long blocks may take to come back: P's own deadline runs from its last event.
Deadline blocks_deadline() {
  return Deadline::after_ms(
      static_cast<int64_t>((2 * timeout_s() + 6) * 1000 / std::min(1.0, test_scale())));
}

std::string new_transfer_id() {
  return "xfer-test-" + random_uuid();
}

std::string long_prompt(int num_words, int seed) {
  std::string s;
  for (int i = 0; i < num_words; ++i) {
    s += (i ? " " : "") + std::string("word") + std::to_string((i * 31 + seed) % 97);
  }
  return s;
}

// Background traffic the fault must not touch: num_threads loops sending completions to port
// (a proxy, or a plain server for non-disaggregated requests) one after another until stop()
// (or kMaxRequests each), each reply checked.
class Bystanders {
 public:
  static constexpr int kMaxRequests = 2000;

  Bystanders(int port, int num_threads, std::string label) : label_(std::move(label)) {
    for (int t = 0; t < num_threads; ++t) {
      threads_.emplace_back([this, port, t] {
        for (int i = 0; !stop_ && i < kMaxRequests; ++i) {
          Reply r = send(port, "/v1/completions",
                         completion("bystander " + std::to_string(t) + " " + std::to_string(i) +
                                        " " + long_prompt(20 + 7 * (i % 5), t + i),
                                    4, i % 2 == 1));
          std::lock_guard<std::mutex> lock(mu_);
          ++num_sent_;
          if (r.is_ok() && r.usage_of("completion_tokens") == 4) {
            ++num_ok_;
          } else if (first_failure_.empty()) {
            first_failure_ = r.describe();
          }
        }
      });
    }
  }
  ~Bystanders() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_) {
      if (t.joinable()) {
        t.join();
      }
    }
  }
  // Waits (up to 60 s) for one bystander request to finish, since a fault case may be over
  // in milliseconds, then stops and checks that every one succeeded.
  void expect_all_ok() {
    for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
         std::chrono::steady_clock::now() < deadline;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (num_sent_ > 0) {
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    stop();
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_GT(num_sent_, 0) << label_ << ": no bystander request ran";
    EXPECT_EQ(num_ok_, num_sent_) << label_ << ": a bystander request failed: " << first_failure_;
  }

 private:
  std::string label_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  int num_sent_ = 0;           // GUARDED_BY(mu_)
  int num_ok_ = 0;             // GUARDED_BY(mu_)
  std::string first_failure_;  // GUARDED_BY(mu_)
};

// Asserts that r failed with an OpenAI-shaped error (HTTP error or SSE error event), ended in
// time, and that its message contains one of the words (case-insensitive), when any are given.
// expected_code: the HTTP status (or, once a stream began, the error event's code) the failure
// must carry; 0 accepts any.
void expect_clear_error(const Reply& r, const std::vector<std::string>& any_of,
                        const std::string& what, int expected_code = 0) {
  EXPECT_FALSE(r.is_ok()) << what << ": succeeded: " << r.describe();
  EXPECT_TRUE(r.transport_error.empty()) << what << ": " << r.describe();
  EXPECT_FALSE(r.error_message.empty()) << what << ": no error message: " << r.describe();
  EXPECT_LE(r.seconds * 1000, end_within_ms()) << what << ": ended too late: " << r.describe();
  if (r.status != 200) {
    EXPECT_TRUE(r.error.is_object() && r.error.contains("type") && r.error.contains("code"))
        << what << ": not OpenAI-shaped: " << r.describe();
  } else {
    EXPECT_TRUE(r.done) << what << ": the stream did not end with [DONE]: " << r.describe();
  }
  if (expected_code != 0) {
    const json code = r.error.is_object() && r.error.contains("code") ? r.error["code"] : json();
    std::string got = code.is_string() ? code.get<std::string>() : code.dump();
    EXPECT_EQ(got, std::to_string(expected_code)) << what << ": " << r.describe();
    if (r.status != 200) {
      EXPECT_EQ(r.status, expected_code) << what << ": " << r.describe();
    }
  }
  if (any_of.empty()) {
    return;
  }
  std::string lower = r.error_message;
  for (auto& ch : lower) {
    ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  bool found = false;
  for (const auto& w : any_of) {
    std::string lw = w;
    for (auto& ch : lw) {
      ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    found = found || lower.find(lw) != std::string::npos;
  }
  std::string joined;
  for (const auto& w : any_of) {
    joined += "'" + w + "' ";
  }
  EXPECT_TRUE(found) << what << ": the message names none of " << joined << ": " << r.error_message;
}

// Waits until P holds at least n transfers (asked for by D, or held for D): then D has surely
// registered and asked for them.
void wait_prefill_in_flight(int prefill_port, int n) {
  double v = wait_metric_at_least(prefill_port, "crescent_kv_transfer_in_flight",
                                  {"role=\"prefill\""}, n, Deadline::after_ms(end_within_ms()));
  EXPECT_GE(v, n) << "P never saw the decode engine's asks";
}

class PdFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServeSpec spec;
    spec.transport = "tcp";
    spec.kv_transfer_timeout_s = timeout_s();
    spec_ = spec;
  }
  void start(bool with_proxy, const ServeSpec* decode_spec = nullptr) {
    auto pd = start_pd(spec_, decode_spec ? *decode_spec : spec_, with_proxy);
    ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
    pd_ = std::move(*pd);
  }
  void TearDown() override {
    // Whatever the fault did, no process crashed, and each still shuts down cleanly.
    std::string problems = pd_.stop_all();
    EXPECT_TRUE(problems.empty()) << problems;
    bool verbose = std::getenv("CRESCENT_TEST_VERBOSE") != nullptr;
    if (HasFailure() || verbose) {
      std::string out = pd_.outputs();
      size_t max_bytes = verbose ? out.size() : 8000;
      std::printf("---- process output (last %zu bytes) ----\n%s\n", max_bytes,
                  (out.size() > max_bytes ? out.substr(out.size() - max_bytes) : out).c_str());
    }
  }
  // Both sides back to no blocks in use.
  void expect_blocks_back() {
    if (pd_.prefill.process && pd_.prefill.process->is_running()) {
      EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, blocks_deadline()), 0)
          << "prefill blocks not released";
    }
    if (pd_.decode.process && pd_.decode.process->is_running()) {
      EXPECT_EQ(wait_blocks_used(pd_.decode.port, 0, blocks_deadline()), 0)
          << "decode blocks not released";
    }
  }
  // A new decode server (after the test killed the last one) becomes pd_.decode.
  void replace_decode(const std::string& name) {
    ServeSpec again = spec_;
    again.role = "decode";
    auto d = start_serve(name, again);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    pd_.decode = std::move(*d);
  }
  // A P/D pair request driven directly (P's half and D's half at once): D's reply.
  Reply direct_pair(const json& body, const std::string& transfer_id = new_transfer_id()) {
    Reply p_reply;
    std::thread p([&] {
      p_reply = send(pd_.prefill.port, "/v1/completions", prefill_body(body, transfer_id));
    });
    Reply d = send(pd_.decode.port, "/v1/completions",
                   decode_body(body, transfer_id, pd_.prefill.bootstrap_url(), pd_.engine_id));
    p.join();
    EXPECT_TRUE(p_reply.is_ok()) << "prefill half: " << p_reply.describe();
    return d;
  }

  ServeSpec spec_;
  PdPair pd_;
};

TEST_F(PdFaultTest, HealthyPairDirectAndThroughProxy) {
  start(true);
  Reply d = direct_pair(completion(long_prompt(40, 1), 6));
  EXPECT_TRUE(d.is_ok()) << d.describe();
  EXPECT_EQ(d.usage_of("completion_tokens"), 6) << d.describe();
  Reply viaproxy = send(pd_.proxy.port, "/v1/completions", completion(long_prompt(40, 1), 6));
  EXPECT_TRUE(viaproxy.is_ok()) << viaproxy.describe();
  EXPECT_EQ(viaproxy.text, d.text);
  expect_blocks_back();
}

// The proxy's request to P is lost: D asks for a transfer_id P never sees.
TEST_F(PdFaultTest, PrefillRequestLostDecodeFailsInTime) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 2, "through the proxy");
  std::string t = new_transfer_id();
  for (bool stream : {false, true}) {
    Reply d = send(pd_.decode.port, "/v1/completions",
                   decode_body(completion(long_prompt(60, 2), 8, stream), t + (stream ? "s" : ""),
                               pd_.prefill.bootstrap_url(), pd_.engine_id));
    expect_clear_error(d, {"timed out", "timeout", "deadline", "never"},
                       stream ? "streamed" : "whole", 504);
    EXPECT_GE(d.seconds, timeout_s() * 0.5) << "failed before the deadline: " << d.describe();
  }
  bystanders.expect_all_ok();
  expect_blocks_back();
}

// P serves its half but D never asks: P releases the held blocks at its deadline.
TEST_F(PdFaultTest, DecodeNeverAsksPrefillReleasesAtDeadline) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  for (int i = 0; i < 3; ++i) {
    Reply p = send(pd_.prefill.port, "/v1/completions",
                   prefill_body(completion(long_prompt(80, 3 + i), 8), new_transfer_id()));
    EXPECT_TRUE(p.is_ok()) << p.describe();
  }
  bystanders.expect_all_ok();
  // Held for D now (blocks in use), released by the deadline.
  EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, blocks_deadline()), 0)
      << "held blocks were not released at the deadline";
  auto m = read_metrics(pd_.prefill.port);
  EXPECT_GE(metric_sum(m, "crescent_kv_transfer_transfers_total",
                       {"role=\"prefill\"", "result=\"expired\""}),
            3);
  expect_blocks_back();
}

// D refuses a request (max_tokens 0) whose KV P already holds: D tells P that nobody will pull
// it (NOT_NEEDED), and P frees the blocks at once, long before its 30 s deadline.
TEST_F(PdFaultTest, DecodeRefusesTheRequestPrefillFreesAtOnce) {
  spec_.kv_transfer_timeout_s = 30;
  start(false);
  const std::string transfer_id = new_transfer_id();
  json body = completion(long_prompt(80, 5), 8);
  Reply p = send(pd_.prefill.port, "/v1/completions", prefill_body(body, transfer_id));
  ASSERT_TRUE(p.is_ok()) << p.describe();
  ASSERT_GT(wait_blocks_used(pd_.prefill.port, 0, Deadline::after_ms(300)), 0)
      << "P does not hold the request's blocks";
  body["max_tokens"] = 0;
  Reply d = send(pd_.decode.port, "/v1/completions",
                 decode_body(body, transfer_id, pd_.prefill.bootstrap_url(), pd_.engine_id));
  EXPECT_EQ(d.status, 400) << d.describe();
  const auto within = Deadline::after_ms(static_cast<int64_t>(5000 / std::min(1.0, test_scale())));
  EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, within), 0)
      << "P kept the blocks of a request D refused";
  auto m = read_metrics(pd_.prefill.port);
  EXPECT_GE(metric_sum(m, "crescent_kv_transfer_transfers_total",
                       {"role=\"prefill\"", "result=\"not_needed\""}),
            1);
  expect_blocks_back();
}

// A client that leaves mid-stream (through the proxy), and one that leaves while D still waits
// for the KV (directly, P's half sent only afterwards).
TEST_F(PdFaultTest, ClientDisconnectsMidStreamAndWhileWaitingForKv) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  SendOptions leave;
  leave.disconnect_after_pieces = 3;
  Reply r =
      send(pd_.proxy.port, "/v1/completions", completion(long_prompt(50, 4), 400, true), leave);
  EXPECT_TRUE(r.transport_error.empty()) << r.describe();
  EXPECT_EQ(r.status, 200) << r.describe();
  EXPECT_FALSE(r.done);

  std::string t = new_transfer_id();
  json body = completion(long_prompt(70, 5), 50, true);
  SendOptions impatient;
  impatient.timeout_ms = 300;  // gives up (closes) while D waits for a KV that never comes
  Reply d = send(pd_.decode.port, "/v1/completions",
                 decode_body(body, t, pd_.prefill.bootstrap_url(), pd_.engine_id), impatient);
  EXPECT_FALSE(d.is_ok()) << d.describe();
  // Now P's half arrives: D has cancelled, so P must not keep the blocks past the deadline.
  Reply p = send(pd_.prefill.port, "/v1/completions", prefill_body(body, t));
  EXPECT_TRUE(p.status == 200 || !p.error_message.empty()) << p.describe();
  bystanders.expect_all_ok();
  expect_blocks_back();
  // D counted an abort.
  auto m = read_metrics(pd_.decode.port);
  EXPECT_GE(metric_sum(m, "crescent_request_success_total", {"finished_reason=\"abort\""}), 1);
  // P freed the cancelled transfer's blocks at once (D's CANCEL left a tombstone that refuses
  // the late prefill request's hold), not at its deadline.
  auto pm = read_metrics(pd_.prefill.port);
  EXPECT_EQ(metric_sum(pm, "crescent_kv_transfer_transfers_total",
                       {"role=\"prefill\"", "result=\"expired\""}),
            0);
}

TEST_F(PdFaultTest, DuplicateTransferIdIsRefusedAndTheFirstIsUntouched) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  const json body = completion(long_prompt(45, 6), 6);
  // D side: a second live request with the same transfer_id is refused at once.
  std::string t = new_transfer_id();
  json d_body = decode_body(body, t, pd_.prefill.bootstrap_url(), pd_.engine_id);
  Reply first;
  std::thread first_thread([&] { first = send(pd_.decode.port, "/v1/completions", d_body); });
  wait_prefill_in_flight(pd_.prefill.port, 1);  // the first has asked P and waits for its KV
  Reply second = send(pd_.decode.port, "/v1/completions", d_body);
  expect_clear_error(second, {"duplicate"}, "second D request with the same transfer_id", 400);
  Reply p = send(pd_.prefill.port, "/v1/completions", prefill_body(body, t));
  EXPECT_TRUE(p.is_ok()) << p.describe();
  first_thread.join();
  EXPECT_TRUE(first.is_ok()) << "the first request was disturbed: " << first.describe();
  EXPECT_EQ(first.usage_of("completion_tokens"), 6) << first.describe();

  // P side: a second prefill half with a live transfer_id does not disturb the first.
  std::string t2 = new_transfer_id();
  Reply p1 = send(pd_.prefill.port, "/v1/completions", prefill_body(body, t2));
  EXPECT_TRUE(p1.is_ok()) << p1.describe();
  Reply p2 = send(pd_.prefill.port, "/v1/completions", prefill_body(body, t2));
  if (!p2.is_ok()) {
    expect_clear_error(p2, {"duplicate"}, "second P request with the same transfer_id");
  }
  Reply d2 = send(pd_.decode.port, "/v1/completions",
                  decode_body(body, t2, pd_.prefill.bootstrap_url(), pd_.engine_id));
  EXPECT_TRUE(d2.is_ok()) << "D after a duplicate P half: " << d2.describe();
  EXPECT_EQ(d2.text, first.text);
  bystanders.expect_all_ok();
  expect_blocks_back();
}

// P refuses its half (the prompt is longer than P's --max-model-len, not D's): the proxy
// answers with P's error at once and aborts D's half, which frees its blocks.
TEST_F(PdFaultTest, PrefillRefusesItsHalfProxyFailsFastAndAbortsDecode) {
  ServeSpec prefill_spec = spec_;
  prefill_spec.max_model_len = 128;
  ServeSpec decode_spec = spec_;
  auto pd = start_pd(prefill_spec, decode_spec, /*with_proxy=*/true);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  pd_ = std::move(*pd);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  for (bool stream : {false, true}) {
    Reply r = send(pd_.proxy.port, "/v1/completions", completion(long_prompt(300, 70), 8, stream));
    expect_clear_error(r, {"prefill"}, "P refused its half");
    EXPECT_LT(r.seconds, timeout_s()) << "the proxy waited for D's deadline: " << r.describe();
  }
  bystanders.expect_all_ok();
  expect_blocks_back();
}

TEST_F(PdFaultTest, UnknownRemoteEngineIdFailsNamingIt) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  const std::string bogus = "no-such-engine-" + random_uuid().substr(0, 8);
  for (bool stream : {false, true}) {
    Reply d = send(pd_.decode.port, "/v1/completions",
                   decode_body(completion(long_prompt(30, 7), 4, stream), new_transfer_id(),
                               pd_.prefill.bootstrap_url(), bogus));
    expect_clear_error(d, {bogus}, "unknown remote_engine_id", 502);
  }
  bystanders.expect_all_ok();
  expect_blocks_back();
}

TEST_F(PdFaultTest, BootstrapUnreachableFailsNamingIt) {
  start(true);
  Bystanders bystanders(pd_.proxy.port, 1, "through the proxy");
  const int closed = free_port();
  const std::string url = "http://127.0.0.1:" + std::to_string(closed);
  for (bool stream : {false, true}) {
    Reply d = send(pd_.decode.port, "/v1/completions",
                   decode_body(completion(long_prompt(30, 8), 4, stream), new_transfer_id(), url,
                               pd_.engine_id));
    expect_clear_error(d, {"bootstrap", std::to_string(closed)}, "unreachable bootstrap", 502);
  }
  bystanders.expect_all_ok();
  expect_blocks_back();
}

TEST_F(PdFaultTest, CompatibilityMismatchNamesBlockSize) {
  ServeSpec decode = spec_;
  decode.block_size = 32;
  start(false, &decode);
  // Plain requests on D still work while its disaggregated ones are refused.
  Bystanders bystanders(pd_.decode.port, 1, "plain requests on D");
  for (bool stream : {false, true}) {
    Reply d = direct_pair(completion(long_prompt(40, 9), 4, stream));
    expect_clear_error(d, {"block_size"}, "P block size 16, D block size 32", 502);
  }
  bystanders.expect_all_ok();
  expect_blocks_back();
}

// P stores bf16 KV and D float32: D refuses to take P's blocks, naming both dtypes.
TEST_F(PdFaultTest, CompatibilityMismatchNamesBothKvDtypes) {
  spec_.extra_args = {"--kv-cache-dtype", "bf16"};
  ServeSpec decode = spec_;
  decode.extra_args = {"--kv-cache-dtype", "float32"};
  start(false, &decode);
  Reply d = direct_pair(completion(long_prompt(40, 9), 4, false));
  expect_clear_error(d, {"dtype"}, "P bf16 KV, D float32 KV", 502);
  EXPECT_NE(d.error_message.find("dtype: \"float32\" here, \"bf16\" at the peer"),
            std::string::npos)
      << d.error_message;
  expect_blocks_back();
}

// The new names too: P stores q8_0 and D bf16 (`small`: head_dim 32, as q8_0 needs).
TEST_F(PdFaultTest, CompatibilityMismatchNamesQ8_0AndBf16) {
  spec_.model_preset = "small";
  spec_.extra_args = {"--kv-cache-dtype", "q8_0"};
  ServeSpec decode = spec_;
  decode.extra_args = {"--kv-cache-dtype", "bf16"};
  start(false, &decode);
  Reply d = direct_pair(completion(long_prompt(40, 9), 4, false));
  expect_clear_error(d, {"dtype"}, "P q8_0 KV, D bf16 KV", 502);
  EXPECT_NE(d.error_message.find("dtype: \"bf16\" here, \"q8_0\" at the peer"), std::string::npos)
      << d.error_message;
  expect_blocks_back();
}

// A fine-tune has its base model's shape: only the weights fingerprint tells them apart.
TEST_F(PdFaultTest, CompatibilityMismatchNamesTheWeights) {
  ServeSpec decode = spec_;
  decode.model_seed = 1;
  start(false, &decode);
  Reply d = direct_pair(completion(long_prompt(40, 9), 4, false));
  expect_clear_error(d, {"weights", "another checkpoint"}, "P and D of two same-shape checkpoints",
                     502);
  expect_blocks_back();
}

// Parks `count` decode halves on D (their P halves are never sent), so that D has asked P and
// waits: the state in which a P or D death hurts most. Returns the threads' replies.
struct ParkedDecodes {
  std::vector<std::string> transfer_ids;
  std::vector<json> bodies;
  std::vector<Reply> replies;
  std::vector<std::thread> threads;
  void join() {
    for (auto& t : threads) {
      t.join();
    }
  }
};

// P dies (SIGKILL) while D waits for its KV and while proxied streams decode: the waiting
// requests fail clearly and in time, the streams whose KV had arrived finish, a request sent
// after the death is refused clearly, D frees everything, and a new P on the same bootstrap
// port serves later requests (directly and through the proxy, which re-reads the bootstrap).
TEST_F(PdFaultTest, PrefillKilledMidRequestThenReplaced) {
  start(true);
  Bystanders bystanders(pd_.decode.port, 1, "plain requests on D");
  // Long proxied streams, decoding on D once their KV arrived.
  constexpr int kNumStreams = 2;
  std::vector<Reply> streams(kNumStreams);
  std::atomic<int> num_streaming{0};
  std::vector<std::thread> stream_threads;
  for (int i = 0; i < kNumStreams; ++i) {
    stream_threads.emplace_back([&, i] {
      SendOptions o;
      bool counted = false;
      o.on_piece = [&] {
        if (!counted) {
          counted = true;
          ++num_streaming;
        }
      };
      streams[i] = send(pd_.proxy.port, "/v1/completions",
                        completion(long_prompt(40, 50 + i), 300, true), o);
    });
  }
  // Decode halves waiting for a P that will die.
  constexpr int kNumParked = 3;
  ParkedDecodes parked;
  parked.replies.resize(kNumParked);
  for (int i = 0; i < kNumParked; ++i) {
    parked.transfer_ids.push_back(new_transfer_id());
    parked.bodies.push_back(completion(long_prompt(200, 10 + i), 10, i % 2 == 1));
  }
  for (int i = 0; i < kNumParked; ++i) {
    parked.threads.emplace_back([&, i] {
      parked.replies[i] = send(pd_.decode.port, "/v1/completions",
                               decode_body(parked.bodies[i], parked.transfer_ids[i],
                                           pd_.prefill.bootstrap_url(), pd_.engine_id));
    });
  }
  auto wait_deadline = Deadline::after_ms(end_within_ms());
  while (num_streaming < kNumStreams && !wait_deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  wait_prefill_in_flight(pd_.prefill.port, kNumParked);  // the parked ones have asked
  auto killed_at = std::chrono::steady_clock::now();
  pd_.prefill.process->kill_now();

  // Sent after the death: refused clearly.
  Reply late = send(pd_.proxy.port, "/v1/completions", completion(long_prompt(30, 60), 5));
  expect_clear_error(late, {}, "proxied request after P died");

  parked.join();
  for (int i = 0; i < kNumParked; ++i) {
    expect_clear_error(parked.replies[i], {}, "D request waiting for the killed P");
  }
  double since_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LE(since_kill * 1000, end_within_ms()) << "D noticed P's death too late";
  for (auto& t : stream_threads) {
    t.join();
  }
  for (int i = 0; i < kNumStreams; ++i) {
    EXPECT_TRUE(streams[i].is_ok())
        << "a stream whose KV had arrived was cut: " << streams[i].describe();
  }
  EXPECT_EQ(wait_blocks_used(pd_.decode.port, 0, blocks_deadline()), 0)
      << "D kept blocks of requests whose P died";
  bystanders.expect_all_ok();

  // A new P at the same address, hosting the bootstrap on the same port: a new engine id, and
  // requests work again.
  ServeSpec again = spec_;
  again.role = "prefill";
  again.port = pd_.prefill.port;
  again.bootstrap_port = pd_.prefill.bootstrap_port;
  auto p = start_serve("P2", again);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  pd_.prefill = std::move(*p);
  std::string error;
  pd_.engine_id = query_engine_id(pd_.prefill.bootstrap_url(), &error);
  ASSERT_FALSE(pd_.engine_id.empty()) << error;
  Reply d = direct_pair(completion(long_prompt(60, 20), 5));
  EXPECT_TRUE(d.is_ok()) << "direct request after P was replaced: " << d.describe();
  // Through the proxy, once it has re-read the bootstrap (every 10 s: ProxyOptions'
  // refresh_interval_ms).
  Reply viaproxy;
  auto deadline = Deadline::after_ms(10'000 + end_within_ms());
  do {
    viaproxy = send(pd_.proxy.port, "/v1/completions", completion(long_prompt(60, 21), 5));
    if (!viaproxy.is_ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  } while (!viaproxy.is_ok() && !deadline.is_expired());
  EXPECT_TRUE(viaproxy.is_ok()) << "proxied request after P was replaced: " << viaproxy.describe();
  expect_blocks_back();
}

// D dies (SIGKILL) after asking P for KV, and again while P writes into it (frozen with
// SIGSTOP first, so the transfer is surely under way): P frees everything by its deadline and
// serves a new D.
TEST_F(PdFaultTest, DecodeKilledMidTransferPrefillReleases) {
  start(false);
  Bystanders bystanders(pd_.prefill.port, 1, "plain requests on P");
  auto check_prefill_halves = [&](const std::vector<Reply>& replies) {
    for (const Reply& r : replies) {
      EXPECT_TRUE(r.transport_error.empty() && r.status != 0)
          << "P's half did not end cleanly: " << r.describe();
      EXPECT_LE(r.seconds * 1000, end_within_ms()) << r.describe();
    }
  };
  constexpr int kNum = 3;
  // 1. D asked (its halves wait), D dies, then P's halves arrive.
  {
    ParkedDecodes parked;
    parked.replies.resize(kNum);
    for (int i = 0; i < kNum; ++i) {
      parked.transfer_ids.push_back(new_transfer_id());
      parked.bodies.push_back(completion(long_prompt(200, 30 + i), 10, i % 2 == 1));
    }
    for (int i = 0; i < kNum; ++i) {
      parked.threads.emplace_back([&, i] {
        parked.replies[i] = send(pd_.decode.port, "/v1/completions",
                                 decode_body(parked.bodies[i], parked.transfer_ids[i],
                                             pd_.prefill.bootstrap_url(), pd_.engine_id));
      });
    }
    wait_prefill_in_flight(pd_.prefill.port, kNum);
    pd_.decode.process->kill_now();
    parked.join();
    std::vector<Reply> p_replies;
    for (int i = 0; i < kNum; ++i) {
      p_replies.push_back(send(pd_.prefill.port, "/v1/completions",
                               prefill_body(parked.bodies[i], parked.transfer_ids[i])));
    }
    check_prefill_halves(p_replies);
    EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, blocks_deadline()), 0)
        << "P kept blocks for a D that died after asking";
  }
  // 2. D asked, then froze (SIGSTOP): P's halves arrive and P writes into a D that no longer
  // reads or acknowledges; D is killed in the middle of that transfer.
  replace_decode("D2");
  {
    ParkedDecodes parked;
    parked.replies.resize(kNum);
    for (int i = 0; i < kNum; ++i) {
      parked.transfer_ids.push_back(new_transfer_id());
      parked.bodies.push_back(completion(long_prompt(300, 40 + i), 10, i % 2 == 1));
    }
    for (int i = 0; i < kNum; ++i) {
      parked.threads.emplace_back([&, i] {
        parked.replies[i] = send(pd_.decode.port, "/v1/completions",
                                 decode_body(parked.bodies[i], parked.transfer_ids[i],
                                             pd_.prefill.bootstrap_url(), pd_.engine_id));
      });
    }
    wait_prefill_in_flight(pd_.prefill.port, kNum);
    pd_.decode.process->signal(SIGSTOP);
    std::vector<Reply> p_replies;
    for (int i = 0; i < kNum; ++i) {
      p_replies.push_back(send(pd_.prefill.port, "/v1/completions",
                               prefill_body(parked.bodies[i], parked.transfer_ids[i])));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // P is writing
    pd_.decode.process->kill_now();
    parked.join();
    check_prefill_halves(p_replies);
    EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, blocks_deadline()), 0)
        << "P kept blocks for a D that died mid-transfer";
    auto m = read_metrics(pd_.prefill.port);
    std::printf("P transfers after D died: ok %.0f, error %.0f, cancelled %.0f, expired %.0f\n",
                metric_sum(m, "crescent_kv_transfer_transfers_total", {"result=\"ok\""}),
                metric_sum(m, "crescent_kv_transfer_transfers_total", {"result=\"error\""}),
                metric_sum(m, "crescent_kv_transfer_transfers_total", {"result=\"cancelled\""}),
                metric_sum(m, "crescent_kv_transfer_transfers_total", {"result=\"expired\""}));
  }
  bystanders.expect_all_ok();
  // P still serves a new D.
  replace_decode("D3");
  Reply after = direct_pair(completion(long_prompt(60, 41), 5));
  EXPECT_TRUE(after.is_ok()) << "request after D was replaced: " << after.describe();
  expect_blocks_back();
}

// D is gone while P holds KV for it: P frees everything within ~2 s of a kill -9 (and within
// the missed heartbeats, 3 s, of a SIGSTOP), not at --kv-transfer-timeout (60 s here). Held
// halves that D never asked for are freed because no decode engine is left connected; a half
// that D asked for before P's request came is refused when P's request finishes.
TEST_F(PdFaultTest, DecodeGonePrefillFreesItsBlocksAtOnce) {
  spec_.kv_transfer_timeout_s = 60;
  start(false);
  const double slack = 1 / std::min(1.0, test_scale());
  auto prefill_halves = [&](int n, int seed) {
    for (int i = 0; i < n; ++i) {
      Reply r = send(pd_.prefill.port, "/v1/completions",
                     prefill_body(completion(long_prompt(150, seed + i), 4), new_transfer_id()));
      EXPECT_TRUE(r.is_ok()) << "P's half: " << r.describe();
    }
  };
  for (bool stop_instead : {false, true}) {
    const char* how = stop_instead ? "SIGSTOP" : "kill -9";
    if (stop_instead) {  // a new D for the second round
      replace_decode("D2");
    }
    // D is connected to P (one whole request), then P holds halves D has not asked for.
    Reply warm = direct_pair(completion(long_prompt(40, 7), 3));
    ASSERT_TRUE(warm.is_ok()) << how << ": " << warm.describe();
    prefill_halves(4, stop_instead ? 60 : 50);
    // And D asks for one whose P half comes only after D is gone.
    ParkedDecodes parked;
    parked.transfer_ids.push_back(new_transfer_id());
    parked.bodies.push_back(completion(long_prompt(150, stop_instead ? 90 : 80), 4));
    parked.replies.resize(1);
    parked.threads.emplace_back([&] {
      parked.replies[0] = send(pd_.decode.port, "/v1/completions",
                               decode_body(parked.bodies[0], parked.transfer_ids[0],
                                           pd_.prefill.bootstrap_url(), pd_.engine_id));
    });
    wait_prefill_in_flight(pd_.prefill.port, 5);
    double held = blocks_used(pd_.prefill.port);
    EXPECT_GT(held, 0) << how << ": P holds nothing";
    auto gone_at = std::chrono::steady_clock::now();
    if (stop_instead) {
      pd_.decode.process->signal(SIGSTOP);
    } else {
      pd_.decode.process->kill_now();
    }
    const double limit_ms = (stop_instead ? 3000 + 2500 : 2000) * slack;
    EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0,
                               Deadline::after_ms(static_cast<int64_t>(limit_ms + 5000))),
              0)
        << how << ": P kept " << held << " blocks";
    double freed_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - gone_at)
            .count();
    EXPECT_LE(freed_ms, limit_ms) << how << ": P freed its blocks too late";
    std::printf("%s: P freed %.0f held blocks %.0f ms after D was gone\n", how, held, freed_ms);
    if (stop_instead) {
      pd_.decode.process->kill_now();
    }
    parked.join();
    // The late half of the transfer D asked for: P prefills it and frees it at once.
    Reply late = send(pd_.prefill.port, "/v1/completions",
                      prefill_body(parked.bodies[0], parked.transfer_ids[0]));
    EXPECT_TRUE(late.transport_error.empty() && late.status != 0) << late.describe();
    EXPECT_EQ(wait_blocks_used(pd_.prefill.port, 0, Deadline::after_ms(3000)), 0)
        << how << ": P held the late half of a transfer whose D is gone";
    auto m = read_metrics(pd_.prefill.port);
    EXPECT_GE(metric_sum(m, "crescent_kv_transfer_transfers_total",
                         {"role=\"prefill\"", "result=\"peer_lost\""}),
              stop_instead ? 10 : 5)
        << how;
    EXPECT_EQ(metric_sum(m, "crescent_kv_transfer_transfers_total",
                         {"role=\"prefill\"", "result=\"expired\""}),
              0)
        << how;
  }
  // P still serves a new D.
  replace_decode("D3");
  Reply after = direct_pair(completion(long_prompt(60, 41), 5));
  EXPECT_TRUE(after.is_ok()) << "request after D was replaced: " << after.describe();
  expect_blocks_back();
}

}  // namespace
}  // namespace crescent::testing
