// Each image of each shape is published with a fresh mm_hash (so the producer writes it, as an
// encoder would), fetched, checked value by value, and then the same bytes are written again
// into a shared source buffer and memcpy'd into the consumer's destination: both copies start
// from bytes just written by this thread into a destination just read by it (read_all() before
// the publish, check_values() before the memcpy), so the caches are in the same state for
// both, and machine load from other work falls on both alike.

#include "bench/disagg/ec_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/disagg/copy_baseline.h"
#include "bench/disagg/host_info.h"
#include "bench/metrics.h"
#include "core/clock.h"
#include "disagg/ec_consumer.h"
#include "disagg/ec_producer.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"

namespace crescent::bench {
namespace {

using Json = nlohmann::ordered_json;

struct ShapeFigures {
  int64_t num_tokens = 0;
  uint64_t num_bytes = 0;
  std::vector<double> warmup_fetch_s;  // the first includes HELLO and opening the segment
  std::vector<double> fetch_s;
  std::vector<double> publish_s;       // allocate + write + reserve
  std::vector<double> memcpy_s;        // same source state and destination as the fetch
  std::vector<double> memcpy_fresh_s;  // bench disagg's KV baseline: fresh, touched buffers
};

// The embedding values of image `seed`: every float differs, so a misplaced byte shows.
float value(int seed, int64_t i) {
  return static_cast<float>(seed) * 4096.0f + static_cast<float>(i % 4096);
}

void fill(float* dst, int seed, int64_t num_floats) {
  for (int64_t i = 0; i < num_floats; ++i) {
    dst[i] = value(seed, i);
  }
}

Status check_values(std::span<const float> got, int seed, const std::string& what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != value(seed, static_cast<int64_t>(i))) {
      return data_loss(what + ": float " + std::to_string(i) + " is " + std::to_string(got[i]) +
                       ", expected " + std::to_string(value(seed, static_cast<int64_t>(i))));
    }
  }
  return Status::ok();
}

// Reads every float (into a sink the compiler must keep): puts the destination into the cache
// state the memcpy baseline finds it in, just read by check_values().
void read_all(std::span<const float> v) {
  float sum = 0;
  for (float x : v) {
    sum += x;
  }
  volatile float sink = sum;
  (void)sink;
}

class EcTransferBench {
 public:
  explicit EcTransferBench(EcBenchOptions o) : o_(std::move(o)) {}
  Status run();

 private:
  Status run_shape(int64_t num_tokens, ShapeFigures* out);
  void print_report() const;
  Status write_json() const;

  EcBenchOptions o_;
  transfer::TransportKind transport_ = transfer::TransportKind::kShm;
  std::unique_ptr<disagg::EcProducer> producer_;
  std::unique_ptr<disagg::EcConsumer> consumer_;
  std::vector<ShapeFigures> shapes_;
  ShapeFigures probe_;  // one-row tensors: the fetch's fixed cost (control round trips)
  std::string load_at_start_, load_at_end_;
  uint64_t num_mapped_copies_ = 0;  // fetches served from the mapped pool (shm)
  int next_seed_ = 1;
};

