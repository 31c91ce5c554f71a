#pragma once
// Internal to src/kernels: ggml blocks unpacked to integer quants and scales, shared by the
// portable row dots and the tests. A block's value i is d * scale[g] * q[i] - dmin * min[g]
// (g = the group of i) for the K-quants and d * q[i] + m for the legacy types.

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace crescent::kernels::internal {

struct LegacyScale {
  float d = 0;
  float m = 0;
};

inline LegacyScale unpack_legacy(const BlockQ4_0& b, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((b.qs[j] & 0x0f) - 8);
    q[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
  }
  return {f16_to_float(b.d), 0.0f};
}
inline LegacyScale unpack_legacy(const BlockQ4_1& b, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(b.qs[j] & 0x0f);
    q[j + 16] = static_cast<int8_t>(b.qs[j] >> 4);
  }
  return {f16_to_float(b.d), f16_to_float(b.m)};
}
template <typename Block>
inline void unpack_q5_quants(const Block& b, int offset, int8_t* q) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((b.qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - offset);
    q[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - offset);
  }
}
inline LegacyScale unpack_legacy(const BlockQ5_0& b, int8_t* q) {
  unpack_q5_quants(b, 16, q);
  return {f16_to_float(b.d), 0.0f};
}
inline LegacyScale unpack_legacy(const BlockQ5_1& b, int8_t* q) {
  unpack_q5_quants(b, 0, q);
  return {f16_to_float(b.d), f16_to_float(b.m)};
}
inline LegacyScale unpack_legacy(const BlockIQ4_NL& b, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = kIQ4NLValues[b.qs[j] & 0x0f];
    q[j + 16] = kIQ4NLValues[b.qs[j] >> 4];
  }
  return {f16_to_float(b.d), 0.0f};
}
inline LegacyScale unpack_legacy(const Q8Block& b, int8_t* q) {
  std::memcpy(q, b.quants, 32);
  return {f16_to_float(b.scale_f16), 0.0f};
}

struct KScales {
  float d = 0;
  float dmin = 0;
  int num_groups = 0;  // 8 groups of 32 (Q4_K, Q5_K) or 16 of 16
  int32_t scale[16] = {};
  int32_t min[16] = {};
};

inline void get_scale_min_k4(int j, const uint8_t* q, int32_t* d, int32_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

inline void unpack_k(const BlockQ4_K& b, int8_t* q, KScales* s) {
  s->d = f16_to_float(b.d);
  s->dmin = f16_to_float(b.dmin);
  s->num_groups = 8;
  for (int j = 0; j < 8; ++j)
    get_scale_min_k4(j, b.scales, &s->scale[j], &s->min[j]);
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l) {
      q[64 * k + l] = static_cast<int8_t>(b.qs[32 * k + l] & 0x0f);
      q[64 * k + 32 + l] = static_cast<int8_t>(b.qs[32 * k + l] >> 4);
    }
  }
}

inline void unpack_k(const BlockQ5_K& b, int8_t* q, KScales* s) {
  s->d = f16_to_float(b.d);
  s->dmin = f16_to_float(b.dmin);
  s->num_groups = 8;
  for (int j = 0; j < 8; ++j)
    get_scale_min_k4(j, b.scales, &s->scale[j], &s->min[j]);
  for (int k = 0; k < 4; ++k) {
    for (int l = 0; l < 32; ++l) {
      const int hi0 = ((b.qh[l] >> (2 * k)) & 1) << 4;
      const int hi1 = ((b.qh[l] >> (2 * k + 1)) & 1) << 4;
      q[64 * k + l] = static_cast<int8_t>((b.qs[32 * k + l] & 0x0f) | hi0);
      q[64 * k + 32 + l] = static_cast<int8_t>((b.qs[32 * k + l] >> 4) | hi1);
    }
  }
}

inline void unpack_k(const BlockQ6_K& b, int8_t* q, KScales* s) {
  s->d = f16_to_float(b.d);
  s->num_groups = 16;
  for (int g = 0; g < 16; ++g)
    s->scale[g] = b.scales[g];
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    int8_t* y = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      y[l] = static_cast<int8_t>(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
      y[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
      y[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      y[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

inline void unpack_k(const BlockQ2_K& b, int8_t* q, KScales* s) {
  s->d = f16_to_float(b.d);
  s->dmin = f16_to_float(b.dmin);
  s->num_groups = 16;
  for (int g = 0; g < 16; ++g) {
    s->scale[g] = b.scales[g] & 0xf;
    s->min[g] = b.scales[g] >> 4;
  }
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l)
        q[128 * n + 32 * j + l] = static_cast<int8_t>((b.qs[32 * n + l] >> (2 * j)) & 3);
    }
  }
}

inline void unpack_k(const BlockQ3_K& b, int8_t* q, KScales* s) {
  s->d = f16_to_float(b.d);
  s->num_groups = 16;
  for (int g = 0; g < 16; ++g) {
    int sc = g < 8 ? b.scales[g] & 0xf : b.scales[g - 8] >> 4;
    sc |= ((b.scales[8 + g % 4] >> (2 * (g / 4))) & 3) << 4;
    s->scale[g] = sc - 32;
  }
  for (int n = 0; n < 2; ++n) {
    for (int j = 0; j < 4; ++j) {
      const int m = 1 << (4 * n + j);
      for (int l = 0; l < 32; ++l) {
        const int lo = (b.qs[32 * n + l] >> (2 * j)) & 3;
        q[128 * n + 32 * j + l] = static_cast<int8_t>(lo - ((b.hmask[l] & m) ? 0 : 4));
      }
    }
  }
}

}  // namespace crescent::kernels::internal
