#include "model/config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace crescent::model {

using nlohmann::json;

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kQwen2Vl:
      return "Qwen2VLForConditionalGeneration";
    case Architecture::kQwen25Vl:
      return "Qwen2_5_VLForConditionalGeneration";
  }
  return "?";
}

std::string_view architecture_model_type(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kQwen2Vl:
      return "qwen2_vl";
    case Architecture::kQwen25Vl:
      return "qwen2_5_vl";
  }
  return "?";
}

namespace {

Status field_error(std::string_view field, std::string_view what) {
  return invalid_argument("config.json: field '" + std::string(field) + "' " + std::string(what));
}

Result<int> get_int(const json& j, std::string_view field, std::optional<int> fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback)
      return *fallback;
    return field_error(field, "is missing");
  }
  if (!it->is_number_integer())
    return field_error(field, "must be an integer");
  auto v = it->get<int64_t>();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return field_error(field, "is out of range");
  }
  return static_cast<int>(v);
}

Result<int> get_positive_int(const json& j, std::string_view field, std::optional<int> fallback) {
  ASSIGN_OR_RETURN(int v, get_int(j, field, fallback));
  if (v <= 0)
    return field_error(field, "must be positive, got " + std::to_string(v));
  return v;
}

Result<double> get_double(const json& j, std::string_view field, std::optional<double> fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback)
      return *fallback;
    return field_error(field, "is missing");
  }
  if (!it->is_number())
    return field_error(field, "must be a number");
  return it->get<double>();
}

Result<bool> get_bool(const json& j, std::string_view field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null())
    return fallback;
  if (!it->is_boolean())
    return field_error(field, "must be true or false");
  return it->get<bool>();
}

Result<RopeScaling> parse_rope_scaling(const json& j) {
  RopeScaling rs;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null())
    return rs;
  if (!it->is_object())
    return field_error("rope_scaling", "must be an object or null");
  const json& r = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = r.find(key);
    if (t != r.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type.empty())
    return field_error("rope_scaling.rope_type", "is missing");
  if (type == "default")
    return rs;
  if (type != "llama3") {
    return unimplemented("config.json: rope_scaling type '" + type +
                         "' is not supported (only 'llama3')");
  }
  rs.is_llama3 = true;
  ASSIGN_OR_RETURN(rs.factor, get_double(r, "factor", std::nullopt));
  ASSIGN_OR_RETURN(rs.low_freq_factor, get_double(r, "low_freq_factor", 1.0));
  ASSIGN_OR_RETURN(rs.high_freq_factor, get_double(r, "high_freq_factor", 4.0));
  ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                   get_positive_int(r, "original_max_position_embeddings", 8192));
  if (!(rs.factor > 0) || !(rs.low_freq_factor > 0) ||
      !(rs.high_freq_factor > rs.low_freq_factor)) {
    return field_error("rope_scaling",
                       "needs factor > 0 and high_freq_factor > low_freq_factor > 0");
  }
  return rs;
}

bool is_vision_language(Architecture arch) {
  return arch == Architecture::kQwen2Vl || arch == Architecture::kQwen25Vl;
}

// The hub's Qwen2-VL / Qwen2.5-VL checkpoints keep the language model's fields at the top
// level; newer transformers nest them under "text_config" (and some versions write both).
// Top-level values win; a top-level null does not hide a nested value.
Result<json> language_model_fields(const json& j) {
  auto it = j.find("text_config");
  if (it == j.end() || it->is_null())
    return j;
  if (!it->is_object())
    return field_error("text_config", "must be an object");
  json merged = *it;
  for (const auto& [key, value] : j.items()) {
    if (key == "text_config" || key == "vision_config")
      continue;
    if (value.is_null() && merged.contains(key))
      continue;
    merged[key] = value;
  }
  return merged;
}

