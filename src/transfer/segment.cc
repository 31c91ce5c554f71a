// SegmentDescriptor <-> one line of JSON. Parsing never throws: every field's JSON type is
// checked before it is read, and a wrong one is a Status.

#include <nlohmann/json.hpp>

#include "core/json.h"
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

Result<SegmentDescriptor> SegmentDescriptor::parse(std::string_view text) {
  using nlohmann::json;
  constexpr std::string_view kContext = "segment descriptor";
  if (text.size() > (1 << 20))
    return invalid_argument("segment descriptor too large");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("segment descriptor is not JSON");
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_unsigned() || version->get<uint64_t>() != 1)
    return invalid_argument("unsupported segment descriptor version");
  SegmentDescriptor d;
  ASSIGN_OR_RETURN(d.engine_name, json_string_field(j, "engine_name", kContext));
  ASSIGN_OR_RETURN(std::string transport, json_string_field(j, "transport", kContext));
  ASSIGN_OR_RETURN(d.transport, parse_transport(transport));
  ASSIGN_OR_RETURN(d.address, json_string_field(j, "address", kContext));
  if (j.contains("transport_info")) {
    ASSIGN_OR_RETURN(d.transport_info_hex, json_string_field(j, "transport_info", kContext));
  }
  auto regions = j.find("regions");
  if (regions == j.end() || !regions->is_array())
    return invalid_argument("segment descriptor has no array 'regions'");
  for (size_t i = 0; i < regions->size(); ++i) {
    const json& r = (*regions)[i];
    if (!r.is_object())
      return invalid_argument("segment descriptor region is not an object");
    const std::string where = std::string(kContext) + " regions[" + std::to_string(i) + "]";
    ASSIGN_OR_RETURN(uint64_t id,
                     json_unsigned_field(r, "id", where, static_cast<uint64_t>(INT64_MAX)));
    ASSIGN_OR_RETURN(uint64_t length, json_unsigned_field(r, "length", where));
    d.regions.push_back({RegionId(static_cast<int64_t>(id)), length});
  }
  return d;
}

}  // namespace crescent::transfer
