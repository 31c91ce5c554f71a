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

Result<ModelConfig> parse_config_object(const json& j) {
  if (!j.is_object())
    return invalid_argument("config.json: top level must be an object");
  ModelConfig c;
  auto arch_it = j.find("architectures");
  if (arch_it == j.end() || !arch_it->is_array() || arch_it->empty() ||
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
  } else {
    return unimplemented("config.json: architecture '" + c.architecture_name +
                         "' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, "
                         "Qwen3ForCausalLM are)");
  }
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
  ASSIGN_OR_RETURN(c.rope_theta, get_double(j, "rope_theta", 10000.0));
  ASSIGN_OR_RETURN(c.rope_scaling, parse_rope_scaling(j));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, get_bool(j, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(bool attention_bias, get_bool(j, "attention_bias", false));
  c.has_qkv_bias = c.architecture == Architecture::kQwen2 || attention_bias;
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

std::string to_config_json(const ModelConfig& c) {
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
