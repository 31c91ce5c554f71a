// preprocessor_config.json of Qwen2-VL / Qwen2.5-VL <-> ImageProcessorConfig.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "media/image_processor.h"

namespace crescent::media {
namespace {

using nlohmann::json;

Status field_error(std::string_view field, std::string_view what) {
  return invalid_argument("preprocessor_config.json: field '" + std::string(field) + "' " +
                          std::string(what));
}

const json* find_field(const json& j, std::string_view field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null())
    return nullptr;
  return &*it;
}

Result<std::optional<int64_t>> get_int(const json& j, std::string_view field, int64_t min_value) {
  const json* v = find_field(j, field);
  if (v == nullptr)
    return std::optional<int64_t>();
  int64_t value = 0;
  if (v->is_number_integer()) {
    value = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9.0e15) {
    value = static_cast<int64_t>(v->get<double>());  // 3136.0 is an int to Python
  } else {
    return field_error(field, "must be an integer");
  }
  if (value < min_value)
    return field_error(field, "must be at least " + std::to_string(min_value));
  return std::optional<int64_t>(value);
}

Status read_int(const json& j, std::string_view field, int* out) {
  ASSIGN_OR_RETURN(auto v, get_int(j, field, 1));
  if (!v)
    return Status::ok();
  if (*v > std::numeric_limits<int>::max() / 64)
    return field_error(field, "is out of range");
  *out = static_cast<int>(*v);
  return Status::ok();
}

Status read_bool(const json& j, std::string_view field, bool* out) {
  const json* v = find_field(j, field);
  if (v == nullptr)
    return Status::ok();
  if (!v->is_boolean())
    return field_error(field, "must be true or false");
  *out = v->get<bool>();
  return Status::ok();
}

// image_mean / image_std: a list of 3 numbers, or one number for every channel.
Status read_triple(const json& j, std::string_view field, std::array<float, 3>* out) {
  const json* v = find_field(j, field);
  if (v == nullptr)
    return Status::ok();
  if (v->is_number()) {
    out->fill(static_cast<float>(v->get<double>()));
    return Status::ok();
  }
  if (!v->is_array() || v->size() != 3)
    return field_error(field, "must be a list of 3 numbers");
  for (size_t i = 0; i < 3; ++i) {
    if (!(*v)[i].is_number())
      return field_error(field, "must be a list of 3 numbers");
    (*out)[i] = static_cast<float>((*v)[i].get<double>());
  }
  return Status::ok();
}

Result<ImageProcessorConfig> parse_object(const json& j) {
  if (!j.is_object())
    return invalid_argument("preprocessor_config.json: not a JSON object");
  ImageProcessorConfig c;
  RETURN_IF_ERROR(read_int(j, "patch_size", &c.patch_size));
  RETURN_IF_ERROR(read_int(j, "temporal_patch_size", &c.temporal_patch_size));
  RETURN_IF_ERROR(read_int(j, "merge_size", &c.merge_size));
  // Qwen2VLImageProcessor.__init__: size first, then min_pixels / max_pixels override it.
  if (const json* size = find_field(j, "size")) {
    if (!size->is_object() || !size->contains("shortest_edge") || !size->contains("longest_edge"))
      return field_error("size", "must contain 'shortest_edge' and 'longest_edge'");
    ASSIGN_OR_RETURN(auto shortest, get_int(*size, "shortest_edge", 1));
    ASSIGN_OR_RETURN(auto longest, get_int(*size, "longest_edge", 1));
    if (!shortest || !longest)
      return field_error("size", "must contain 'shortest_edge' and 'longest_edge'");
    c.min_pixels = *shortest;
    c.max_pixels = *longest;
  }
  ASSIGN_OR_RETURN(auto min_pixels, get_int(j, "min_pixels", 1));
  if (min_pixels)
    c.min_pixels = *min_pixels;
  ASSIGN_OR_RETURN(auto max_pixels, get_int(j, "max_pixels", 1));
  if (max_pixels)
    c.max_pixels = *max_pixels;
  if (c.min_pixels > c.max_pixels) {
    return field_error("min_pixels", "(" + std::to_string(c.min_pixels) +
                                         ") must not exceed max_pixels (" +
                                         std::to_string(c.max_pixels) + ")");
  }
  RETURN_IF_ERROR(read_triple(j, "image_mean", &c.image_mean));
  RETURN_IF_ERROR(read_triple(j, "image_std", &c.image_std));
  for (float s : c.image_std) {
    if (!(s != 0.0f) || !std::isfinite(s))
      return field_error("image_std", "must be finite and non-zero");
  }
  if (const json* v = find_field(j, "rescale_factor")) {
    if (!v->is_number() || !(v->get<double>() > 0.0))
      return field_error("rescale_factor", "must be a positive number");
    c.rescale_factor = v->get<double>();
  }
  RETURN_IF_ERROR(read_bool(j, "do_resize", &c.do_resize));
  RETURN_IF_ERROR(read_bool(j, "do_rescale", &c.do_rescale));
  RETURN_IF_ERROR(read_bool(j, "do_normalize", &c.do_normalize));
  ASSIGN_OR_RETURN(auto resample, get_int(j, "resample", 0));
  if (resample && *resample != 3)
    return field_error("resample", "must be 3 (BICUBIC), the only filter implemented");
  return c;
}

// The shortest decimal that reads back (as a Python float, then numpy float32) as `value`.
double shortest_float_decimal(float value) {
  for (int precision = 6; precision < 17; ++precision) {
    char text[40];
    std::snprintf(text, sizeof(text), "%.*g", precision, static_cast<double>(value));
    double parsed = std::strtod(text, nullptr);
    if (static_cast<float>(parsed) == value)
      return parsed;
  }
  return value;
}

json float_triple(const std::array<float, 3>& v) {
  return json::array(
      {shortest_float_decimal(v[0]), shortest_float_decimal(v[1]), shortest_float_decimal(v[2])});
}

}  // namespace

Result<ImageProcessorConfig> parse_preprocessor_config(std::string_view text) {
  try {
    return parse_object(json::parse(text));
  } catch (const json::exception& e) {
    return invalid_argument(std::string("preprocessor_config.json: ") + e.what());
  }
}

std::string to_preprocessor_config_json(const ImageProcessorConfig& c,
                                        std::string_view processor_class) {
  json j;
  j["image_processor_type"] = std::string(processor_class);
  j["do_resize"] = c.do_resize;
  j["do_rescale"] = c.do_rescale;
  j["do_normalize"] = c.do_normalize;
  j["do_convert_rgb"] = true;
  j["resample"] = 3;
  j["rescale_factor"] = c.rescale_factor;
  j["image_mean"] = float_triple(c.image_mean);
  j["image_std"] = float_triple(c.image_std);
  j["min_pixels"] = c.min_pixels;
  j["max_pixels"] = c.max_pixels;
  j["size"] = {{"shortest_edge", c.min_pixels}, {"longest_edge", c.max_pixels}};
  j["patch_size"] = c.patch_size;
  j["temporal_patch_size"] = c.temporal_patch_size;
  j["merge_size"] = c.merge_size;
  return j.dump(2) + "\n";
}

}  // namespace crescent::media
