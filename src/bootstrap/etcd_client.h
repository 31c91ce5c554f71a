#pragma once
// A small blocking client of etcd's v3 JSON gateway (etcd 3.4: POST /v3/...), enough for
// discovery: leases (grant, keep alive once, revoke), put under a lease, create-if-absent,
// range by prefix and delete. Keys and values travel base64 in JSON; int64s as strings.
// One HTTP connection per call (calls are rare: registration, a renewal per ttl/3, queries).
// Every call takes a Deadline. Errors: Unavailable when etcd cannot be reached or answers 5xx;
// DeadlineExceeded past the deadline; DataLoss when the answer is not the documented shape;
// InvalidArgument when etcd refuses the request (4xx). Thread-safe (no shared state).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::bootstrap {

// "etcd://host:port[/prefix]" split up. The prefix has no trailing '/', starts with '/', and
// defaults to "/crescent".
struct EtcdUrl {
  std::string host;
  int port = 0;
  std::string prefix;
};
inline constexpr std::string_view kEtcdScheme = "etcd://";
inline constexpr std::string_view kDefaultEtcdPrefix = "/crescent";
bool is_etcd_url(std::string_view url);
// InvalidArgument naming the input when it is not that shape.
Result<EtcdUrl> parse_etcd_url(std::string_view url);

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none
};

class EtcdClient {
 public:
  EtcdClient(std::string host, int port);

  // A lease of ttl_s seconds (>= 1; etcd may grant more). Its id.
  Result<int64_t> grant_lease(int64_t ttl_s, Deadline deadline);
  // One keep-alive: the ttl left after it; NotFound when the lease has expired or was revoked.
  Result<int64_t> keep_alive(int64_t lease, Deadline deadline);
  Status revoke_lease(int64_t lease, Deadline deadline);
  // Puts key=value, attached to lease when it is not 0.
  Status put(std::string_view key, std::string_view value, int64_t lease, Deadline deadline);
  // Puts every pair under lease only if `key` does not exist (create_revision == 0), in one
  // transaction. `created` with the transaction's revision (the new key's create_revision), or
  // the key's current value.
  struct CreateResult {
    bool created = false;
    int64_t revision = 0;  // when created
    EtcdKv existing;       // when not
  };
  Result<CreateResult> create_if_absent(
      std::string_view key, const std::vector<std::pair<std::string, std::string>>& puts,
      int64_t lease, Deadline deadline);
  // The key, or nullopt when absent.
  Result<std::optional<EtcdKv>> get(std::string_view key, Deadline deadline);
  // Every key starting with prefix, in key order, and the store's revision when read.
  struct RangeResult {
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
  };
  Result<RangeResult> range_prefix(std::string_view prefix, Deadline deadline);
  // Deletes one key (absent is fine): the number deleted.
  Result<int64_t> delete_key(std::string_view key, Deadline deadline);

  std::string endpoint() const;  // "host:port", for messages

 private:
  // POSTs body to target; the parsed 200 answer as JSON text, or the mapped error.
  Result<std::string> post(std::string_view target, std::string body, Deadline deadline);

  std::string host_;
  int port_;
};

}  // namespace crescent::bootstrap
