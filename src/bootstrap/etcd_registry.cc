// Registrations as etcd keys under leases (etcd_registry.h). A registration is stateless on
// the worker's side: every renewal reads its worker key back, keeps that key's lease alive,
// and checks that the dp rank's owner key still names its engine; a lease that expired
// meanwhile (etcd unreachable past the ttl) is replaced by a new one when nobody took the rank.

#include "bootstrap/etcd_registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "bootstrap/etcd_client.h"
#include "bootstrap/wire.h"
#include "core/json.h"
#include "core/logging.h"
#include "net/socket.h"

namespace crescent::bootstrap {
namespace {

using nlohmann::json;

std::string engines_prefix(const EtcdUrl& u) {
  return u.prefix + "/engines/";
}
std::string encoders_prefix(const EtcdUrl& u) {
  return u.prefix + "/encoders/";
}
std::string owner_key(const EtcdUrl& u, int dp) {
  return engines_prefix(u) + std::to_string(dp) + "/owner";
}
std::string worker_key(const EtcdUrl& u, const WorkerRegistration& r) {
  return engines_prefix(u) + std::to_string(r.dp_rank) + "/workers/" + std::to_string(r.tp_rank) +
         "/" + std::to_string(r.pp_rank);
}

std::string worker_value(const WorkerRegistration& r) {
  return json{{"engine_id", r.engine_id}, {"addr", r.addr}}.dump();
}

// {"engine_id", "addr"} of a worker key; nullopt when it is not that shape.
std::optional<std::pair<std::string, std::string>> parse_worker_value(std::string_view value) {
  auto parsed = parse_json(value, "an etcd worker value");
  if (!parsed.is_ok() || !parsed->is_object()) {
    return std::nullopt;
  }
  auto id = parsed->find("engine_id");
  auto addr = parsed->find("addr");
  if (id == parsed->end() || !id->is_string() || addr == parsed->end() || !addr->is_string()) {
    return std::nullopt;
  }
  return std::make_pair(id->get<std::string>(), addr->get<std::string>());
}

// A rank in a key: digits only, at most `max`.
std::optional<int> parse_rank(std::string_view text, int max) {
  int v = 0;
  if (text.empty() || text.size() > 5) {
    return std::nullopt;
  }
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0 || v > max) {
    return std::nullopt;
  }
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    parts.push_back(s.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) {
      return parts;
    }
    start = at + 1;
  }
}

int64_t lease_seconds(double ttl_s) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ttl_s)));
}

Status check_registration(const WorkerRegistration& r) {
  if (r.engine_id.empty() || r.engine_id.size() > kMaxEngineIdBytes) {
    return invalid_argument("engine_id must be 1 to " + std::to_string(kMaxEngineIdBytes) +
                            " bytes");
  }
  if (r.engine_id.find('/') != std::string::npos) {
    return invalid_argument("engine_id '" + r.engine_id + "' must not hold '/' (an etcd key part)");
  }
  if (r.dp_rank < 0 || r.dp_rank >= kMaxDpRanks || r.tp_rank < 0 || r.tp_rank > kMaxTpPpRank ||
      r.pp_rank < 0 || r.pp_rank > kMaxTpPpRank) {
    return invalid_argument("a rank is out of range");
  }
  if (!(r.lease_ttl_s >= 0) || r.lease_ttl_s > kMaxLeaseTtlS) {
    return invalid_argument("lease_ttl_s must be in [0, " + std::to_string(kMaxLeaseTtlS) + "]");
  }
  return internal::to_status(parse_tcp_addr(r.addr));
}

// A new lease for the registration (0: it asked for none, the keys never expire).
Result<std::pair<int64_t, double>> new_lease(EtcdClient& client, const WorkerRegistration& r,
                                             Deadline deadline) {
  if (r.lease_ttl_s <= 0) {
    return std::make_pair(int64_t{0}, 0.0);
  }
  int64_t ttl = lease_seconds(r.lease_ttl_s);
  ASSIGN_OR_RETURN(int64_t lease, client.grant_lease(ttl, deadline));
  return std::make_pair(lease, static_cast<double>(ttl));
}

