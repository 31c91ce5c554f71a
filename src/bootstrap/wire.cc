// JSON is parsed with nlohmann::json; its exceptions stop here and become Status.

#include "bootstrap/wire.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/json.h"

namespace crescent::bootstrap {
namespace {

using nlohmann::json;

Status check_engine_id(const std::string& id) {
  if (id.empty()) {
    return invalid_argument("field 'engine_id' must not be empty");
  }
  if (id.size() > kMaxEngineIdBytes) {
    return invalid_argument("field 'engine_id' is " + std::to_string(id.size()) +
                            " bytes, more than " + std::to_string(kMaxEngineIdBytes));
  }
  for (unsigned char c : id) {
    if (c < 0x20 || c == 0x7f) {
      return invalid_argument("field 'engine_id' contains a control character");
    }
  }
  return Status::ok();
}

// "0".."999999999" without sign or leading zeros (the keys crescent and vLLM write).
Result<int> parse_key(const std::string& key, const char* what) {
  bool ok = !key.empty() && key.size() <= 9 && (key == "0" || key[0] != '0');
  for (char c : key) {
    ok = ok && c >= '0' && c <= '9';
  }
  if (!ok) {
    return data_loss(std::string(what) + " key '" + key + "' is not a non-negative integer");
  }
  return std::stoi(key);
}

Result<QueryResult> parse_query(const json& root) {
  if (!root.is_object()) {
    return data_loss("the answer is not a JSON object");
  }
  QueryResult result;
  for (const auto& [dp_key, entry] : root.items()) {
    ASSIGN_OR_RETURN(int dp, parse_key(dp_key, "dp rank"));
    const std::string where = "dp rank " + dp_key;
    if (!entry.is_object()) {
      return data_loss(where + " is not an object");
    }
    auto id = entry.find("engine_id");
    if (id == entry.end() || !id->is_string()) {
      return data_loss(where + " has no string 'engine_id'");
    }
    auto workers = entry.find("worker_addr");
    if (workers == entry.end() || !workers->is_object()) {
      return data_loss(where + " has no object 'worker_addr'");
    }
    DpEntry& out = result[dp];
    out.engine_id = id->get<std::string>();
    if (auto epoch = entry.find("epoch"); epoch != entry.end()) {
      if (!epoch->is_number_unsigned()) {
        return data_loss(where + " has an 'epoch' that is not a non-negative integer");
      }
      out.epoch = epoch->get<uint64_t>();
    }
    for (const auto& [tp_key, by_pp] : workers->items()) {
      ASSIGN_OR_RETURN(int tp, parse_key(tp_key, "tp rank"));
      if (!by_pp.is_object()) {
        return data_loss(where + " tp rank " + tp_key + " is not an object");
      }
      for (const auto& [pp_key, addr] : by_pp.items()) {
        ASSIGN_OR_RETURN(int pp, parse_key(pp_key, "pp rank"));
        if (!addr.is_string()) {
          return data_loss(where + " tp " + tp_key + " pp " + pp_key + " is not a string");
        }
        out.worker_addr[tp][pp] = addr.get<std::string>();
      }
    }
  }
  return result;
}

}  // namespace

std::string registration_json(const WorkerRegistration& r) {
  json body = {{"engine_id", r.engine_id},
               {"dp_rank", r.dp_rank},
               {"tp_rank", r.tp_rank},
               {"pp_rank", r.pp_rank},
               {"addr", r.addr}};
  if (!r.role.empty()) {
    body["role"] = r.role;
  }
  if (r.lease_ttl_s > 0) {
    body["lease_ttl_s"] = r.lease_ttl_s;
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<WorkerRegistration> parse_registration_json(std::string_view body) {
  ASSIGN_OR_RETURN(json root, parse_json(body, "the body"));
  if (!root.is_object()) {
    return invalid_argument("the body must be a JSON object, got " + std::string(root.type_name()));
  }
  WorkerRegistration r;
  ASSIGN_OR_RETURN(r.engine_id, json_string_field(root, "engine_id", /*context=*/""));
  RETURN_IF_ERROR(check_engine_id(r.engine_id));
  if (root.contains("role")) {
    ASSIGN_OR_RETURN(r.role, json_string_field(root, "role", /*context=*/""));
    if (r.role != kEncodeRole) {
      return invalid_argument(
          "field 'role' must be \"encode\" (or absent for a dp rank's "
          "worker), got \"" +
          r.role.substr(0, 64) + "\"");
    }
  }
  const bool is_encoder = r.role == kEncodeRole;
  // An encoder has no ranks; when it sends them they are checked all the same.
  const auto read_rank = [&](const char* name, int max_value, int* rank) -> Status {
    if (is_encoder && !root.contains(name)) {
      return Status::ok();
    }
    ASSIGN_OR_RETURN(uint64_t value, json_unsigned_field(root, name, /*context=*/"",
                                                         static_cast<uint64_t>(max_value)));
    *rank = static_cast<int>(value);
    return Status::ok();
  };
  RETURN_IF_ERROR(read_rank("dp_rank", kMaxDpRanks - 1, &r.dp_rank));
  RETURN_IF_ERROR(read_rank("tp_rank", kMaxTpPpRank, &r.tp_rank));
  RETURN_IF_ERROR(read_rank("pp_rank", kMaxTpPpRank, &r.pp_rank));
  if (auto ttl = root.find("lease_ttl_s"); ttl != root.end()) {
    if (!ttl->is_number() || !(ttl->get<double>() > 0) || ttl->get<double>() > kMaxLeaseTtlS) {
      return invalid_argument("field 'lease_ttl_s' must be a number of seconds in (0, " +
                              std::to_string(static_cast<int>(kMaxLeaseTtlS)) + "], got " +
                              ttl->dump());
    }
    r.lease_ttl_s = ttl->get<double>();
  }
  ASSIGN_OR_RETURN(r.addr, json_string_field(root, "addr", /*context=*/""));
  auto addr = parse_tcp_addr(r.addr);
  if (!addr.is_ok()) {
    return invalid_argument("field 'addr': " + addr.status().message());
  }
  // Peers connect to this address: a wildcard listen address reaches nobody.
  if (addr->first == "0.0.0.0" || addr->first == "::") {
    return invalid_argument("field 'addr': " + r.addr +
                            " is a wildcard address; register one peers can connect to");
  }
  return r;
}

std::string query_json(const QueryResult& result) {
  json root = json::object();
  for (const auto& [dp, entry] : result) {
    json workers = json::object();
    for (const auto& [tp, by_pp] : entry.worker_addr) {
      json pps = json::object();
      for (const auto& [pp, addr] : by_pp) {
        pps[std::to_string(pp)] = addr;
      }
      workers[std::to_string(tp)] = std::move(pps);
    }
    json out = {{"engine_id", entry.engine_id}, {"worker_addr", workers}};
    if (entry.epoch > 0) {
      out["epoch"] = entry.epoch;
    }
    root[std::to_string(dp)] = std::move(out);
  }
  return root.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<QueryResult> parse_query_json(std::string_view body) {
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    return data_loss("the /query answer is not valid JSON");
  }
  try {
    auto parsed = parse_query(root);
    if (!parsed.is_ok()) {
      return parsed.status().with_context("bad /query answer");
    }
    return parsed;
  } catch (const json::exception& e) {
    return data_loss(std::string("bad /query answer: ") + e.what());
  }
}

std::string registered_json(const Registered& registered) {
  json body = {{"status", "ok"}, {"epoch", registered.epoch}};
  if (registered.lease_ttl_s > 0) {
    body["lease_ttl_s"] = registered.lease_ttl_s;
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

Registered parse_registered_json(std::string_view body) {
  Registered registered;
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) {
    return registered;
  }
  if (auto epoch = root.find("epoch"); epoch != root.end() && epoch->is_number_unsigned()) {
    registered.epoch = epoch->get<uint64_t>();
  }
  if (auto ttl = root.find("lease_ttl_s"); ttl != root.end() && ttl->is_number()) {
    registered.lease_ttl_s = std::max(0.0, ttl->get<double>());
  }
  return registered;
}

std::string encoders_json(const EncoderTable& encoders) {
  json root = json::object();
  for (const auto& [engine_id, addr] : encoders) {
    root[engine_id] = json{{"role", kEncodeRole}, {"worker_addr", addr}};
  }
  return root.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<EncoderTable> parse_encoders_json(std::string_view body) {
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    return data_loss("bad /query?role=encode answer: not a JSON object");
  }
  EncoderTable table;
  for (const auto& [engine_id, entry] : root.items()) {
    if (!entry.is_object()) {
      return data_loss("bad /query?role=encode answer: encoder '" + engine_id +
                       "' is not an object");
    }
    auto addr = entry.find("worker_addr");
    if (addr == entry.end() || !addr->is_string()) {
      return data_loss("bad /query?role=encode answer: encoder '" + engine_id +
                       "' has no string 'worker_addr'");
    }
    table[engine_id] = addr->get<std::string>();
  }
  return table;
}

std::string error_json(std::string_view message, std::string_view type, std::string_view code) {
  return json{{"error", {{"message", message}, {"type", type}, {"code", code}}}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

ErrorBody parse_error_json(std::string_view body) {
  json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_object()) {
    auto error = root.find("error");
    if (error != root.end() && error->is_object()) {
      auto message = error->find("message");
      auto code = error->find("code");
      if (message != error->end() && message->is_string()) {
        return {message->get<std::string>(),
                code != error->end() && code->is_string() ? code->get<std::string>() : ""};
      }
    }
  }
  return {std::string(body.substr(0, 512)), ""};
}

}  // namespace crescent::bootstrap
