#include "model/vision_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace crescent::model {

using nlohmann::json;

std::string_view vision_architecture_name(VisionArchitecture arch) {
  switch (arch) {
    case VisionArchitecture::kQwen2Vl:
      return "qwen2_vl";
    case VisionArchitecture::kQwen25Vl:
      return "qwen2_5_vl";
  }
  return "?";
}

Status validate_vision_config(const VisionConfig& c) {
  auto bad = [](const std::string& what) { return invalid_argument("vision config: " + what); };
  const std::pair<const char*, int> sizes[] = {{"depth", c.depth},
                                               {"embed_dim", c.embed_dim},
                                               {"num_heads", c.num_heads},
                                               {"intermediate_size", c.intermediate_size},
                                               {"out_hidden_size", c.out_hidden_size},
                                               {"patch_size", c.patch_size},
                                               {"temporal_patch_size", c.temporal_patch_size},
                                               {"spatial_merge_size", c.spatial_merge_size},
                                               {"in_channels", c.in_channels}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0)
      return bad(std::string(name) + " must be positive, got " + std::to_string(value));
  }
  if (c.embed_dim % c.num_heads != 0) {
    return bad("embed_dim (" + std::to_string(c.embed_dim) + ") is not a multiple of num_heads (" +
               std::to_string(c.num_heads) + ")");
  }
  if (c.head_dim() % 4 != 0) {
    return bad("head_dim " + std::to_string(c.head_dim()) +
               " must be a multiple of 4 for the 2-D rotary embedding");
  }
  if (!(c.norm_eps > 0) || !std::isfinite(c.norm_eps))
    return bad("norm_eps must be positive");
  for (float s : c.image_std) {
    if (!(s > 0) || !std::isfinite(s))
      return bad("image_std must be positive");
  }
  switch (c.architecture) {
    case VisionArchitecture::kQwen2Vl:
      if (c.window_size != 0 || !c.fullatt_block_indexes.empty())
        return bad("window_size and fullatt_block_indexes are Qwen2.5-VL settings");
      break;
    case VisionArchitecture::kQwen25Vl:
      if (c.window_size < c.spatial_merge_size * c.patch_size) {
        return bad("window_size " + std::to_string(c.window_size) +
                   " is smaller than one merged unit (spatial_merge_size * patch_size = " +
                   std::to_string(c.spatial_merge_size * c.patch_size) + ")");
      }
      for (int index : c.fullatt_block_indexes) {
        if (index < 0 || index >= c.depth) {
          return bad("fullatt_block_indexes holds " + std::to_string(index) + ", outside [0, " +
                     std::to_string(c.depth) + ")");
        }
      }
      break;
  }
  return Status::ok();
}

namespace {

Status field_error(std::string_view field, std::string_view what) {
  return invalid_argument("config.json: field 'vision_config." + std::string(field) + "' " +
                          std::string(what));
}

// The first of `fields` present and not null, or nullptr.
const json* find_field(const json& j, std::initializer_list<const char*> fields,
                       const char** found_name) {
  for (const char* f : fields) {
    auto it = j.find(f);
    if (it != j.end() && !it->is_null()) {
      *found_name = f;
      return &*it;
    }
  }
  *found_name = *fields.begin();
  return nullptr;
}

// A positive int from the first present of `fields`, else `fallback` (missing if none).
Result<int> get_positive_int(const json& j, std::initializer_list<const char*> fields,
                             std::optional<int> fallback) {
  const char* name = nullptr;
  const json* v = find_field(j, fields, &name);
  if (v == nullptr) {
    if (fallback)
      return *fallback;
    return field_error(name, "is missing");
  }
  if (!v->is_number_integer())
    return field_error(name, "must be an integer");
  auto value = v->get<int64_t>();
  if (value <= 0 || value > std::numeric_limits<int>::max())
    return field_error(name, "must be a positive int, got " + v->dump());
  return static_cast<int>(value);
}

Status check_activation(const json& j, std::string_view expected) {
  auto it = j.find("hidden_act");
  if (it == j.end() || it->is_null())
    return Status::ok();
  if (!it->is_string())
    return field_error("hidden_act", "must be a string");
  if (it->get<std::string>() != expected) {
    return unimplemented("config.json: vision_config.hidden_act '" + it->get<std::string>() +
                         "' is not supported (only '" + std::string(expected) + "')");
  }
  return Status::ok();
}

// transformers' Qwen2VLVisionConfig: intermediate = int(embed_dim * mlp_ratio).
Result<int> parse_qwen2_vl_intermediate(const json& j, int embed_dim) {
  auto it = j.find("mlp_ratio");
  if (it == j.end() || it->is_null())
    return embed_dim * 4;
  if (!it->is_number())
    return field_error("mlp_ratio", "must be a number");
  double size = std::floor(static_cast<double>(embed_dim) * it->get<double>());
  if (!(size >= 1) || size > std::numeric_limits<int>::max())
    return field_error("mlp_ratio", "gives an MLP width out of range: " + it->dump());
  return static_cast<int>(size);
}

}  // namespace