// M-RoPE: rope_scaling {"type": "mrope", "mrope_section": [...]} in the hub files,
// {"rope_type": "default", "mrope_section": [...]} in newer ones, or transformers v5's
// rope_parameters. The sum is checked against head_dim by validate_model_config().
Result<std::vector<int>> parse_mrope_section(const json& j) {
  std::string_view field = "rope_scaling";
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    field = "rope_parameters";
    it = j.find(field);
  }
  if (it == j.end() || it->is_null())
    return field_error("rope_scaling.mrope_section", "is missing");
  if (!it->is_object())
    return field_error(field, "must be an object");
  const json& r = *it;
  for (const char* key : {"rope_type", "type"}) {
    auto t = r.find(key);
    if (t != r.end() && t->is_string() && t->get<std::string>() != "mrope" &&
        t->get<std::string>() != "default") {
      return unimplemented("config.json: " + std::string(field) + " type '" +
                           t->get<std::string>() + "' is not supported with M-RoPE");
    }
  }
  const std::string section_field = std::string(field) + ".mrope_section";
  auto s = r.find("mrope_section");
  if (s == r.end() || s->is_null())
    return field_error(section_field, "is missing");
  if (!s->is_array() || s->size() != 3)
    return field_error(section_field, "must be a list of 3 integers");
  std::vector<int> section;
  for (const json& e : *s) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > (1 << 20))
      return field_error(section_field, "must hold non-negative integers, got " + e.dump());
    section.push_back(e.get<int>());
  }
  return section;
}

Result<ModelConfig> parse_config_object(const json& top) {
  if (!top.is_object())
    return invalid_argument("config.json: top level must be an object");
  ModelConfig c;
  auto arch_it = top.find("architectures");
  if (arch_it == top.end() || !arch_it->is_array() || arch_it->empty() ||
      !(*arch_it)[0].is_string()) {
    return field_error("architectures", "must be a non-empty list of strings");
  }
  c.architecture_name = (*arch_it)[0].get<std::string>();
  if (c.architecture_name == "LlamaForCausalLM") {
    c.architecture = Architecture::kLlama;
  } else if (c.architecture_name == "Qwen2ForCausalLM") {
    c.architecture = Architecture::kQwen2;
  } else if (c.architecture_name == "Qwen3ForCausalLM") {
    c.architecture = Architecture::kQwen3;
  } else if (c.architecture_name == "Qwen2VLForConditionalGeneration") {
    c.architecture = Architecture::kQwen2Vl;
  } else if (c.architecture_name == "Qwen2_5_VLForConditionalGeneration") {
    c.architecture = Architecture::kQwen25Vl;
  } else {
    return unimplemented("config.json: architecture '" + c.architecture_name +
                         "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                         "Qwen3ForCausalLM, Qwen2VLForConditionalGeneration, "
                         "Qwen2_5_VLForConditionalGeneration are)");
  }
  const bool is_vl = is_vision_language(c.architecture);
  // The language model's fields come from `j`: the top level, or its merge with text_config.
  json merged;
  if (is_vl) {
    ASSIGN_OR_RETURN(merged, language_model_fields(top));
  }
  const json& j = is_vl ? merged : top;
  ASSIGN_OR_RETURN(c.vocab_size, get_positive_int(j, "vocab_size", std::nullopt));
  ASSIGN_OR_RETURN(c.hidden_size, get_positive_int(j, "hidden_size", std::nullopt));
  ASSIGN_OR_RETURN(c.intermediate_size, get_positive_int(j, "intermediate_size", std::nullopt));
  ASSIGN_OR_RETURN(c.num_hidden_layers, get_positive_int(j, "num_hidden_layers", std::nullopt));
  ASSIGN_OR_RETURN(c.num_attention_heads, get_positive_int(j, "num_attention_heads", std::nullopt));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   get_positive_int(j, "num_key_value_heads", c.num_attention_heads));
  if (c.hidden_size % c.num_attention_heads != 0 && !j.contains("head_dim")) {
    return field_error("head_dim", "is missing and hidden_size is not a multiple of heads");
  }
  ASSIGN_OR_RETURN(c.head_dim,
                   get_positive_int(j, "head_dim", c.hidden_size / c.num_attention_heads));
  ASSIGN_OR_RETURN(c.rms_norm_eps, get_double(j, "rms_norm_eps", 1e-6));
  if (is_vl) {
    // transformers' Qwen2-VL default; v5 moves the value into rope_parameters.
    double theta = 1000000.0;
    if (auto p = j.find("rope_parameters"); p != j.end() && p->is_object()) {
      ASSIGN_OR_RETURN(theta, get_double(*p, "rope_theta", theta));
    }
    ASSIGN_OR_RETURN(c.rope_theta, get_double(j, "rope_theta", theta));
    ASSIGN_OR_RETURN(c.mrope_section, parse_mrope_section(j));
  } else {
    ASSIGN_OR_RETURN(c.rope_theta, get_double(j, "rope_theta", 10000.0));
    ASSIGN_OR_RETURN(c.rope_scaling, parse_rope_scaling(j));
  }
  ASSIGN_OR_RETURN(c.tie_word_embeddings, get_bool(j, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(bool attention_bias, get_bool(j, "attention_bias", false));
  // The Qwen2-VL / Qwen2.5-VL language model is Qwen2's.
  c.has_qkv_bias = c.architecture == Architecture::kQwen2 || is_vl || attention_bias;
  c.has_qk_norm = c.architecture == Architecture::kQwen3;
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   get_positive_int(j, "max_position_embeddings", std::nullopt));
  if (auto it = j.find("bos_token_id"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(int bos, get_int(j, "bos_token_id", std::nullopt));
    c.bos_token_id = bos;
  }
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer()) {
      c.eos_token_ids.push_back(it->get<int>());
    } else if (it->is_array()) {
      for (const auto& e : *it) {
        if (!e.is_number_integer())
          return field_error("eos_token_id", "must hold integers");
        c.eos_token_ids.push_back(e.get<int>());
      }
    } else {
      return field_error("eos_token_id", "must be an integer or a list of integers");
    }
  }
  if (auto it = j.find("torch_dtype"); it != j.end() && !it->is_null()) {
    if (!it->is_string())
      return field_error("torch_dtype", "must be a string");
    c.torch_dtype = it->get<std::string>();
  }
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string())
      return field_error("hidden_act", "must be a string");
    if (it->get<std::string>() != "silu") {
      return unimplemented("config.json: hidden_act '" + it->get<std::string>() +
                           "' is not supported (only 'silu')");
    }
  }
  ASSIGN_OR_RETURN(bool sliding, get_bool(j, "use_sliding_window", false));
  if (sliding)
    return unimplemented("config.json: use_sliding_window=true is not supported");
  if (is_vl) {
    ASSIGN_OR_RETURN(c.image_token_id, get_int(j, "image_token_id", 151655));
    ASSIGN_OR_RETURN(c.vision_start_token_id, get_int(j, "vision_start_token_id", 151652));
    ASSIGN_OR_RETURN(c.vision_end_token_id, get_int(j, "vision_end_token_id", 151653));
    // Absent only where the tower comes from elsewhere (an mmproj file).
    if (auto v = top.find("vision_config"); v != top.end() && !v->is_null()) {
      const VisionArchitecture arch = c.architecture == Architecture::kQwen2Vl
                                          ? VisionArchitecture::kQwen2Vl
                                          : VisionArchitecture::kQwen25Vl;
      ASSIGN_OR_RETURN(c.vision, parse_vision_config_json(*v, arch, c.hidden_size));
    }
  }
  RETURN_IF_ERROR(validate_model_config(c));
  return c;
}

}  // namespace

