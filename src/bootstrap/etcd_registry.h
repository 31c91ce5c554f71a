#pragma once
// The bootstrap client's operations (bootstrap_client.h) over etcd keys, for
// `--bootstrap-addr etcd://HOST:PORT[/prefix]` (docs/bootstrap.md, "etcd"). Keys, under the
// url's prefix P (default /crescent):
//   P/engines/<dp>/owner                 = engine id owning dp rank <dp>; its create_revision
//                                          is the dp rank's epoch
//   P/engines/<dp>/workers/<tp>/<pp>     = {"engine_id": E, "addr": "tcp://host:port"}
//   P/encoders/<engine_id>               = "tcp://host:port" (role "encode")
// each under an etcd lease of the worker's lease ttl that the worker keeps alive (LeaseKeeper
// calls etcd_renew_registration every ttl/3), so a crashed worker's keys vanish by themselves
// and a restarted one (new engine id) takes the dp rank over with a higher epoch. A live owner
// is never overwritten: the owner key is created in a transaction only if absent; an owner
// whose address refuses connections (killed) is replaced at once by revoking its lease.

#include <string>
#include <string_view>

#include "bootstrap/bootstrap_client.h"
#include "core/status.h"

namespace crescent::bootstrap {

// Like register_worker, but a dp rank held by another engine whose lease is alive and that
// answers at its address is Unavailable (its key expires within the owner's ttl once it stops
// renewing, so register_with_retry waits for that) instead of AlreadyExists.
Status etcd_register_worker(const std::string& url, const WorkerRegistration& registration,
                            Deadline deadline);
// Keeps the registration's lease alive, re-creating the keys when they expired (etcd was
// unreachable past the ttl) and nobody took the dp rank; is_fenced when another engine owns it.
Result<Renewal> etcd_renew_registration(const std::string& url,
                                        const WorkerRegistration& registration, Deadline deadline);
// Every dp rank with an owner (no 503: etcd does not know how many ranks to expect).
Result<QueryResult> etcd_query(const std::string& url, Deadline deadline);
Result<EncoderTable> etcd_query_encoders(const std::string& url, Deadline deadline);

// OK for "http://host:port[/]" and "etcd://host:port[/prefix]"; InvalidArgument naming the
// input otherwise.
Status check_bootstrap_url(std::string_view url);
// What identifies a bootstrap url in caches: "host:port" for http, "etcd://host:port/prefix".
Result<std::string> bootstrap_url_key(std::string_view url);

}  // namespace crescent::bootstrap
