#pragma once
// Element types of weights and tensors as they appear in model files, and exact conversions
// between them and float. Q8_0 is GGUF's block format: 32 int8 values sharing one F16 scale; the
// other quantised types are ggml's block formats, laid out exactly as ggml-common.h defines them
// (legacy blocks of 32 values, K-quant super-blocks of 256).

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace crescent {

enum class DType {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_NL,
};

constexpr int64_t kQ8BlockSize = 32;
// One Q8_0 block: F16 scale followed by 32 int8 quants (34 bytes), as in GGUF.
struct Q8Block {
  uint16_t scale_f16;
  int8_t quants[kQ8BlockSize];
};
static_assert(sizeof(Q8Block) == 34);

// ggml's blocks (ggml-common.h). `d`/`m`/`dmin` are F16 bit patterns.
constexpr int64_t kQKBlockSize = 256;  // QK_K: values per K-quant super-block
struct BlockQ4_0 {                     // x = d * (q - 8); qs: low nibbles values 0-15, high 16-31
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {  // x = d * q + m
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {  // x = d * (q - 16); bit 4 of value j is bit j of qh
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {  // x = d * q + m
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ2_K {     // 16 groups of 16: x = d * (scales & 15) * q - dmin * (scales >> 4)
  uint8_t scales[16];  // low nibble scale, high nibble min
  uint8_t qs[64];      // 2-bit quants
  uint16_t d;
  uint16_t dmin;
};
struct BlockQ3_K {     // 16 groups of 16: x = d * (scale6 - 32) * (q - 4)
  uint8_t hmask[32];   // bit 2 of each quant
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 6-bit scales
  uint16_t d;
};
struct BlockQ4_K {  // 8 groups of 32: x = d * sc * q - dmin * m (sc, m: 6 bits)
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // get_scale_min_k4 packing
  uint8_t qs[128];
};
struct BlockQ5_K {  // as Q4_K with a fifth bit per quant in qh
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {  // 16 groups of 16: x = d * scales[g] * (q - 32)
  uint8_t ql[128];  // low 4 bits
  uint8_t qh[64];   // high 2 bits
  int8_t scales[16];
  uint16_t d;
};
// IQ4_NL (ggml type 20): 32 values, x = d * kIQ4NLValues[q] for the 4-bit q (nibbles as Q4_0:
// low nibbles values 0-15, high 16-31). llama-quantize writes it for Q2_K/Q3_K tensors whose rows
// are no multiple of 256, and as a type of its own.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
// ggml's kvalues_iq4nl: the 16 non-uniform levels.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

std::string_view dtype_name(DType dtype);

// Values per block (1 for the float types) and bytes per block.
constexpr int64_t dtype_block_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL:
      return 32;
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return kQKBlockSize;
  }
  return 1;
}
constexpr int64_t dtype_block_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
      return sizeof(Q8Block);
    case DType::kQ4_0:
      return sizeof(BlockQ4_0);
    case DType::kQ4_1:
      return sizeof(BlockQ4_1);
    case DType::kQ5_0:
      return sizeof(BlockQ5_0);
    case DType::kQ5_1:
      return sizeof(BlockQ5_1);
    case DType::kQ2_K:
      return sizeof(BlockQ2_K);
    case DType::kQ3_K:
      return sizeof(BlockQ3_K);
    case DType::kQ4_K:
      return sizeof(BlockQ4_K);
    case DType::kQ5_K:
      return sizeof(BlockQ5_K);
    case DType::kQ6_K:
      return sizeof(BlockQ6_K);
    case DType::kIQ4_NL:
      return sizeof(BlockIQ4_NL);
  }
  return 0;
}
// A block-quantised type (Q8_0 and the ggml types above).
constexpr bool is_block_quantized(DType dtype) {
  return dtype_block_size(dtype) > 1;
}

// Bytes taken by num_elements values (num_elements must be a multiple of the block size).
constexpr int64_t dtype_num_bytes(DType dtype, int64_t num_elements) {
  return num_elements / dtype_block_size(dtype) * dtype_block_bytes(dtype);
}

inline float bf16_to_float(uint16_t v) {
  return std::bit_cast<float>(static_cast<uint32_t>(v) << 16);
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffff) > 0x7f800000)
    return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Converts num_elements values of `dtype` at data to float (a multiple of the block size);
// the quantised types dequantise exactly as ggml's dequantize_row_* do.
void dtype_to_float(DType dtype, const void* data, int64_t num_elements, float* out);

}  // namespace crescent
