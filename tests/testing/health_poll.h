#pragma once
// Polling a server's GET /health until it gives the answer a test waits for: 200 once a proxy
// has polled its upstreams (it says 503 "not polled yet" until then, which on a loaded machine
// can come well after its port opens), or 503 once a server is taken out of service.
// Header-only: the test helpers of several directories share it.

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "core/clock.h"
#include "net/http/http_client.h"

namespace crescent::testing {

struct HealthAnswer {
  int status = 0;  // 0: no answer (refused, timed out)
  std::string body;
};

// Asks 127.0.0.1:port for /health every 20 ms until it answers `want` or `deadline` passes;
// returns the last answer (status == want on success).
inline HealthAnswer poll_health(int port, int want, const Deadline& deadline) {
  net::http::HttpClient client("127.0.0.1", port);
  HealthAnswer last;
  while (true) {
    // One ask may take 2 s, never past the overall deadline (but always at least 100 ms).
    const int64_t ask_ms = std::max<int64_t>(100, std::min<int64_t>(2000, deadline.remaining_ms()));
    auto r = client.request("GET", "/health", "", {}, Deadline::after_ms(ask_ms));
    last = r.is_ok() ? HealthAnswer{r->status, r->body} : HealthAnswer{0, r.status().to_string()};
    if (last.status == want || deadline.is_expired()) {
      return last;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace crescent::testing