// The lease's ttl after a keep-alive; nullopt when it has expired.
Result<std::optional<double>> keep(EtcdClient& client, int64_t lease, double asked,
                                   Deadline deadline) {
  if (lease == 0) {
    return std::optional<double>(0.0);
  }
  auto ttl = client.keep_alive(lease, deadline);
  if (!ttl.is_ok()) {
    if (ttl.status().code() == StatusCode::kNotFound) {
      return std::optional<double>();
    }
    return ttl.status();
  }
  // etcd answers the lease's full ttl after a keep-alive; never more than was asked.
  return std::optional<double>(std::min(asked, static_cast<double>(*ttl)));
}

Result<Renewal> renew_encoder(const EtcdUrl& u, EtcdClient& client, const WorkerRegistration& r,
                              Deadline deadline) {
  const std::string key = encoders_prefix(u) + r.engine_id;
  ASSIGN_OR_RETURN(auto existing, client.get(key, deadline));
  if (existing && existing->value == r.addr) {
    ASSIGN_OR_RETURN(auto ttl, keep(client, existing->lease, r.lease_ttl_s, deadline));
    if (ttl) {
      return Renewal{Registered{static_cast<uint64_t>(existing->create_revision), *ttl, true},
                     false, ""};
    }
  }
  ASSIGN_OR_RETURN(auto lease, new_lease(client, r, deadline));
  RETURN_IF_ERROR(client.put(key, r.addr, lease.first, deadline));
  ASSIGN_OR_RETURN(auto written, client.get(key, deadline));
  uint64_t epoch = written ? static_cast<uint64_t>(written->create_revision) : 0;
  return Renewal{Registered{epoch, lease.second, false}, false, ""};
}

// True when something accepts a TCP connection at the "tcp://host:port" of the owner's tp 0 /
// pp 0 worker within 500 ms (a worker killed with -9 refuses at once), or when that cannot be
// told (no such key, etcd failed): only an owner seen gone is replaced before its lease lapses.
bool owner_answers(const EtcdUrl& u, EtcdClient& client, int dp, const EtcdKv& owner,
                   Deadline deadline) {
  WorkerRegistration first;
  first.dp_rank = dp;
  auto kv = client.get(worker_key(u, first), deadline);
  if (!kv.is_ok() || !kv->has_value()) {
    return true;
  }
  auto value = parse_worker_value((*kv)->value);
  if (!value || value->first != owner.value) {
    return true;
  }
  auto host_port = parse_tcp_addr(value->second);
  if (!host_port.is_ok()) {
    return true;
  }
  Deadline probe = Deadline::after_ms(std::min<int64_t>(500, deadline.remaining_ms()));
  return net::connect_tcp(host_port->first, host_port->second, probe).is_ok();
}

