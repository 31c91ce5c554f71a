#pragma once
// Which servers of one upstream pool (the decode servers, or the --pd servers) are in rotation.
//
// A call that could not reach a server (connection refused or reset, connect timeout: no
// answer at all) ejects it at once: the round-robin skips it, and when no server of the pool is
// up the proxy answers 503 without starting anything. An ejected server is probed (GET /health)
// after a backoff that doubles on every failed probe (base, 2 base, ... up to max); a probe that
// answers 200 puts it back. An error status from a server that answers is not an ejection: the
// server is alive and its error reaches the client.
//
// Pure bookkeeping on a clock the caller passes in (milliseconds, any origin), so tests drive it
// with a fake clock; ProxyServer runs the probes on its own thread. Thread-safe.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace crescent::proxy {

struct UpstreamHealthOptions {
  int64_t base_backoff_ms = 250;   // first probe after an ejection
  int64_t max_backoff_ms = 8'000;  // probes of a server that stays down, at most this apart
};

struct UpstreamState {
  std::string url;
  bool is_up = true;
  uint64_t num_ejections = 0;
  std::string why_down;  // the failure that ejected it, or the last failed probe ("" when up)
};

class UpstreamHealth {
 public:
  UpstreamHealth(std::vector<std::string> urls, UpstreamHealthOptions options = {});

  size_t size() const { return num_upstreams_; }
  bool is_up(size_t index) const;
  int num_up() const;
  // The next server that is up, round-robin over the pool; nullopt when none is.
  std::optional<size_t> next_up();
  // "D1 (why), D2 (why)": the servers that are down, for a 503's message.
  std::string describe_down() const;

  // A call to `index` got no answer at now_ms: ejects it if it was up (the first probe is due
  // base_backoff_ms later). A server already down keeps its probe schedule.
  void report_unreachable(size_t index, int64_t now_ms, const std::string& why);
  // Servers whose probe is due at now_ms; each is then "being probed" until its probe result is
  // reported, so it is returned once.
  std::vector<size_t> take_due_probes(int64_t now_ms);
  // A probe answered 200: back in rotation, backoff reset.
  void probe_succeeded(size_t index);
  // A probe failed at now_ms: the next one waits twice as long (up to max_backoff_ms).
  void probe_failed(size_t index, int64_t now_ms, const std::string& why);

  std::vector<UpstreamState> states() const;

 private:
  struct Entry {
    UpstreamState state;
    int64_t backoff_ms = 0;
    int64_t next_probe_ms = 0;
    bool is_probing = false;
  };

  const UpstreamHealthOptions options_;
  const size_t num_upstreams_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
  uint64_t next_pick_ = 0;      // guarded by mu_
};

}  // namespace crescent::proxy