Result<VisionConfig> parse_vision_config_json(const json& j, VisionArchitecture arch,
                                              int llm_hidden_size) {
  if (!j.is_object())
    return invalid_argument("config.json: field 'vision_config' must be an object");
  VisionConfig c;
  c.architecture = arch;
  ASSIGN_OR_RETURN(c.depth, get_positive_int(j, {"depth"}, std::nullopt));
  ASSIGN_OR_RETURN(c.num_heads, get_positive_int(j, {"num_heads"}, std::nullopt));
  // The hub files carry both patch_size and spatial_patch_size (equal); transformers reads
  // patch_size.
  ASSIGN_OR_RETURN(c.patch_size, get_positive_int(j, {"patch_size", "spatial_patch_size"}, 14));
  ASSIGN_OR_RETURN(c.temporal_patch_size, get_positive_int(j, {"temporal_patch_size"}, 2));
  ASSIGN_OR_RETURN(c.spatial_merge_size, get_positive_int(j, {"spatial_merge_size"}, 2));
  // The hub files say in_chans; transformers' config classes take in_channels.
  ASSIGN_OR_RETURN(c.in_channels, get_positive_int(j, {"in_channels", "in_chans"}, 3));
  switch (arch) {
    case VisionArchitecture::kQwen2Vl: {
      RETURN_IF_ERROR(check_activation(j, "quick_gelu"));
      ASSIGN_OR_RETURN(c.embed_dim, get_positive_int(j, {"embed_dim"}, std::nullopt));
      ASSIGN_OR_RETURN(c.intermediate_size, parse_qwen2_vl_intermediate(j, c.embed_dim));
      // Qwen2-VL's vision "hidden_size" is the merger's output, the LLM width.
      ASSIGN_OR_RETURN(c.out_hidden_size, get_positive_int(j, {"hidden_size"}, llm_hidden_size));
      break;
    }
    case VisionArchitecture::kQwen25Vl: {
      RETURN_IF_ERROR(check_activation(j, "silu"));
      ASSIGN_OR_RETURN(c.embed_dim, get_positive_int(j, {"hidden_size"}, std::nullopt));
      ASSIGN_OR_RETURN(c.intermediate_size,
                       get_positive_int(j, {"intermediate_size"}, std::nullopt));
      ASSIGN_OR_RETURN(c.out_hidden_size,
                       get_positive_int(j, {"out_hidden_size"}, llm_hidden_size));
      ASSIGN_OR_RETURN(c.window_size, get_positive_int(j, {"window_size"}, 112));
      auto it = j.find("fullatt_block_indexes");
      if (it == j.end() || it->is_null()) {
        c.fullatt_block_indexes = {7, 15, 23, 31};  // transformers' default
      } else {
        if (!it->is_array())
          return field_error("fullatt_block_indexes", "must be a list of integers");
        for (const json& e : *it) {
          if (!e.is_number_integer())
            return field_error("fullatt_block_indexes", "must be a list of integers");
          auto index = e.get<int64_t>();
          if (index < 0 || index >= c.depth) {
            return field_error("fullatt_block_indexes",
                               "holds " + e.dump() + ", outside [0, depth)");
          }
          c.fullatt_block_indexes.push_back(static_cast<int>(index));
        }
      }
      break;
    }
  }
  RETURN_IF_ERROR(validate_vision_config(c));
  return c;
}

json vision_config_to_json(const VisionConfig& c) {
  json j;
  j["model_type"] = std::string(vision_architecture_name(c.architecture));
  j["depth"] = c.depth;
  j["num_heads"] = c.num_heads;
  j["patch_size"] = c.patch_size;
  j["spatial_patch_size"] = c.patch_size;
  j["temporal_patch_size"] = c.temporal_patch_size;
  j["spatial_merge_size"] = c.spatial_merge_size;
  j["in_chans"] = c.in_channels;
  j["in_channels"] = c.in_channels;
  j["initializer_range"] = 0.02;
  switch (c.architecture) {
    case VisionArchitecture::kQwen2Vl:
      j["hidden_act"] = "quick_gelu";
      j["embed_dim"] = c.embed_dim;
      j["hidden_size"] = c.out_hidden_size;
      if (c.embed_dim > 0 && c.intermediate_size % c.embed_dim == 0) {
        j["mlp_ratio"] = c.intermediate_size / c.embed_dim;
      } else {
        // A ratio whose int(embed_dim * ratio) is exactly intermediate_size, as transformers
        // computes the MLP width.
        j["mlp_ratio"] = (c.intermediate_size + 0.5) / c.embed_dim;
      }
      break;
    case VisionArchitecture::kQwen25Vl:
      j["hidden_act"] = "silu";
      j["hidden_size"] = c.embed_dim;
      j["intermediate_size"] = c.intermediate_size;
      j["out_hidden_size"] = c.out_hidden_size;
      j["window_size"] = c.window_size;
      j["fullatt_block_indexes"] = c.fullatt_block_indexes;
      // Video M-RoPE time scale of every released Qwen2.5-VL checkpoint (crescent reads no
      // video; transformers' default would be 4).
      j["tokens_per_second"] = 2;
      break;
  }
  return j;
}

}  // namespace crescent::model