// may_replace: a registration (not a renewal) may take the rank of an owner that no longer
// answers at its address, as the HTTP bootstrap does, instead of waiting for its lease.
Result<Renewal> renew(const std::string& url, const WorkerRegistration& r, bool may_replace,
                      Deadline deadline) {
  ASSIGN_OR_RETURN(EtcdUrl u, parse_etcd_url(url));
  if (Status s = check_registration(r); !s.is_ok()) {
    return s.with_context("etcd registration of engine '" + r.engine_id + "'");
  }
  EtcdClient client(u.host, u.port);
  if (r.role == kEncodeRole) {
    return renew_encoder(u, client, r, deadline);
  }
  if (!r.role.empty()) {
    return invalid_argument("etcd registration: unknown role '" + r.role + "'");
  }
  const std::string owner = owner_key(u, r.dp_rank);
  const std::string worker = worker_key(u, r);
  auto fenced = [&](const EtcdKv& kv) {
    return Renewal{{},
                   true,
                   "dp_rank " + std::to_string(r.dp_rank) + " at " + url +
                       " is registered by engine_id '" + kv.value + "' (epoch " +
                       std::to_string(kv.create_revision) + ", its lease alive)"};
  };

  // Our worker key with a live lease: a renewal.
  int64_t lease = 0;
  double granted = 0;
  bool is_new_lease = false;
  ASSIGN_OR_RETURN(auto mine, client.get(worker, deadline));
  if (mine) {
    auto value = parse_worker_value(mine->value);
    if (value && value->first == r.engine_id) {
      ASSIGN_OR_RETURN(auto ttl, keep(client, mine->lease, r.lease_ttl_s, deadline));
      if (ttl) {
        lease = mine->lease;
        granted = *ttl;
        ASSIGN_OR_RETURN(auto owner_kv, client.get(owner, deadline));
        if (owner_kv && owner_kv->value == r.engine_id) {
          if (value->second != r.addr) {
            RETURN_IF_ERROR(client.put(worker, worker_value(r), lease, deadline));
          }
          return Renewal{
              Registered{static_cast<uint64_t>(owner_kv->create_revision), granted, true}, false,
              ""};
        }
        if (owner_kv) {
          return fenced(*owner_kv);
        }
        // The owner key is gone (another worker of this engine held it): take it below.
      }
    }
  }
  if (lease == 0 && r.lease_ttl_s > 0) {
    ASSIGN_OR_RETURN(auto fresh, new_lease(client, r, deadline));
    lease = fresh.first;
    granted = fresh.second;
    is_new_lease = true;
  }
  ASSIGN_OR_RETURN(auto created,
                   client.create_if_absent(owner, {{owner, r.engine_id}, {worker, worker_value(r)}},
                                           lease, deadline));
  if (!created.created && created.existing.value != r.engine_id && may_replace &&
      !owner_answers(u, client, r.dp_rank, created.existing, deadline)) {
    // The owner is gone (its address refuses connections): end its lease, which takes its
    // keys, and try once more (another newcomer may still win the race).
    CRESCENT_LOG(kInfo) << "bootstrap: dp_rank " << r.dp_rank << " at " << url << ": owner '"
                        << created.existing.value
                        << "' does not answer at its address; replacing it";
    if (created.existing.lease != 0) {
      RETURN_IF_ERROR(client.revoke_lease(created.existing.lease, deadline));
    } else {
      RETURN_IF_ERROR(client.delete_key(owner, deadline));
    }
    ASSIGN_OR_RETURN(
        created, client.create_if_absent(owner, {{owner, r.engine_id}, {worker, worker_value(r)}},
                                         lease, deadline));
  }
  if (created.created) {
    return Renewal{Registered{static_cast<uint64_t>(created.revision), granted, false}, false, ""};
  }
  if (created.existing.value == r.engine_id) {
    // Another worker (tp/pp rank) of this engine owns the rank: join it.
    RETURN_IF_ERROR(client.put(worker, worker_value(r), lease, deadline));
    return Renewal{
        Registered{static_cast<uint64_t>(created.existing.create_revision), granted, false}, false,
        ""};
  }
  if (is_new_lease) {
    // Best effort: an unused lease expires by itself anyway.
    (void)client.revoke_lease(lease, Deadline::after_ms(1000));
  }
  return fenced(created.existing);
}

}  // namespace

Status etcd_register_worker(const std::string& url, const WorkerRegistration& registration,
                            Deadline deadline) {
  ASSIGN_OR_RETURN(Renewal renewal, renew(url, registration, /*may_replace=*/true, deadline));
  if (renewal.is_fenced) {
    // The owner's keys vanish within its ttl once it is gone: worth retrying.
    return unavailable(renewal.fenced_reason + "; waiting for its lease to expire");
  }
  return Status::ok();
}

