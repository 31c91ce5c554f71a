#include "bootstrap/etcd_members.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "bootstrap/etcd_client.h"
#include "core/json.h"
#include "core/logging.h"

namespace crescent::bootstrap {
namespace {

constexpr int64_t kCallTimeoutMs = 2000;

Result<std::string> string_field(const nlohmann::json& j, const char* name, bool may_be_empty) {
  if (!j.contains(name) || !j[name].is_string()) {
    return invalid_argument(std::string("a cluster member has no '") + name + "' string");
  }
  std::string s = j[name].get<std::string>();
  if (s.empty() && !may_be_empty) {
    return invalid_argument(std::string("a cluster member has an empty '") + name + "'");
  }
  return s;
}

}  // namespace

bool is_member_role(std::string_view role) {
  return role == "prefill" || role == "decode" || role == "both" || role == "encode";
}

std::string member_key(std::string_view cluster_prefix, const ClusterMember& member) {
  return std::string(cluster_prefix) + "/members/" + member.role + "/" + member.engine_id;
}

std::string member_value(const ClusterMember& member) {
  return nlohmann::json{{"url", member.url},
                        {"role", member.role},
                        {"bootstrap", member.bootstrap},
                        {"engine_id", member.engine_id}}
      .dump();
}

Result<ClusterMember> parse_member_value(std::string_view value) {
  ASSIGN_OR_RETURN(auto j, parse_json(value, "a cluster member value"));
  if (!j.is_object()) {
    return invalid_argument("a cluster member value is not a JSON object");
  }
  ClusterMember m;
  ASSIGN_OR_RETURN(m.url, string_field(j, "url", false));
  ASSIGN_OR_RETURN(m.role, string_field(j, "role", false));
  ASSIGN_OR_RETURN(m.engine_id, string_field(j, "engine_id", false));
  if (j.contains("bootstrap")) {
    ASSIGN_OR_RETURN(m.bootstrap, string_field(j, "bootstrap", true));
  }
  if (!is_member_role(m.role)) {
    return invalid_argument("a cluster member has role '" + m.role +
                            "' (not prefill, decode, both or encode)");
  }
  if (m.role == "prefill" && m.bootstrap.empty()) {
    return invalid_argument("prefill member " + m.url + " has no 'bootstrap'");
  }
  return m;
}

Result<MemberList> read_cluster_members(const std::string& cluster_url, Deadline deadline) {
  ASSIGN_OR_RETURN(EtcdUrl url, parse_etcd_url(cluster_url));
  EtcdClient client(url.host, url.port);
  ASSIGN_OR_RETURN(auto range, client.range_prefix(url.prefix + "/members/", deadline));
  MemberList out;
  for (const EtcdKv& kv : range.kvs) {
    auto member = parse_member_value(kv.value);
    if (!member.is_ok()) {
      out.skipped.push_back(kv.key + ": " + member.status().message());
      continue;
    }
    if (kv.key != member_key(url.prefix, *member)) {
      out.skipped.push_back(kv.key + ": its value names role " + member->role + " and engine " +
                            member->engine_id);
      continue;
    }
    out.members.push_back(std::move(member).value());
  }
  return out;
}

Result<std::unique_ptr<MemberPublisher>> MemberPublisher::start(const std::string& cluster_url,
                                                                ClusterMember member,
                                                                int64_t ttl_s) {
  ASSIGN_OR_RETURN(EtcdUrl url, parse_etcd_url(cluster_url));
  if (ttl_s < 1) {
    return invalid_argument("the member lease ttl must be at least 1 s");
  }
  std::string value = member_value(member);
  RETURN_IF_ERROR(parse_member_value(value).status());
  std::unique_ptr<MemberPublisher> p(new MemberPublisher(
      url.host, url.port, member_key(url.prefix, member), std::move(value), ttl_s));
  ASSIGN_OR_RETURN(int64_t lease, p->publish(Deadline::after_ms(kCallTimeoutMs)));
  {
    std::lock_guard<std::mutex> lock(p->mu_);
    p->lease_ = lease;
  }
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  return p;
}

MemberPublisher::MemberPublisher(std::string host, int port, std::string key, std::string value,
                                 int64_t ttl_s)
    : host_(std::move(host)),
      port_(port),
      key_(std::move(key)),
      value_(std::move(value)),
      ttl_s_(ttl_s) {}

MemberPublisher::~MemberPublisher() {
  stop();
}

Result<int64_t> MemberPublisher::publish(Deadline deadline) const {
  EtcdClient client(host_, port_);
  ASSIGN_OR_RETURN(int64_t lease, client.grant_lease(ttl_s_, deadline));
  Status put = client.put(key_, value_, lease, deadline);
  if (!put.is_ok()) {
    (void)client.revoke_lease(lease, Deadline::after_ms(kCallTimeoutMs));
    return put;
  }
  return lease;
}

void MemberPublisher::run() {
  const auto period = std::chrono::milliseconds(std::max<int64_t>(1, ttl_s_ * 1000 / 3));
  EtcdClient client(host_, port_);
  while (true) {
    int64_t lease = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, period, [this] { return is_stopping_; })) {
        return;
      }
      lease = lease_;
    }
    Status renewed;
    if (lease != 0) {
      renewed = client.keep_alive(lease, Deadline::after_ms(kCallTimeoutMs)).status();
    }
    if (lease == 0 || renewed.code() == StatusCode::kNotFound) {
      // Lost (etcd restarted or unreachable past the ttl): the key is gone; publish again.
      auto again = publish(Deadline::after_ms(kCallTimeoutMs));
      renewed = again.status();
      std::lock_guard<std::mutex> lock(mu_);
      lease_ = again.is_ok() ? *again : 0;
      if (again.is_ok()) {
        CRESCENT_LOG(kInfo) << "cluster: published " << key_ << " again (new lease)";
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (renewed.is_ok()) {
      ++num_renewals_;
    } else {
      CRESCENT_LOG(kWarn) << "cluster: cannot renew member " << key_ << " in etcd " << host_ << ":"
                          << port_ << ": " << renewed.message();
    }
  }
}

void MemberPublisher::stop() {
  int64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (is_stopping_) {
      return;
    }
    is_stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);  // the thread has ended: lease_ is final
    lease = lease_;
    lease_ = 0;
  }
  if (lease != 0) {
    EtcdClient client(host_, port_);
    (void)client.revoke_lease(lease, Deadline::after_ms(kCallTimeoutMs));
  }
}

int64_t MemberPublisher::num_renewals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return num_renewals_;
}

}  // namespace crescent::bootstrap
