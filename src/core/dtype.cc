#include "core/dtype.h"

#include <cmath>
#include <cstring>

namespace crescent {
namespace {

// The dequantisers below follow ggml-quants.c's dequantize_row_* value for value.

void dequantize_q4_0(const BlockQ4_0* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_float(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0f) - 8) * d;
      y[j + 16] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_float(x[i].d);
    const float m = f16_to_float(x[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0f) * d + m;
      y[j + 16] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

template <typename Block>
void dequantize_q5(const Block* x, int64_t nb, float* y, bool has_min) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_float(x[i].d);
    float m = 0;
    if constexpr (requires { x[i].m; })
      m = f16_to_float(x[i].m);
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    const int offset = has_min ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
      const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(((x[i].qs[j] & 0x0f) | xh0) - offset) * d + m;
      y[j + 16] = static_cast<float>(((x[i].qs[j] >> 4) | xh1) - offset) * d + m;
    }
  }
}

void dequantize_q2_k(const BlockQ2_K* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_float(x[i].d);
    const float min = f16_to_float(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xf);
          const float ml = min * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
          }
        }
        shift += 2;
      }
      q += 32;
    }
  }
}

void dequantize_q3_k(const BlockQ3_K* x, int64_t nb, float* y) {
  constexpr uint32_t kmask1 = 0x03030303;
  constexpr uint32_t kmask2 = 0x0f0f0f0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = f16_to_float(x[i].d);
    const uint8_t* q = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    uint8_t m = 1;
    uint32_t aux[4];
    std::memcpy(aux, x[i].scales, 12);
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    std::memcpy(scales, aux, 16);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
      int shift = 0;
      for (int j = 0; j < 4; ++j) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
          }
        }
        shift += 2;
        m = static_cast<uint8_t>(m << 1);
      }
      q += 32;
    }
  }
}

// ggml's dequantize_row_iq4_nl.
void dequantize_iq4_nl(const BlockIQ4_NL* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = f16_to_float(x[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIQ4NLValues[x[i].qs[j] & 0xf];
      y[j + 16] = d * kIQ4NLValues[x[i].qs[j] >> 4];
    }
  }
}

// ggml's get_scale_min_k4: the 6-bit scale and min of group j of a Q4_K/Q5_K block.
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

template <typename Block>
void dequantize_q45_k(const Block* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_float(x[i].d);
    const float min = f16_to_float(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    int is = 0;
    uint8_t u1 = 1;
    uint8_t u2 = 2;
    for (int j = 0; j < 256; j += 64) {
      uint8_t sc;
      uint8_t m;
      get_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = min * m;
      get_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = min * m;
      for (int l = 0; l < 32; ++l) {
        int q = ql[l] & 0xf;
        if constexpr (requires { x[i].qh; })
          q += (x[i].qh[l] & u1) ? 16 : 0;
        *y++ = d1 * static_cast<float>(q) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        int q = ql[l] >> 4;
        if constexpr (requires { x[i].qh; })
          q += (x[i].qh[l] & u2) ? 16 : 0;
        *y++ = d2 * static_cast<float>(q) - m2;
      }
      ql += 32;
      is += 2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void dequantize_q6_k(const BlockQ6_K* x, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_float(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int n = 0; n < 256; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is] * q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2] * q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4] * q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6] * q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ5_1:
      return "Q5_1";
    case DType::kQ2_K:
      return "Q2_K";
    case DType::kQ3_K:
      return "Q3_K";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ5_K:
      return "Q5_K";
    case DType::kQ6_K:
      return "Q6_K";
    case DType::kIQ4_NL:
      return "IQ4_NL";
  }
  return "?";
}

float f16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000)
    return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000)
    return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (abs < 0x38800000) {                         // subnormal or zero in f16
    float a = std::bit_cast<float>(abs);
    // 2^-24 is the f16 subnormal unit; nearbyint rounds half to even.
    auto m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1);
  return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

void dtype_to_float(DType dtype, const void* data, int64_t num_elements, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, data, static_cast<size_t>(num_elements) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < num_elements; ++i) {
        out[i] = f16_to_float(p[i]);
      }
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      for (int64_t i = 0; i < num_elements; ++i) {
        out[i] = bf16_to_float(p[i]);
      }
      return;
    }
    case DType::kQ8_0: {
      const auto* blocks = static_cast<const Q8Block*>(data);
      for (int64_t b = 0; b < num_elements / kQ8BlockSize; ++b) {
        float scale = f16_to_float(blocks[b].scale_f16);
        for (int64_t i = 0; i < kQ8BlockSize; ++i) {
          out[b * kQ8BlockSize + i] = scale * static_cast<float>(blocks[b].quants[i]);
        }
      }
      return;
    }
    case DType::kQ4_0:
      dequantize_q4_0(static_cast<const BlockQ4_0*>(data), num_elements / 32, out);
      return;
    case DType::kQ4_1:
      dequantize_q4_1(static_cast<const BlockQ4_1*>(data), num_elements / 32, out);
      return;
    case DType::kQ5_0:
      dequantize_q5(static_cast<const BlockQ5_0*>(data), num_elements / 32, out, false);
      return;
    case DType::kQ5_1:
      dequantize_q5(static_cast<const BlockQ5_1*>(data), num_elements / 32, out, true);
      return;
    case DType::kQ2_K:
      dequantize_q2_k(static_cast<const BlockQ2_K*>(data), num_elements / 256, out);
      return;
    case DType::kQ3_K:
      dequantize_q3_k(static_cast<const BlockQ3_K*>(data), num_elements / 256, out);
      return;
    case DType::kQ4_K:
      dequantize_q45_k(static_cast<const BlockQ4_K*>(data), num_elements / 256, out);
      return;
    case DType::kQ5_K:
      dequantize_q45_k(static_cast<const BlockQ5_K*>(data), num_elements / 256, out);
      return;
    case DType::kQ6_K:
      dequantize_q6_k(static_cast<const BlockQ6_K*>(data), num_elements / 256, out);
      return;
    case DType::kIQ4_NL:
      dequantize_iq4_nl(static_cast<const BlockIQ4_NL*>(data), num_elements / 32, out);
      return;
  }
}

}  // namespace crescent