Result<Renewal> etcd_renew_registration(const std::string& url,
                                        const WorkerRegistration& registration, Deadline deadline) {
  return renew(url, registration, /*may_replace=*/false, deadline);
}

Result<QueryResult> etcd_query(const std::string& url, Deadline deadline) {
  ASSIGN_OR_RETURN(EtcdUrl u, parse_etcd_url(url));
  EtcdClient client(u.host, u.port);
  const std::string prefix = engines_prefix(u);
  ASSIGN_OR_RETURN(auto range, client.range_prefix(prefix, deadline));
  auto bad = [&](const EtcdKv& kv) {
    return data_loss("etcd " + url + " holds an unexpected key '" + kv.key + "' (or value '" +
                     kv.value.substr(0, 100) + "') under " + prefix);
  };
  QueryResult result;
  struct Worker {
    int dp, tp, pp;
    std::string engine_id, addr;
  };
  std::vector<Worker> workers;
  for (const EtcdKv& kv : range.kvs) {
    auto parts = split(std::string_view(kv.key).substr(prefix.size()), '/');
    auto dp = parse_rank(parts[0], kMaxDpRanks - 1);
    if (!dp) {
      return bad(kv);
    }
    if (parts.size() == 2 && parts[1] == "owner") {
      if (kv.value.empty()) {
        return bad(kv);
      }
      DpEntry& entry = result[*dp];
      entry.engine_id = kv.value;
      entry.epoch = static_cast<uint64_t>(kv.create_revision);
      continue;
    }
    if (parts.size() != 4 || parts[1] != "workers") {
      return bad(kv);
    }
    auto tp = parse_rank(parts[2], kMaxTpPpRank);
    auto pp = parse_rank(parts[3], kMaxTpPpRank);
    auto value = parse_worker_value(kv.value);
    if (!tp || !pp || !value || !parse_tcp_addr(value->second).is_ok()) {
      return bad(kv);
    }
    workers.push_back(Worker{*dp, *tp, *pp, value->first, value->second});
  }
  // A worker counts for the engine that owns its rank now (an old owner's worker whose lease
  // has not run out yet does not).
  for (const Worker& w : workers) {
    auto it = result.find(w.dp);
    if (it != result.end() && it->second.engine_id == w.engine_id) {
      it->second.worker_addr[w.tp][w.pp] = w.addr;
    }
  }
  return result;
}

Result<EncoderTable> etcd_query_encoders(const std::string& url, Deadline deadline) {
  ASSIGN_OR_RETURN(EtcdUrl u, parse_etcd_url(url));
  EtcdClient client(u.host, u.port);
  const std::string prefix = encoders_prefix(u);
  ASSIGN_OR_RETURN(auto range, client.range_prefix(prefix, deadline));
  EncoderTable table;
  for (const EtcdKv& kv : range.kvs) {
    std::string id = kv.key.substr(prefix.size());
    if (id.empty() || id.find('/') != std::string::npos || !parse_tcp_addr(kv.value).is_ok()) {
      return data_loss("etcd " + url + " holds an unexpected key '" + kv.key + "' (or value '" +
                       kv.value.substr(0, 100) + "') under " + prefix);
    }
    table[id] = kv.value;
  }
  return table;
}

Status check_bootstrap_url(std::string_view url) {
  if (is_etcd_url(url)) {
    return internal::to_status(parse_etcd_url(url));
  }
  return internal::to_status(parse_http_url(url));
}

Result<std::string> bootstrap_url_key(std::string_view url) {
  if (is_etcd_url(url)) {
    ASSIGN_OR_RETURN(EtcdUrl u, parse_etcd_url(url));
    return "etcd://" + u.host + ":" + std::to_string(u.port) + u.prefix;
  }
  ASSIGN_OR_RETURN(auto host_port, parse_http_url(url));
  return host_port.first + ":" + std::to_string(host_port.second);
}

}  // namespace crescent::bootstrap
