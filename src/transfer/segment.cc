// SegmentDescriptor <-> one line of JSON. Parsing never throws: every field's JSON type is
// checked before it is read, and a wrong one is a Status.

#include <nlohmann/json.hpp>

#include "transfer/transfer_engine.h"

namespace crescent::transfer {

std::string SegmentDescriptor::serialize() const {
  nlohmann::json j;
  j["version"] = 1;
  j["engine_name"] = engine_name;
  j["transport"] = std::string(transport_name(transport));
  j["address"] = address;
  j["transport_info"] = transport_info_hex;
  nlohmann::json regions_json = nlohmann::json::array();
  for (const RegionInfo& r : regions) {
    regions_json.push_back({{"id", r.id.value()}, {"length", r.length}});
  }
  j["regions"] = std::move(regions_json);
  return j.dump();
}

namespace {

using nlohmann::json;

// Each field is checked for its JSON type before it is read: nlohmann's get<int64_t>() of a
// float such as 1e300 is a float-to-integer conversion out of range (undefined behaviour, found
// by control_frame_fuzz), not an exception.
Result<std::string> string_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end())
    return invalid_argument(std::string("segment descriptor has no '") + name + "'");
  if (!it->is_string())
    return invalid_argument(std::string("segment descriptor field '") + name +
                            "' must be a string");
  return it->get<std::string>();
}

Result<uint64_t> unsigned_field(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end())
    return invalid_argument(std::string("segment descriptor region has no '") + name + "'");
  if (!it->is_number_unsigned())
    return invalid_argument(std::string("segment descriptor region field '") + name +
                            "' must be a non-negative integer");
  return it->get<uint64_t>();
}

}  // namespace

Result<SegmentDescriptor> SegmentDescriptor::parse(std::string_view text) {
  if (text.size() > (1 << 20))
    return invalid_argument("segment descriptor too large");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("segment descriptor is not JSON");
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_unsigned() || version->get<uint64_t>() != 1)
    return invalid_argument("unsupported segment descriptor version");
  SegmentDescriptor d;
  ASSIGN_OR_RETURN(d.engine_name, string_field(j, "engine_name"));
  ASSIGN_OR_RETURN(std::string transport, string_field(j, "transport"));
  ASSIGN_OR_RETURN(d.transport, parse_transport(transport));
  ASSIGN_OR_RETURN(d.address, string_field(j, "address"));
  if (j.contains("transport_info")) {
    ASSIGN_OR_RETURN(d.transport_info_hex, string_field(j, "transport_info"));
  }
  auto regions = j.find("regions");
  if (regions == j.end() || !regions->is_array())
    return invalid_argument("segment descriptor has no array 'regions'");
  for (const json& r : *regions) {
    if (!r.is_object())
      return invalid_argument("segment descriptor region is not an object");
    ASSIGN_OR_RETURN(uint64_t id, unsigned_field(r, "id"));
    if (id > static_cast<uint64_t>(INT64_MAX))
      return invalid_argument("segment descriptor region id out of range");
    ASSIGN_OR_RETURN(uint64_t length, unsigned_field(r, "length"));
    d.regions.push_back({RegionId(static_cast<int64_t>(id)), length});
  }
  return d;
}

}  // namespace crescent::transfer