Status validate_model_config(const ModelConfig& c) {
  auto bad = [](const std::string& what) { return invalid_argument("model config: " + what); };
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 ||
      c.num_hidden_layers <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 ||
      c.head_dim <= 0 || c.max_position_embeddings <= 0) {
    return bad("sizes must be positive");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(c.num_attention_heads) +
               ") is not a multiple of num_key_value_heads (" +
               std::to_string(c.num_key_value_heads) + ")");
  }
  if (c.head_dim % 2 != 0)
    return bad("head_dim must be even for RoPE");
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return bad("rms_norm_eps must be positive");
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    return bad("rope_theta must be > 0");
  for (int id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size)
      return bad("eos_token_id " + std::to_string(id) + " is outside the vocabulary");
  }
  if (c.bos_token_id && (*c.bos_token_id < 0 || *c.bos_token_id >= c.vocab_size)) {
    return bad("bos_token_id is outside the vocabulary");
  }
  if (!is_vision_language(c.architecture)) {
    if (!c.mrope_section.empty() || c.vision)
      return bad(std::string(architecture_name(c.architecture)) + " has no M-RoPE or vision tower");
    return Status::ok();
  }
  if (!c.has_qkv_bias || c.has_qk_norm || c.rope_scaling.is_llama3) {
    return bad(std::string(architecture_name(c.architecture)) +
               "'s language model is Qwen2's: QKV bias, no q/k norm, no llama3 RoPE scaling");
  }
  if (c.mrope_section.size() != 3)
    return bad("a vision-language model needs 3 mrope_section entries (temporal, height, width)");
  int sum = 0;
  for (int s : c.mrope_section) {
    if (s < 0)
      return bad("mrope_section entries must be non-negative");
    sum += s;
  }
  if (sum != c.head_dim / 2) {
    return bad("mrope_section sums to " + std::to_string(sum) +
               ", expected head_dim / 2 = " + std::to_string(c.head_dim / 2));
  }
  // transformers' Qwen2-VL attention derives head_dim from the width.
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    return bad("head_dim (" + std::to_string(c.head_dim) + ") must be hidden_size / " +
               "num_attention_heads for " + std::string(architecture_name(c.architecture)));
  }
  const std::pair<const char*, int> ids[] = {{"image_token_id", c.image_token_id},
                                             {"vision_start_token_id", c.vision_start_token_id},
                                             {"vision_end_token_id", c.vision_end_token_id}};
  for (const auto& [name, id] : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return bad(std::string(name) + " " + std::to_string(id) + " is outside the vocabulary of " +
                 std::to_string(c.vocab_size));
    }
  }
  if (c.vision) {
    RETURN_IF_ERROR(validate_vision_config(*c.vision));
    const VisionArchitecture expected = c.architecture == Architecture::kQwen2Vl
                                            ? VisionArchitecture::kQwen2Vl
                                            : VisionArchitecture::kQwen25Vl;
    if (c.vision->architecture != expected) {
      return bad("the vision tower is " +
                 std::string(vision_architecture_name(c.vision->architecture)) + "'s, not " +
                 std::string(vision_architecture_name(expected)) + "'s");
    }
    if (c.vision->out_hidden_size != c.hidden_size) {
      return bad("the vision merger's output width " + std::to_string(c.vision->out_hidden_size) +
                 " differs from hidden_size " + std::to_string(c.hidden_size));
    }
  }
  return Status::ok();
}

