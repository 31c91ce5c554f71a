// etcd v3 JSON gateway calls. The gateway (grpc-gateway) writes int64 fields as strings, leaves
// out fields at their default (false, 0, empty), and answers a gRPC error as a non-200 status
// with {"error": ..., "message": ..., "code": N}. Everything read here is checked for shape
// without letting nlohmann's exceptions out.

#include "bootstrap/etcd_client.h"

#include <array>
#include <cctype>
#include <charconv>
#include <utility>

#include "bootstrap/bootstrap_client.h"
#include "core/base64.h"
#include "core/json.h"
#include "net/http/http_client.h"

namespace crescent::bootstrap {
namespace {

using nlohmann::json;

// RFC 4648 base64 (what the gateway writes for bytes fields). nullopt on a bad character.
std::optional<std::string> base64_decode(std::string_view in) {
  static constexpr std::array<int8_t, 256> kTable = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    constexpr std::string_view kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < kAlphabet.size(); ++i) {
      t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
    }
    return t;
  }();
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') {
      break;
    }
    int v = kTable[static_cast<unsigned char>(c)];
    if (v < 0) {
      return std::nullopt;
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// An int64 field: a string of digits (how the gateway writes them) or a number; 0 when absent.
std::optional<int64_t> int_field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    return 0;
  }
  if (it->is_number_integer()) {
    return it->get<int64_t>();
  }
  if (!it->is_string()) {
    return std::nullopt;
  }
  const std::string& s = it->get_ref<const std::string&>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return std::nullopt;
  }
  return v;
}

// A bytes field decoded; "" when absent.
std::optional<std::string> bytes_field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) {
    return std::string();
  }
  if (!it->is_string()) {
    return std::nullopt;
  }
  return base64_decode(it->get_ref<const std::string&>());
}

Status bad_answer(std::string_view what, std::string_view body) {
  return data_loss("etcd answered " + std::string(what) +
                   " with an unexpected body: " + std::string(body.substr(0, 200)));
}

Result<EtcdKv> parse_kv(const json& kv, std::string_view body) {
  if (!kv.is_object()) {
    return bad_answer("a kv", body);
  }
  auto key = bytes_field(kv, "key");
  auto value = bytes_field(kv, "value");
  auto create = int_field(kv, "create_revision");
  auto mod = int_field(kv, "mod_revision");
  auto lease = int_field(kv, "lease");
  if (!key || !value || !create || !mod || !lease) {
    return bad_answer("a kv", body);
  }
  return EtcdKv{*key, *value, *create, *mod, *lease};
}

// The "kvs" of a RangeResponse object.
Result<std::vector<EtcdKv>> parse_kvs(const json& range, std::string_view body) {
  std::vector<EtcdKv> kvs;
  auto it = range.find("kvs");
  if (it == range.end() || it->is_null()) {
    return kvs;
  }
  if (!it->is_array()) {
    return bad_answer("kvs", body);
  }
  for (const json& kv : *it) {
    ASSIGN_OR_RETURN(EtcdKv parsed, parse_kv(kv, body));
    kvs.push_back(std::move(parsed));
  }
  return kvs;
}

// The first key after every key that starts with prefix (etcd's range_end for a prefix).
std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Result<json> parse_answer(const std::string& body, std::string_view what) {
  auto parsed = parse_json(body, "etcd answer");
  if (!parsed.is_ok() || !parsed->is_object()) {
    return bad_answer(what, body);
  }
  return std::move(parsed).value();
}

}  // namespace

bool is_etcd_url(std::string_view url) {
  return url.substr(0, kEtcdScheme.size()) == kEtcdScheme;
}

