// SegmentDescriptor <-> one line of JSON. Parsing never throws: nlohmann's exceptions are
// turned into Status here, at the module's edge.

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

Result<SegmentDescriptor> SegmentDescriptor::parse(std::string_view text) {
  if (text.size() > (1 << 20))
    return invalid_argument("segment descriptor too large");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("segment descriptor is not JSON");
  try {
    if (j.value("version", 0) != 1)
      return invalid_argument("unsupported segment descriptor version");
    SegmentDescriptor d;
    d.engine_name = j.at("engine_name").get<std::string>();
    ASSIGN_OR_RETURN(d.transport, parse_transport(j.at("transport").get<std::string>()));
    d.address = j.at("address").get<std::string>();
    d.transport_info_hex = j.value("transport_info", std::string());
    for (const auto& r : j.at("regions")) {
      d.regions.push_back({RegionId(r.at("id").get<int64_t>()), r.at("length").get<uint64_t>()});
    }
    return d;
  } catch (const nlohmann::json::exception& e) {
    return invalid_argument(std::string("bad segment descriptor: ") + e.what());
  }
}

}  // namespace crescent::transfer
