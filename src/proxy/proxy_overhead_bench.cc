// What the proxy adds: the same requests sent straight to a fake decode server and through a
// ProxyServer in front of it (fake prefill answering at once), on 127.0.0.1. Reports the
// latency of whole and streamed requests (median, p99) and the throughput of concurrent
// streams. Usage: proxy_overhead_bench [num_requests] [concurrency]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "net/http/http_client.h"
#include "proxy/fake_upstreams.h"
#include "proxy/proxy_server.h"

namespace crescent::proxy {
namespace {

using testing::FakeServer;
using SteadyClock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Sequential requests on one keep-alive connection; per-request latency in microseconds.
std::vector<double> latencies_us(int port, int num_requests, bool stream) {
  net::http::HttpClient client("127.0.0.1", port);
  std::string body = stream ? R"({"prompt":"a","max_tokens":4,"stream":true})"
                            : R"({"prompt":"a","max_tokens":4})";
  std::vector<double> out;
  for (int i = 0; i < num_requests; ++i) {
    auto start = SteadyClock::now();
    auto r = client.stream(
        "POST", "/v1/completions", body, {{"Content-Type", "application/json"}},
        [](std::string_view) { return true; }, Deadline::after_ms(10'000));
    if (!r.is_ok() || r->status != 200) {
      std::fprintf(stderr, "request failed: %s\n", r.status().to_string().c_str());
      std::exit(1);
    }
    out.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count());
  }
  return out;
}

// `concurrency` clients each streaming `per_client` requests; returns requests per second.
double streams_per_s(int port, int concurrency, int per_client) {
  std::vector<std::thread> threads;
  auto start = SteadyClock::now();
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&] { latencies_us(port, per_client, true); });
  }
  for (auto& t : threads) {
    t.join();
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return concurrency * per_client / secs;
}

int run(int num_requests, int concurrency) {
  FakeServer prefill(testing::prefill_handler());
  FakeServer bootstrap(testing::bootstrap_handler({"engine-0"}));
  FakeServer decode([](auto&&...) {});
  decode.set_handler(testing::decode_handler(&decode, /*num_chunks=*/4));
  ProxyOptions options;
  options.port = 0;
  options.poll_interval_ms = 10;
  PrefillSpec spec;
  spec.server = *parse_upstream_url(prefill.url());
  spec.bootstrap_port = bootstrap.port();
  options.prefills.push_back(spec);
  options.decodes.push_back(*parse_upstream_url(decode.url()));
  auto proxy_or = ProxyServer::start(options);
  if (!proxy_or.is_ok()) {
    std::fprintf(stderr, "%s\n", proxy_or.status().to_string().c_str());
    return 1;
  }
  auto& proxy = *proxy_or;
  while (!proxy->is_ready()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::printf("%d sequential requests each (4 SSE events per stream), %u hardware threads\n",
              num_requests, std::thread::hardware_concurrency());
  std::printf("%-28s %12s %12s\n", "", "median us", "p99 us");
  for (bool stream : {false, true}) {
    latencies_us(decode.port(), 50, stream);  // warm-up
    latencies_us(proxy->port(), 50, stream);
    auto direct = latencies_us(decode.port(), num_requests, stream);
    auto proxied = latencies_us(proxy->port(), num_requests, stream);
    const char* kind = stream ? "streamed" : "whole";
    std::printf("%-10s %-17s %12.0f %12.0f\n", kind, "direct to decode", percentile(direct, 0.5),
                percentile(direct, 0.99));
    std::printf("%-10s %-17s %12.0f %12.0f\n", kind, "through proxy", percentile(proxied, 0.5),
                percentile(proxied, 0.99));
  }
  double direct = streams_per_s(decode.port(), concurrency, 20);
  double proxied = streams_per_s(proxy->port(), concurrency, 20);
  std::printf("%d concurrent clients: %.0f streams/s direct, %.0f streams/s through the proxy\n",
              concurrency, direct, proxied);
  return 0;
}

}  // namespace
}  // namespace crescent::proxy

int main(int argc, char** argv) {
  int num_requests = argc > 1 ? std::atoi(argv[1]) : 500;
  int concurrency = argc > 2 ? std::atoi(argv[2]) : 64;
  if (num_requests <= 0 || concurrency <= 0) {
    std::fprintf(stderr, "usage: proxy_overhead_bench [num_requests > 0] [concurrency > 0]\n");
    return 2;
  }
  return crescent::proxy::run(num_requests, concurrency);
}