Status EcTransferBench::run_shape(int64_t num_tokens, ShapeFigures* out) {
  const int64_t num_floats = num_tokens * o_.hidden_size;
  const uint64_t num_bytes = static_cast<uint64_t>(num_floats) * sizeof(float);
  out->num_tokens = num_tokens;
  out->num_bytes = num_bytes;
  // P's destination: ordinary memory, touched (as a prefill worker's embedding buffer is).
  std::vector<float> dst(static_cast<size_t>(num_floats), 0.0f);
  ASSIGN_OR_RETURN(transfer::SharedBuffer src, transfer::allocate_shared(num_bytes));
  std::memset(src.data(), 0, num_bytes);
  auto* src_floats = reinterpret_cast<float*>(src.data());
  const std::span<float> dsts[] = {std::span<float>(dst)};

  for (int i = 0; i < o_.num_warmup + o_.num_images; ++i) {
    const bool is_warmup = i < o_.num_warmup;
    const int seed = next_seed_++;
    const std::string mm_hash = "bench-" + std::to_string(num_tokens) + "-" + std::to_string(seed);
    read_all(dst);  // then the source is written (publish), then copied: as for the memcpy
    TimePoint t0 = Clock::now();
    auto ref = producer_->publish(
        mm_hash, num_tokens, o_.hidden_size,
        [&](float* pool) {
          fill(pool, seed, num_floats);
          return Status::ok();
        },
        Deadline::after_ms(30'000));
    if (!ref.is_ok()) {
      return ref.status().with_context("publish of " + mm_hash);
    }
    double publish_s = seconds_since(t0);
    const disagg::EcTensorRef refs[] = {*ref};
    t0 = Clock::now();
    RETURN_IF_ERROR(consumer_->fetch(refs, dsts, Deadline::after_ms(30'000)));
    double fetch_s = seconds_since(t0);
    RETURN_IF_ERROR(check_values(dst, seed, "fetched " + mm_hash));

    // The baseline: the same bytes, written the same way, copied into the same destination.
    fill(src_floats, seed + 1'000'000, num_floats);
    t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), num_bytes);
    double memcpy_s = seconds_since(t0);
    if (dst.front() != value(seed + 1'000'000, 0) ||
        dst.back() != value(seed + 1'000'000, num_floats - 1)) {
      return internal_error("memcpy baseline: the copy did not land");
    }
    // bench disagg's KV baseline (new shared buffers, both page-touched), for comparison.
    ASSIGN_OR_RETURN(transfer::SharedBuffer fresh_src, transfer::allocate_shared(num_bytes));
    ASSIGN_OR_RETURN(transfer::SharedBuffer fresh_dst, transfer::allocate_shared(num_bytes));
    std::memset(fresh_src.data(), 0x5a, num_bytes);
    std::memset(fresh_dst.data(), 0, num_bytes);
    t0 = Clock::now();
    std::memcpy(fresh_dst.data(), fresh_src.data(), num_bytes);
    double memcpy_fresh_s = seconds_since(t0);
    if (fresh_dst.data()[0] != 0x5a || fresh_dst.data()[num_bytes - 1] != 0x5a) {
      return internal_error("memcpy baseline: the copy did not land");
    }
    if (is_warmup) {
      out->warmup_fetch_s.push_back(fetch_s);
    } else {
      out->fetch_s.push_back(fetch_s);
      out->publish_s.push_back(publish_s);
      out->memcpy_s.push_back(memcpy_s);
      out->memcpy_fresh_s.push_back(memcpy_fresh_s);
    }
  }
  return Status::ok();
}

Status EcTransferBench::run() {
  ASSIGN_OR_RETURN(transport_, transfer::parse_transport(o_.ec_transport));
  if (!transfer::is_transport_available(transport_)) {
    return unavailable("--ec-transport " + o_.ec_transport + " is not available in this build");
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> tokens, parse_ec_bench_tokens(o_.tokens));
  uint64_t largest = 0;
  for (int64_t t : tokens) {
    largest = std::max(largest, static_cast<uint64_t>(t * o_.hidden_size) * sizeof(float));
  }
  disagg::EcCompat compat;
  compat.vision_model = "bench-disagg-encode";
  compat.hidden_size = o_.hidden_size;
  disagg::EcProducerOptions po;
  po.engine_id = "bench-encoder";
  po.transport = transport_;
  // Room for a few images: released entries stay cached and are evicted oldest first.
  po.pool_bytes = std::max<uint64_t>(64ull << 20, 4 * largest + (1 << 20));
  po.compat = compat;
  ASSIGN_OR_RETURN(producer_, disagg::EcProducer::create(po));
  disagg::EcConsumerOptions co;
  co.transport = transport_;
  co.compat = compat;
  co.name = "bench-prefill";
  ASSIGN_OR_RETURN(consumer_, disagg::EcConsumer::create(co));

  load_at_start_ = load_average();
  std::printf(
      "bench disagg --encode: EC transfer of one image's embeddings (float32, hidden size "
      "%lld), producer and consumer in this process, each with its own transfer engine, over "
      "%s; %d images per shape after %d warm-up; %d cores, load average %s\n",
      static_cast<long long>(o_.hidden_size), o_.ec_transport.c_str(), o_.num_images, o_.num_warmup,
      num_usable_cores(), load_at_start_.c_str());
  std::fflush(stdout);
  RETURN_IF_ERROR(run_shape(1, &probe_));
  for (int64_t t : tokens) {
    ShapeFigures f;
    RETURN_IF_ERROR(run_shape(t, &f));
    std::printf("  %lld tokens: fetch median %.3f ms, memcpy median %.3f ms\n",
                static_cast<long long>(t), median(f.fetch_s) * 1e3, median(f.memcpy_s) * 1e3);
    std::fflush(stdout);
    shapes_.push_back(std::move(f));
  }
  load_at_end_ = load_average();
  // Mapped copies (shm) release asynchronously: every reservation must still end, promptly.
  const TimePoint drain_deadline = Clock::now() + std::chrono::seconds(5);
  disagg::EcProducerMetrics pm = producer_->metrics();
  while (pm.num_reservations != 0 && Clock::now() < drain_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pm = producer_->metrics();
  }
  if (pm.num_reservations != 0) {
    return internal_error("the producer still holds " + std::to_string(pm.num_reservations) +
                          " reservations 5 s after the last fetch");
  }
  num_mapped_copies_ = consumer_->metrics().num_mapped_copies;
  print_report();
  if (!o_.json_path.empty()) {
    RETURN_IF_ERROR(write_json());
    std::printf("bench disagg --encode: wrote %s\n", o_.json_path.c_str());
  }
  return Status::ok();
}

double gbps(uint64_t num_bytes, double s) {
  return s > 0 ? static_cast<double>(num_bytes) / s / 1e9 : 0.0;
}

double ratio(double a, double b) {
  return b > 0 ? a / b : 0.0;
}

void EcTransferBench::print_report() const {
  std::printf("\nEC transfer vs memcpy, per image, ms (%d images per shape):\n", o_.num_images);
  std::printf("  %-24s %-7s %9s %9s %9s %9s\n", "shape (tokens x hidden)", "", "p50", "p99", "best",
              "GB/s p50");
  for (const ShapeFigures& f : shapes_) {
    char shape[64];
    std::snprintf(shape, sizeof(shape), "%lld x %lld (%.2f MiB)",
                  static_cast<long long>(f.num_tokens), static_cast<long long>(o_.hidden_size),
                  static_cast<double>(f.num_bytes) / (1 << 20));
    auto row = [&](const char* label, const char* what, const std::vector<double>& v) {
      std::printf("  %-24s %-7s %9.3f %9.3f %9.3f %9.2f\n", label, what, median(v) * 1e3,
                  percentile(v, 99) * 1e3, *std::min_element(v.begin(), v.end()) * 1e3,
                  gbps(f.num_bytes, median(v)));
    };
    row(shape, "fetch", f.fetch_s);
    row("", "memcpy", f.memcpy_s);
    row("", "memcpy*", f.memcpy_fresh_s);
    row("", "publish", f.publish_s);
    std::printf("  %-24s first fetch (HELLO, open the segment): %.3f ms\n", "",
                f.warmup_fetch_s.empty() ? 0.0 : f.warmup_fetch_s.front() * 1e3);
  }
  for (const ShapeFigures& f : shapes_) {
    double r_median = ratio(median(f.fetch_s), median(f.memcpy_s));
    double r_best = ratio(*std::min_element(f.fetch_s.begin(), f.fetch_s.end()),
                          *std::min_element(f.memcpy_s.begin(), f.memcpy_s.end()));
    std::printf("  EC transfer / memcpy, %lld tokens: %.2f (medians), %.2f (bests)   %s\n",
                static_cast<long long>(f.num_tokens), r_median, r_best,
                shm_target_verdict(o_.ec_transport, r_median, o_.target_ratio).c_str());
    std::printf("  EC transfer / memcpy*, %lld tokens: %.2f (medians)\n",
                static_cast<long long>(f.num_tokens),
                ratio(median(f.fetch_s), median(f.memcpy_fresh_s)));
  }
  const double fixed_s = median(probe_.fetch_s);
  std::printf(
      "  fixed cost of a fetch (a one-row tensor; shm mapped copy: the stamp checks; otherwise "
      "the READ's submit and completion and the RELEASE round trip): p50 %.3f ms, best %.3f "
      "ms\n",
      fixed_s * 1e3, *std::min_element(probe_.fetch_s.begin(), probe_.fetch_s.end()) * 1e3);
  for (const ShapeFigures& f : shapes_) {
    double bytes_s = std::max(0.0, median(f.fetch_s) - fixed_s);
    std::printf(
        "  beyond it, %lld tokens: %.3f ms for the bytes (%.2f GB/s), %.2f x memcpy "
        "(medians)\n",
        static_cast<long long>(f.num_tokens), bytes_s * 1e3, gbps(f.num_bytes, bytes_s),
        ratio(bytes_s, median(f.memcpy_s)));
  }
  std::printf(
      "  (fetch: EcConsumer::fetch() of one image over %s: after the first contact with the "
      "encoder, on shm, a copy out of the encoder's pool mapped into this process, checked by "
      "the entry's stamp, its RELEASE sent in the background (%llu of the fetches); otherwise "
      "READ at the ref's location, then RELEASE confirming the reservation held; publish: "
      "allocate + write + reserve; memcpy: the same bytes just written, into the fetch's "
      "destination; memcpy*: into new page-touched shared buffers, bench disagg's KV "
      "baseline)\n",
      o_.ec_transport.c_str(), static_cast<unsigned long long>(num_mapped_copies_));
  std::printf("\nload average: %s at start, %s at end (%d cores)\n", load_at_start_.c_str(),
              load_at_end_.c_str(), num_usable_cores());
}

Status EcTransferBench::write_json() const {
  Json j;
  j["mode"] = "encode";
  j["ec_transport"] = o_.ec_transport;
  j["hidden_size"] = o_.hidden_size;
  j["num_images"] = o_.num_images;
  j["num_warmup"] = o_.num_warmup;
  j["num_cores"] = num_usable_cores();
  j["load_average_start"] = load_at_start_;
  j["load_average_end"] = load_at_end_;
  j["target_ratio"] = o_.target_ratio;
  j["target_applies"] = o_.ec_transport == "shm";
  j["num_mapped_copies"] = num_mapped_copies_;
  Json shapes = Json::array();
  for (const ShapeFigures& f : shapes_) {
    Json s;
    s["num_tokens"] = f.num_tokens;
    s["num_bytes"] = f.num_bytes;
    auto stats = [](const std::vector<double>& v) {
      return Json{{"median", median(v)},
                  {"p99", percentile(v, 99)},
                  {"best", *std::min_element(v.begin(), v.end())},
                  {"samples", v}};
    };
    s["fetch_seconds"] = stats(f.fetch_s);
    s["memcpy_seconds"] = stats(f.memcpy_s);
    s["memcpy_fresh_seconds"] = stats(f.memcpy_fresh_s);
    s["ratio_median_fresh"] = ratio(median(f.fetch_s), median(f.memcpy_fresh_s));
    s["publish_seconds"] = stats(f.publish_s);
    s["warmup_fetch_seconds"] = f.warmup_fetch_s;
    s["fetch_gbps_median"] = gbps(f.num_bytes, median(f.fetch_s));
    s["memcpy_gbps_median"] = gbps(f.num_bytes, median(f.memcpy_s));
    double r = ratio(median(f.fetch_s), median(f.memcpy_s));
    s["ratio_median"] = r;
    s["ratio_best"] = ratio(*std::min_element(f.fetch_s.begin(), f.fetch_s.end()),
                            *std::min_element(f.memcpy_s.begin(), f.memcpy_s.end()));
    s["pass"] = r <= o_.target_ratio;
    shapes.push_back(s);
  }
  j["shapes"] = shapes;
  j["fixed_fetch_seconds"] = {
      {"median", median(probe_.fetch_s)},
      {"best", *std::min_element(probe_.fetch_s.begin(), probe_.fetch_s.end())}};
  std::ofstream out(o_.json_path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) {
    return internal_error("cannot write " + o_.json_path);
  }
  return Status::ok();
}

}  // namespace

Result<std::vector<int64_t>> parse_ec_bench_tokens(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > disagg::kMaxEcTokensPerImage) {
      return invalid_argument("--tokens expects a comma-separated list of token counts (1.." +
                              std::to_string(disagg::kMaxEcTokensPerImage) + "), got '" + text +
                              "'");
    }
    out.push_back(v);
  }
  if (out.empty()) {
    return invalid_argument("--tokens is empty");
  }
  return out;
}

Status validate_ec_bench_options(const EcBenchOptions& o) {
  if (o.ec_transport != "shm" && o.ec_transport != "tcp" && o.ec_transport != "ucx") {
    return invalid_argument("--ec-transport must be shm, tcp or ucx, got '" + o.ec_transport + "'");
  }
  if (o.hidden_size < 1 || o.hidden_size > disagg::kMaxEcHiddenSize) {
    return invalid_argument("--hidden-size must be 1.." + std::to_string(disagg::kMaxEcHiddenSize));
  }
  if (o.num_images < 1 || o.num_images > 100'000) {
    return invalid_argument("--num-images must be 1..100000");
  }
  if (o.num_warmup < 0 || o.num_warmup > 1000) {
    return invalid_argument("--warmup must be 0..1000");
  }
  if (!(o.target_ratio > 0)) {
    return invalid_argument("--target-ratio must be > 0");
  }
  return parse_ec_bench_tokens(o.tokens).status();
}

Status run_ec_bench(const EcBenchOptions& o) {
  EcTransferBench bench(o);
  return bench.run();
}

}  // namespace crescent::bench