Result<EtcdUrl> parse_etcd_url(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return invalid_argument("bad etcd url '" + std::string(url) + "': " + std::string(why));
  };
  if (!is_etcd_url(url)) {
    return bad("expected etcd://host:port[/prefix]");
  }
  std::string_view rest = url.substr(kEtcdScheme.size());
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string prefix;
  if (slash != std::string_view::npos) {
    prefix = std::string(rest.substr(slash));
  }
  while (!prefix.empty() && prefix.back() == '/') {
    prefix.pop_back();
  }
  if (prefix.empty()) {
    prefix = std::string(kDefaultEtcdPrefix);
  }
  if (prefix.size() > 200) {
    return bad("prefix longer than 200 characters");
  }
  for (char c : prefix) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '/' || c == '-' ||
              c == '_' || c == '.';
    if (!ok) {
      return bad("the prefix may hold letters, digits, '/', '-', '_' and '.' only");
    }
  }
  // The host:port rules are the bootstrap url's.
  auto host_port = parse_http_url("http://" + std::string(authority));
  if (!host_port.is_ok()) {
    return bad("expected etcd://host:port[/prefix] (" + host_port.status().message() + ")");
  }
  return EtcdUrl{host_port->first, host_port->second, prefix};
}

EtcdClient::EtcdClient(std::string host, int port) : host_(std::move(host)), port_(port) {}

std::string EtcdClient::endpoint() const {
  return host_ + ":" + std::to_string(port_);
}

Result<std::string> EtcdClient::post(std::string_view target, std::string body, Deadline deadline) {
  const std::string what = "etcd POST " + endpoint() + std::string(target);
  net::http::HttpClient client(host_, port_);
  net::http::Headers headers;
  headers["Content-Type"] = "application/json";
  auto response = client.request("POST", target, std::move(body), headers, deadline);
  if (!response.is_ok()) {
    return response.status().with_context(what);
  }
  if (response->status == 200) {
    return std::move(response->body);
  }
  std::string message =
      what + " answered " + std::to_string(response->status) + ": " + response->body.substr(0, 300);
  if (response->status >= 500 && response->body.find("lease not found") != std::string::npos) {
    return not_found(message);
  }
  if (response->status >= 500 || response->status == 429) {
    return unavailable(message);
  }
  if (response->status == 404 && response->body.find("lease not found") != std::string::npos) {
    return not_found(message);
  }
  return invalid_argument(message);
}