Result<ModelConfig> parse_model_config(std::string_view config_json) {
  json j;
  try {
    j = json::parse(config_json);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("config.json is not valid JSON: ") + e.what());
  }
  try {
    return parse_config_object(j);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("config.json: ") + e.what());
  }
}

namespace {

// The hub layout of Qwen/Qwen2-VL-2B-Instruct and Qwen/Qwen2.5-VL-3B-Instruct: the language
// model's fields at the top level, M-RoPE in rope_scaling, the tower in "vision_config".
// bos_token_id (null when absent) and eos_token_id (an int when there is one, else a list),
// as Hugging Face writes them.
void write_special_token_ids(const ModelConfig& c, json& j) {
  if (c.bos_token_id) {
    j["bos_token_id"] = *c.bos_token_id;
  } else {
    j["bos_token_id"] = nullptr;
  }
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
}

std::string to_vision_language_config_json(const ModelConfig& c) {
  json j;
  j["architectures"] = json::array({std::string(architecture_name(c.architecture))});
  j["model_type"] = std::string(architecture_model_type(c.architecture));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", c.mrope_section}};
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["use_sliding_window"] = false;
  j["sliding_window"] = c.max_position_embeddings;
  j["max_window_layers"] = c.num_hidden_layers;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["max_position_embeddings"] = c.max_position_embeddings;
  write_special_token_ids(c, j);
  j["image_token_id"] = c.image_token_id;
  j["vision_start_token_id"] = c.vision_start_token_id;
  j["vision_end_token_id"] = c.vision_end_token_id;
  if (c.vision)
    j["vision_config"] = vision_config_to_json(*c.vision);
  if (!c.torch_dtype.empty())
    j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace

std::string to_config_json(const ModelConfig& c) {
  if (is_vision_language(c.architecture))
    return to_vision_language_config_json(c);
  json j;
  j["architectures"] = json::array({std::string(architecture_name(c.architecture))});
  j["model_type"] = std::string(architecture_model_type(c.architecture));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.is_llama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.architecture != Architecture::kQwen2)
    j["attention_bias"] = c.has_qkv_bias;
  if (c.architecture == Architecture::kQwen2) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = c.max_position_embeddings;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["max_position_embeddings"] = c.max_position_embeddings;
  write_special_token_ids(c, j);
  if (!c.torch_dtype.empty())
    j["torch_dtype"] = c.torch_dtype;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

std::string to_generation_config_json(const ModelConfig& c) {
  json j;
  if (c.bos_token_id)
    j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  j["do_sample"] = false;
  return j.dump(2) + "\n";
}

}  // namespace crescent::model
