#pragma once
// The ggml tensor types of GGUF files: type ids <-> DType, the general.file_type (llama.cpp's
// llama_ftype) of a file, and which type each tensor gets when crescent writes a GGUF, following
// llama-quantize's choices (llama_tensor_get_type) for the mixes users download (Q4_K_M, Q5_K_M).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace crescent::model {

// The DType crescent computes a ggml type id with (nullopt: unsupported, e.g. IQ2_XXS).
std::optional<DType> dtype_of_ggml(uint32_t ggml_type);
uint32_t ggml_type_of(DType dtype);

// What `make-model --gguf-type` asks for: one type for every 2-D tensor (the K-quants and the
// legacy quants still put output / tied token_embd in Q6_K as llama-quantize does), or a
// llama-quantize mix.
struct GgufWeightType {
  enum class Mix { kUniform, kKM };  // kKM: Q4_K_M / Q5_K_M
  DType dtype = DType::kBF16;        // the type of most 2-D tensors
  Mix mix = Mix::kUniform;

  GgufWeightType() = default;
  GgufWeightType(DType d) : dtype(d) {}  // NOLINT(google-explicit-constructor): a uniform type
  GgufWeightType(DType d, Mix m) : dtype(d), mix(m) {}
};

// "bf16", "f16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
// "q6_k", "q4_k_m", "q5_k_m".
Result<GgufWeightType> parse_gguf_weight_type(std::string_view text);
std::string gguf_weight_type_name(const GgufWeightType& type);

// general.file_type (llama_ftype) of a file written as `type`: F32 0, F16 1, Q4_0 2, Q4_1 3,
// Q8_0 7, Q5_0 8, Q5_1 9, Q2_K 10, Q3_K_S 11, Q4_K_S 14, Q4_K_M 15, Q5_K_S 16, Q5_K_M 17,
// Q6_K 18, BF16 32.
uint32_t gguf_file_type(const GgufWeightType& type);

// The type tensor `hf_name` (HF name, HF shape) is written as: 1-D tensors F32; output (or the
// tied token_embd) Q6_K for the quantised types other than Q8_0; for the _M mixes attn_v and
// ffn_down in Q6_K on llama.cpp's use_more_bits layers; a K-quant whose rows are not whole
// 256-value blocks falls back like llama-quantize (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
// Q2_K/Q3_K -> Q4_0 where llama.cpp would use IQ4_NL, which crescent does not have).
DType gguf_tensor_dtype(const GgufWeightType& type, const ModelConfig& config,
                        std::string_view hf_name, const std::vector<int64_t>& hf_shape);

}  // namespace crescent::model