Result<int64_t> EtcdClient::grant_lease(int64_t ttl_s, Deadline deadline) {
  ASSIGN_OR_RETURN(std::string body,
                   post("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump(), deadline));
  ASSIGN_OR_RETURN(json answer, parse_answer(body, "a lease grant"));
  auto id = int_field(answer, "ID");
  if (!id || *id == 0) {
    return bad_answer("a lease grant", body);
  }
  return *id;
}

Result<int64_t> EtcdClient::keep_alive(int64_t lease, Deadline deadline) {
  // A streaming call: one request in the body gives one {"result": ...} answer, then the
  // gateway ends the stream.
  ASSIGN_OR_RETURN(std::string body, post("/v3/lease/keepalive",
                                          json{{"ID", std::to_string(lease)}}.dump(), deadline));
  size_t end = body.find('\n');
  std::string first = body.substr(0, end);
  ASSIGN_OR_RETURN(json answer, parse_answer(first, "a lease keep-alive"));
  if (answer.contains("error")) {
    return not_found("etcd lease " + std::to_string(lease) +
                     " keep-alive failed: " + first.substr(0, 200));
  }
  auto result = answer.find("result");
  if (result == answer.end() || !result->is_object()) {
    return bad_answer("a lease keep-alive", body);
  }
  auto ttl = int_field(*result, "TTL");
  if (!ttl) {
    return bad_answer("a lease keep-alive", body);
  }
  if (*ttl <= 0) {
    return not_found("etcd lease " + std::to_string(lease) + " has expired");
  }
  return *ttl;
}

Status EtcdClient::revoke_lease(int64_t lease, Deadline deadline) {
  auto revoked = post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump(), deadline);
  if (!revoked.is_ok() && revoked.status().code() != StatusCode::kNotFound) {
    return revoked.status();
  }
  return Status::ok();
}

Status EtcdClient::put(std::string_view key, std::string_view value, int64_t lease,
                       Deadline deadline) {
  json request{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) {
    request["lease"] = std::to_string(lease);
  }
  return internal::to_status(post("/v3/kv/put", request.dump(), deadline));
}

Result<EtcdClient::CreateResult> EtcdClient::create_if_absent(
    std::string_view key, const std::vector<std::pair<std::string, std::string>>& puts,
    int64_t lease, Deadline deadline) {
  json success = json::array();
  for (const auto& [k, v] : puts) {
    json put{{"key", base64_encode(k)}, {"value", base64_encode(v)}};
    if (lease != 0) {
      put["lease"] = std::to_string(lease);
    }
    success.push_back(json{{"request_put", put}});
  }
  json request{
      {"compare", json::array({json{{"key", base64_encode(key)},
                                    {"target", "CREATE"},
                                    {"result", "EQUAL"},
                                    {"create_revision", "0"}}})},
      {"success", success},
      {"failure", json::array({json{{"request_range", json{{"key", base64_encode(key)}}}}})}};
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/txn", request.dump(), deadline));
  ASSIGN_OR_RETURN(json answer, parse_answer(body, "a txn"));
  CreateResult result;
  auto succeeded = answer.find("succeeded");
  if (succeeded != answer.end() && succeeded->is_boolean() && succeeded->get<bool>()) {
    auto header = answer.find("header");
    std::optional<int64_t> revision;
    if (header != answer.end() && header->is_object()) {
      revision = int_field(*header, "revision");
    }
    if (!revision || *revision <= 0) {
      return bad_answer("a txn", body);
    }
    result.created = true;
    result.revision = *revision;
    return result;
  }
  auto responses = answer.find("responses");
  if (responses == answer.end() || !responses->is_array() || responses->size() != 1 ||
      !(*responses)[0].is_object() || !(*responses)[0].contains("response_range")) {
    return bad_answer("a txn", body);
  }
  ASSIGN_OR_RETURN(auto kvs, parse_kvs((*responses)[0]["response_range"], body));
  if (kvs.empty()) {
    // Deleted (expired) between the compare and the range: the caller tries again.
    return unavailable("etcd key '" + std::string(key) + "' changed during a txn; try again");
  }
  result.existing = std::move(kvs[0]);
  return result;
}

Result<std::optional<EtcdKv>> EtcdClient::get(std::string_view key, Deadline deadline) {
  ASSIGN_OR_RETURN(std::string body,
                   post("/v3/kv/range", json{{"key", base64_encode(key)}}.dump(), deadline));
  ASSIGN_OR_RETURN(json answer, parse_answer(body, "a range"));
  ASSIGN_OR_RETURN(auto kvs, parse_kvs(answer, body));
  if (kvs.empty()) {
    return std::optional<EtcdKv>();
  }
  return std::optional<EtcdKv>(std::move(kvs[0]));
}

Result<EtcdClient::RangeResult> EtcdClient::range_prefix(std::string_view prefix,
                                                         Deadline deadline) {
  json request{{"key", base64_encode(prefix)}, {"range_end", base64_encode(prefix_end(prefix))}};
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", request.dump(), deadline));
  ASSIGN_OR_RETURN(json answer, parse_answer(body, "a range"));
  RangeResult result;
  ASSIGN_OR_RETURN(result.kvs, parse_kvs(answer, body));
  auto header = answer.find("header");
  if (header != answer.end() && header->is_object()) {
    auto revision = int_field(*header, "revision");
    if (!revision) {
      return bad_answer("a range", body);
    }
    result.revision = *revision;
  }
  return result;
}

Result<int64_t> EtcdClient::delete_key(std::string_view key, Deadline deadline) {
  ASSIGN_OR_RETURN(std::string body,
                   post("/v3/kv/deleterange", json{{"key", base64_encode(key)}}.dump(), deadline));
  ASSIGN_OR_RETURN(json answer, parse_answer(body, "a delete"));
  auto deleted = int_field(answer, "deleted");
  if (!deleted) {
    return bad_answer("a delete", body);
  }
  return *deleted;
}

}  // namespace crescent::bootstrap
