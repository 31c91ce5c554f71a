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
// The pool can change at run time (`--discover`): add() appends a server (or takes back one
// that left, at its old index), remove() takes one out of rotation for good. Indices are never
// reused for another url, so an index a request in flight holds stays that server's.
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

  // Servers ever added, members or not (indices are 0..size()-1).
  size_t size() const;
  // A server that joined: its index, in rotation (up) at once. A url that is a member already
  // keeps its index and state.
  size_t add(const std::string& url);
  // A server that left: out of rotation, never probed, not in states() or describe_down(),
  // until add() takes it back. Calls already using it finish.
  void remove(size_t index);
  // The index of a url ever added; nullopt for one never added.
  std::optional<size_t> find(const std::string& url) const;
  // Up and a member.
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

  // The members' states.
  std::vector<UpstreamState> states() const;

 private:
  struct Entry {
    UpstreamState state;
    int64_t backoff_ms = 0;
    int64_t next_probe_ms = 0;
    bool is_probing = false;
    bool is_member = true;
  };

  const UpstreamHealthOptions options_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
  uint64_t next_pick_ = 0;      // guarded by mu_
};

}  // namespace crescent::proxy
