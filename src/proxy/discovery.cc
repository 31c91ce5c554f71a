#include "proxy/discovery.h"

#include <chrono>
#include <map>
#include <utility>

#include "bootstrap/etcd_client.h"
#include "core/logging.h"

namespace crescent::proxy {
namespace {

using MemberMap = std::map<std::pair<std::string, std::string>, const ClusterMember*>;

// Members by the route the proxy keeps for them: role and url. A worker restarted on the same
// url publishes a new engine id while its old key lives on until its lease ends; keyed by
// engine id, that old key's expiry would drop the url the new worker serves.
MemberMap by_route(const std::vector<ClusterMember>& members) {
  MemberMap out;
  for (const auto& m : members) {
    out.emplace(std::make_pair(m.role, m.url), &m);
  }
  return out;
}

bool same_route(const ClusterMember& a, const ClusterMember& b) {
  return a.role == b.role && a.url == b.url && a.bootstrap == b.bootstrap;
}

}  // namespace

MembershipChange diff_members(const std::vector<ClusterMember>& before,
                              const std::vector<ClusterMember>& after) {
  const MemberMap old_set = by_route(before);
  const MemberMap new_set = by_route(after);
  MembershipChange change;
  for (const auto& [route, m] : old_set) {
    auto it = new_set.find(route);
    if (it == new_set.end() || !same_route(*it->second, *m)) {
      change.left.push_back(*m);
    }
  }
  for (const auto& [route, m] : new_set) {
    auto it = old_set.find(route);
    if (it == old_set.end() || !same_route(*it->second, *m)) {
      change.joined.push_back(*m);
    }
  }
  return change;
}

Result<PrefillSpec> prefill_spec_of(const ClusterMember& member) {
  PrefillSpec spec;
  ASSIGN_OR_RETURN(spec.server, parse_upstream_url(member.url));
  if (bootstrap::is_etcd_url(member.bootstrap)) {
    RETURN_IF_ERROR(bootstrap::parse_etcd_url(member.bootstrap).status());
    spec.etcd_url = member.bootstrap;
    return spec;
  }
  auto bootstrap = parse_upstream_url(member.bootstrap);
  if (!bootstrap.is_ok()) {
    return invalid_argument("prefill " + member.url + " has bootstrap '" + member.bootstrap +
                            "' (neither etcd://... nor http://HOST:PORT)");
  }
  if (bootstrap->host != spec.server.host) {
    return invalid_argument("prefill " + member.url +
                            " has its bootstrap server on another host (" + member.bootstrap +
                            "); the proxy expects it on the prefill's host");
  }
  spec.bootstrap_port = bootstrap->port;
  return spec;
}

MemberWatcher::MemberWatcher(Reader read, OnChange on_change, int64_t interval_ms)
    : read_(std::move(read)), on_change_(std::move(on_change)), interval_ms_(interval_ms) {}

MemberWatcher::~MemberWatcher() {
  stop();
}

void MemberWatcher::poll_once() {
  std::lock_guard<std::mutex> poll_lock(poll_mu_);
  auto read = read_();
  if (!read.is_ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.is_reachable || stats_.last_error != read.status().message()) {
      CRESCENT_LOG(kWarn) << "proxy: cannot read the cluster members (keeping the last "
                          << members_.size() << "): " << read.status().message();
    }
    stats_.is_reachable = false;
    ++stats_.num_errors;
    stats_.last_error = read.status().message();
    return;
  }
  for (const auto& why : read->skipped) {
    CRESCENT_LOG(kWarn) << "proxy: ignoring cluster member " << why;
  }
  MembershipChange change = diff_members(members_, read->members);
  for (const auto& m : change.left) {
    CRESCENT_LOG(kInfo) << "proxy: " << m.role << " " << m.url << " (engine " << m.engine_id
                        << ") left the cluster";
  }
  for (const auto& m : change.joined) {
    CRESCENT_LOG(kInfo) << "proxy: " << m.role << " " << m.url << " (engine " << m.engine_id
                        << ") joined the cluster";
  }
  members_ = std::move(read->members);
  if (!change.empty()) {
    on_change_(change);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!stats_.is_reachable && stats_.num_errors > 0) {
    CRESCENT_LOG(kInfo) << "proxy: the cluster members can be read again";
  }
  stats_.is_reachable = true;
  ++stats_.num_reads;
  stats_.last_error.clear();
  stats_.num_prefills = stats_.num_decodes = stats_.num_others = 0;
  for (const auto& m : members_) {
    if (m.role == "prefill") {
      ++stats_.num_prefills;
    } else if (m.role == "decode") {
      ++stats_.num_decodes;
    } else {
      ++stats_.num_others;
    }
  }
}

void MemberWatcher::start() {
  poll_once();
  thread_ = std::thread([this] { run(); });
}

void MemberWatcher::run() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::milliseconds(interval_ms_),
                       [this] { return is_stopping_; })) {
        return;
      }
    }
    poll_once();
  }
}

void MemberWatcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

DiscoveryStats MemberWatcher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string MemberWatcher::render_metrics() const {
  const DiscoveryStats s = stats();
  std::string out;
  out +=
      "# HELP crescent_proxy_discovered_members Cluster members in etcd (--discover), by role.\n";
  out += "# TYPE crescent_proxy_discovered_members gauge\n";
  out += "crescent_proxy_discovered_members{role=\"prefill\"} " + std::to_string(s.num_prefills) +
         "\n";
  out +=
      "crescent_proxy_discovered_members{role=\"decode\"} " + std::to_string(s.num_decodes) + "\n";
  out += "crescent_proxy_discovered_members{role=\"other\"} " + std::to_string(s.num_others) + "\n";
  out += "# HELP crescent_proxy_discovery_up 1 when the last read of the members in etcd worked.\n";
  out += "# TYPE crescent_proxy_discovery_up gauge\n";
  out += "crescent_proxy_discovery_up " + std::to_string(s.is_reachable ? 1 : 0) + "\n";
  out += "# HELP crescent_proxy_discovery_errors_total Reads of the members in etcd that failed.\n";
  out += "# TYPE crescent_proxy_discovery_errors_total counter\n";
  out += "crescent_proxy_discovery_errors_total " + std::to_string(s.num_errors) + "\n";
  return out;
}

}  // namespace crescent::proxy
