#pragma once
// Cluster membership in etcd, for `crescent proxy --discover` (docs/deployment.md, "Discovery").
// A worker started with `--cluster etcd://HOST:PORT/CLUSTER --advertise-url URL` publishes
//   CLUSTER/members/<role>/<engine_id> = {"url": URL, "role": ROLE, "bootstrap": B,
//                                         "engine_id": E}
// under an etcd lease it keeps alive (MemberPublisher), so the key disappears when the worker
// stops (revoked) or dies (expires after the ttl). B is what a decode server must be told as
// remote_bootstrap_addr for this prefill (its --bootstrap-addr, or http://HOST:BOOTSTRAP_PORT);
// "" for other roles. The proxy reads the prefix (read_cluster_members) and follows it.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::bootstrap {

struct ClusterMember {
  std::string url;        // the OpenAI HTTP base URL: "http://host:port"
  std::string role;       // "prefill", "decode", "both" or "encode"
  std::string bootstrap;  // for a prefill: its bootstrap address; else ""
  std::string engine_id;

  bool operator==(const ClusterMember&) const = default;
};

// "prefill", "decode", "both" and "encode" are; anything else is not.
bool is_member_role(std::string_view role);
// "<cluster prefix>/members/<role>/<engine_id>".
std::string member_key(std::string_view cluster_prefix, const ClusterMember& member);
std::string member_value(const ClusterMember& member);
// A member value back; InvalidArgument naming the field that is missing or wrong.
Result<ClusterMember> parse_member_value(std::string_view value);

// Every member under the cluster url's prefix ("etcd://HOST:PORT/CLUSTER"), in key order.
// Values that do not parse are skipped and named in `skipped` (a newer or broken writer must
// not hide the others).
struct MemberList {
  std::vector<ClusterMember> members;
  std::vector<std::string> skipped = {};  // "key: why"
};
Result<MemberList> read_cluster_members(const std::string& cluster_url, Deadline deadline);

// Keeps one member key alive: grants a lease of ttl_s, puts the key under it, renews every
// ttl/3, and when the lease was lost (etcd restarted, or unreachable past the ttl) grants a new
// one and puts the key again. stop() revokes the lease, so the member leaves at once.
// Thread-safe; the destructor stops.
class MemberPublisher {
 public:
  // Publishes once (so a bad url or an unreachable etcd is an error at start), then keeps it.
  static Result<std::unique_ptr<MemberPublisher>> start(const std::string& cluster_url,
                                                        ClusterMember member, int64_t ttl_s);
  ~MemberPublisher();
  MemberPublisher(const MemberPublisher&) = delete;
  MemberPublisher& operator=(const MemberPublisher&) = delete;

  // Ends the renewals and revokes the lease (bounded: 2 s). Idempotent.
  void stop();
  int64_t num_renewals() const;  // successful keep-alives and re-puts (for tests)

 private:
  MemberPublisher(std::string host, int port, std::string key, std::string value, int64_t ttl_s);
  // Grants a lease and puts the key: the lease id.
  Result<int64_t> publish(Deadline deadline) const;
  void run();

  const std::string host_;
  const int port_;
  const std::string key_;
  const std::string value_;
  const int64_t ttl_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopping_ = false;  // GUARDED_BY(mu_)
  int64_t lease_ = 0;         // GUARDED_BY(mu_); 0 while none is held
  int64_t num_renewals_ = 0;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace crescent::bootstrap
