#include "model/gguf_types.h"

#include <string>

#include "model/gguf.h"

namespace crescent::model {
namespace {

struct TypeEntry {
  uint32_t ggml_type;
  DType dtype;
  const char* flag;
};
constexpr TypeEntry kTypes[] = {
    {0, DType::kF32, "f32"},    {1, DType::kF16, "f16"},        {30, DType::kBF16, "bf16"},
    {8, DType::kQ8_0, "q8_0"},  {2, DType::kQ4_0, "q4_0"},      {3, DType::kQ4_1, "q4_1"},
    {6, DType::kQ5_0, "q5_0"},  {7, DType::kQ5_1, "q5_1"},      {10, DType::kQ2_K, "q2_k"},
    {11, DType::kQ3_K, "q3_k"}, {12, DType::kQ4_K, "q4_k"},     {13, DType::kQ5_K, "q5_k"},
    {14, DType::kQ6_K, "q6_k"}, {20, DType::kIQ4_NL, "iq4_nl"},
};

// llama.cpp's use_more_bits(i_layer, n_layers): the first and last eighth and every third layer
// in between get more bits in the _M mixes.
bool use_more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The layer index of "model.layers.N.…", or -1.
int64_t layer_index(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.substr(0, kPrefix.size()) != kPrefix)
    return -1;
  name.remove_prefix(kPrefix.size());
  int64_t n = 0;
  size_t i = 0;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i)
    n = n * 10 + (name[i] - '0');
  return i == 0 ? -1 : n;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

std::optional<DType> dtype_of_ggml(uint32_t ggml_type) {
  for (const TypeEntry& e : kTypes) {
    if (e.ggml_type == ggml_type)
      return e.dtype;
  }
  return std::nullopt;
}

uint32_t ggml_type_of(DType dtype) {
  for (const TypeEntry& e : kTypes) {
    if (e.dtype == dtype)
      return e.ggml_type;
  }
  return 0;
}

Result<GgufWeightType> parse_gguf_weight_type(std::string_view text) {
  if (text == "q4_k_m")
    return GgufWeightType(DType::kQ4_K, GgufWeightType::Mix::kKM);
  if (text == "q5_k_m")
    return GgufWeightType(DType::kQ5_K, GgufWeightType::Mix::kKM);
  std::string all;
  for (const TypeEntry& e : kTypes) {
    if (text == e.flag)
      return GgufWeightType(e.dtype);
    all += std::string(e.flag) + ", ";
  }
  return invalid_argument("unknown GGUF type '" + std::string(text) + "' (" + all +
                          "q4_k_m, q5_k_m)");
}

std::string gguf_weight_type_name(const GgufWeightType& type) {
  for (const TypeEntry& e : kTypes) {
    if (e.dtype == type.dtype)
      return std::string(e.flag) + (type.mix == GgufWeightType::Mix::kKM ? "_m" : "");
  }
  return "?";
}

uint32_t gguf_file_type(const GgufWeightType& type) {
  const bool km = type.mix == GgufWeightType::Mix::kKM;
  switch (type.dtype) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 32;
    case DType::kQ8_0:
      return 7;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ5_0:
      return 8;
    case DType::kQ5_1:
      return 9;
    case DType::kQ2_K:
      return 10;
    case DType::kQ3_K:
      return 11;
    case DType::kQ4_K:
      return km ? 15 : 14;
    case DType::kQ5_K:
      return km ? 17 : 16;
    case DType::kQ6_K:
      return 18;
    case DType::kIQ4_NL:
      return 25;
  }
  return 0;
}

DType gguf_tensor_dtype(const GgufWeightType& type, const ModelConfig& config,
                        std::string_view hf_name, const std::vector<int64_t>& hf_shape) {
  if (hf_shape.size() != 2)
    return DType::kF32;
  DType out = type.dtype;
  if (!is_block_quantized(out))
    return out;
  const bool is_output = hf_name == "lm_head.weight" ||
                         (config.tie_word_embeddings && hf_name == "model.embed_tokens.weight");
  if (is_output && out != DType::kQ8_0) {
    out = DType::kQ6_K;
  } else if (out == DType::kIQ4_NL) {
    // llama-quantize's IQ4_NL file type without an importance matrix: attn_v in Q5_K when 4+
    // query heads share a KV head, ffn_down of the first eighth of the layers in Q5_K.
    const int64_t layer = layer_index(hf_name);
    const bool v_proj = ends_with(hf_name, ".self_attn.v_proj.weight") &&
                        config.num_key_value_heads > 0 &&
                        config.num_attention_heads / config.num_key_value_heads >= 4;
    const bool early_down = ends_with(hf_name, ".mlp.down_proj.weight") && layer >= 0 &&
                            layer < config.num_hidden_layers / 8;
    if (v_proj || early_down)
      out = DType::kQ5_K;
  } else if (type.mix == GgufWeightType::Mix::kKM) {
    const int64_t layer = layer_index(hf_name);
    if (layer >= 0 &&
        (ends_with(hf_name, ".self_attn.v_proj.weight") ||
         ends_with(hf_name, ".mlp.down_proj.weight")) &&
        use_more_bits(layer, config.num_hidden_layers)) {
      out = DType::kQ6_K;
    }
  }
  const int64_t cols = hf_shape[1];
  if (cols % dtype_block_size(out) != 0) {
    switch (out) {
      case DType::kQ4_K:
        out = DType::kQ5_0;
        break;
      case DType::kQ5_K:
        out = DType::kQ5_1;
        break;
      case DType::kQ6_K:
        out = DType::kQ8_0;
        break;
      case DType::kQ2_K:
      case DType::kQ3_K:
        out = DType::kIQ4_NL;
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace crescent::model
