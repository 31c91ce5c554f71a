#pragma once
// `crescent proxy --discover etcd://HOST:PORT/CLUSTER`: the prefill and decode servers that
// publish themselves under CLUSTER/members/ (bootstrap/etcd_members.h) join and leave the
// proxy's rotation at run time, next to the ones given on the command line.
//
// MemberWatcher reads the members every interval on its own thread and hands the difference
// from the last read to a callback (diff_members). When etcd cannot be read, the last known
// set is kept (a worker is not dropped because etcd restarts), the failure is logged once per
// change and counted, and reachable() is false until a read works again.
//
// Thread-safe; the destructor stops.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/etcd_members.h"
#include "core/status.h"
#include "proxy/proxy_options.h"

namespace crescent::proxy {

using bootstrap::ClusterMember;

// What changed between two reads, by route: role and url. A worker restarted on its url under
// a new engine id changes nothing (its old key may outlive the restart by a lease; health
// checks cover the gap); one whose bootstrap changed leaves and joins again, and a url with
// no member left leaves.
struct MembershipChange {
  std::vector<ClusterMember> joined;
  std::vector<ClusterMember> left;
  bool empty() const { return joined.empty() && left.empty(); }
};
MembershipChange diff_members(const std::vector<ClusterMember>& before,
                              const std::vector<ClusterMember>& after);

// The prefill a "prefill" member describes: its url, and its bootstrap (etcd://..., or
// http://HOST:PORT on the member's own host). InvalidArgument naming what is wrong.
Result<PrefillSpec> prefill_spec_of(const ClusterMember& member);

struct DiscoveryStats {
  bool is_reachable = false;  // the last read worked
  uint64_t num_reads = 0;     // that worked
  uint64_t num_errors = 0;    // reads that failed
  std::string last_error;     // of the last failed read ("" once one works again)
  int num_prefills = 0;       // members now, by role
  int num_decodes = 0;
  int num_others = 0;  // "both" and "encode": not routed by discovery
};

class MemberWatcher {
 public:
  using Reader = std::function<Result<bootstrap::MemberList>()>;
  using OnChange = std::function<void(const MembershipChange&)>;

  // `read` lists the members (read_cluster_members, or a fake in tests); `on_change` runs on
  // the watcher's thread, never concurrently with itself.
  MemberWatcher(Reader read, OnChange on_change, int64_t interval_ms);
  ~MemberWatcher();  // stop()
  MemberWatcher(const MemberWatcher&) = delete;
  MemberWatcher& operator=(const MemberWatcher&) = delete;

  // One read now, on the caller's thread (start() does one before its thread runs, so a proxy
  // knows its members when it starts listening).
  void poll_once();
  void start();
  void stop();  // joins; idempotent

  DiscoveryStats stats() const;
  // Prometheus text: crescent_proxy_discovered_members{role}, crescent_proxy_discovery_up,
  // crescent_proxy_discovery_errors_total.
  std::string render_metrics() const;

 private:
  void run();

  const Reader read_;
  const OnChange on_change_;
  const int64_t interval_ms_;
  std::mutex poll_mu_;                  // one poll at a time
  std::vector<ClusterMember> members_;  // guarded by poll_mu_: the last set applied
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopping_ = false;  // guarded by mu_
  DiscoveryStats stats_;      // guarded by mu_
  std::thread thread_;
};

}  // namespace crescent::proxy
