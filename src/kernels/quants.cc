// Reference quantisers, transcribed from ggml-quants.c's quantize_row_*_ref (same arithmetic in
// the same order, same rounding: nearest_int is ggml's magic-number round-half-to-even), so a file
// written here holds what ggml's reference path writes for the same floats (llama-quantize without
// an importance matrix uses the same algorithms for these types).

#include "kernels/quants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/kernel_table.h"
#include "kernels/quants_iq4_nl.h"

namespace crescent::kernels {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

int nearest_int(float fval) {
  // ggml: adds 12582912 (1.5 * 2^23) and reads the mantissa: round half to even.
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

void quantize_q4_0(const float* x, int64_t nb, BlockQ4_0* y) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0;
    float max = 0;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = float_to_f16(d);
    for (int j = 0; j < 16; ++j) {
      const int xi0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int xi1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, int64_t nb, BlockQ4_1* y) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float min = x[0];
    float max = x[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = float_to_f16(d);
    y[i].m = float_to_f16(min);
    for (int j = 0; j < 16; ++j) {
      const int xi0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int xi1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
    }
  }
}

template <typename Block>
void quantize_q5(const float* x, int64_t nb, Block* y) {
  constexpr bool kHasMin = requires(Block b) {
    b.m;
  };
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float d;
    float id;
    float min = 0;
    float offset;
    if constexpr (kHasMin) {
      min = x[0];
      float max = x[0];
      for (int j = 1; j < 32; ++j) {
        min = std::min(min, x[j]);
        max = std::max(max, x[j]);
      }
      d = (max - min) / 31;
      y[i].m = float_to_f16(min);
      offset = 0.5f;
    } else {
      float amax = 0;
      float max = 0;
      for (int j = 0; j < 32; ++j) {
        if (amax < std::fabs(x[j])) {
          amax = std::fabs(x[j]);
          max = x[j];
        }
      }
      d = max / -16;
      offset = 16.5f;
    }
    id = d != 0 ? 1.0f / d : 0.0f;
    y[i].d = float_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      int xi0 = static_cast<int8_t>((x[j] - min) * id + offset);
      int xi1 = static_cast<int8_t>((x[j + 16] - min) * id + offset);
      if constexpr (!kHasMin) {
        xi0 = std::min(31, xi0);
        xi1 = std::min(31, xi1);
      }
      y[i].qs[j] = static_cast<uint8_t>((xi0 & 0x0f) | ((xi1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((xi0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((xi1 & 0x10) >> 4) << (j + 16);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  float iscale = -nmax / max;
  auto weight = [&](int i) {
    switch (rmse_type) {
      case 1:
        return x[i] * x[i];
      case 2:
        return 1.0f;
      case 3:
        return std::fabs(x[i]);
      default:
        return std::sqrt(std::fabs(x[i]));
    }
  };
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0)
      continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed)
      break;
  }
  for (int i = 0; i < n; ++i)
    L[i] = static_cast<int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0)
    min = 0;
  if (max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0;
    float sum_l2 = 0;
    float sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void quantize_q2_k(const float* x, int64_t nb, BlockQ2_K* y) {
  uint8_t L[256];
  uint8_t Laux[16];
  float weights[16];
  float mins[16];
  float scales[16];
  constexpr float kQ4Scale = 15.f;
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l)
        weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                   0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = float_to_f16(max_scale / kQ4Scale);
    } else {
      std::memset(y[i].scales, 0, 16);
      y[i].d = float_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < 16; ++j) {
        y[i].scales[j] =
            static_cast<uint8_t>(y[i].scales[j] | (nearest_int(iscale * mins[j]) << 4));
      }
      y[i].dmin = float_to_f16(max_min / kQ4Scale);
    } else {
      y[i].dmin = float_to_f16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_float(y[i].d) * (y[i].scales[j] & 0xf);
      if (d == 0)
        continue;
      const float dm = f16_to_float(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int((x[16 * j + ii] + dm) / d);
        L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
      }
    }
    for (int j = 0; j < 256; j += 128) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
      }
    }
  }
}

void quantize_q3_k(const float* x, int64_t nb, BlockQ3_K* y) {
  int8_t L[256];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale != 0) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        int l = nearest_int(iscale * scales[j]);
        l = std::max(-32, std::min(31, l)) + 32;
        if (j < 8) {
          y[i].scales[j] = static_cast<uint8_t>(l & 0xf);
        } else {
          y[i].scales[j - 8] = static_cast<uint8_t>(y[i].scales[j - 8] | ((l & 0xf) << 4));
        }
        l >>= 4;
        y[i].scales[j % 4 + 8] =
            static_cast<uint8_t>(y[i].scales[j % 4 + 8] | (l << (2 * (j / 4))));
      }
      y[i].d = float_to_f16(1 / iscale);
    } else {
      y[i].d = float_to_f16(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      int sc = j < 8 ? y[i].scales[j] & 0xf : y[i].scales[j - 8] >> 4;
      sc = (sc | (((y[i].scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
      const float d = f16_to_float(y[i].d) * sc;
      if (d == 0)
        continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
      }
    }
    std::memset(y[i].hmask, 0, 32);
    int m = 0;
    uint8_t hm = 1;
    for (int j = 0; j < 256; ++j) {
      if (L[j] > 3) {
        y[i].hmask[m] |= hm;
        L[j] = static_cast<int8_t>(L[j] - 4);
      }
      if (++m == 32) {
        m = 0;
        hm = static_cast<uint8_t>(hm << 1);
      }
    }
    for (int j = 0; j < 256; j += 128) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) |
                                                  (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
      }
    }
  }
}

// Q4_K and Q5_K share everything but the number of levels and how quants are stored.
template <typename Block>
void quantize_q45_k(const float* x, int64_t nb, Block* y) {
  constexpr bool kIsQ5 = requires(Block b) {
    b.qh;
  };
  constexpr int kNmax = kIsQ5 ? 31 : 15;
  uint8_t L[256];
  uint8_t Laux[32];
  float weights[32];
  float mins[8];
  float scales[8];
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l)
        sum_x2 += x[32 * j + l] * x[32 * j + l];
      const float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l)
        weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, kNmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                   kIsQ5 ? -0.5f : -1.f, 0.1f, kIsQ5 ? 15 : 20, false);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < 8; ++j) {
      const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
      const int lm = std::min(63, nearest_int(inv_min * mins[j]));
      if (j < 4) {
        y[i].scales[j] = static_cast<uint8_t>(ls);
        y[i].scales[j + 4] = static_cast<uint8_t>(lm);
      } else {
        y[i].scales[j + 4] = static_cast<uint8_t>((ls & 0xf) | ((lm & 0xf) << 4));
        y[i].scales[j - 4] = static_cast<uint8_t>(y[i].scales[j - 4] | ((ls >> 4) << 6));
        y[i].scales[j] = static_cast<uint8_t>(y[i].scales[j] | ((lm >> 4) << 6));
      }
    }
    y[i].d = float_to_f16(max_scale / 63.f);
    y[i].dmin = float_to_f16(max_min / 63.f);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc;
      uint8_t m;
      get_scale_min_k4(j, y[i].scales, &sc, &m);
      const float d = f16_to_float(y[i].d) * sc;
      if (d == 0)
        continue;
      const float dm = f16_to_float(y[i].dmin) * m;
      for (int ii = 0; ii < 32; ++ii) {
        const int l = nearest_int((x[32 * j + ii] + dm) / d);
        L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(kNmax, l)));
      }
    }
    uint8_t* q = y[i].qs;
    if constexpr (kIsQ5) {
      std::memset(y[i].qh, 0, 32);
      uint8_t m1 = 1;
      uint8_t m2 = 2;
      for (int n = 0; n < 256; n += 64) {
        for (int j = 0; j < 32; ++j) {
          int l1 = L[n + j];
          if (l1 > 15) {
            l1 -= 16;
            y[i].qh[j] |= m1;
          }
          int l2 = L[n + j + 32];
          if (l2 > 15) {
            l2 -= 16;
            y[i].qh[j] |= m2;
          }
          q[j] = static_cast<uint8_t>(l1 | (l2 << 4));
        }
        m1 = static_cast<uint8_t>(m1 << 2);
        m2 = static_cast<uint8_t>(m2 << 2);
        q += 32;
      }
    } else {
      for (int j = 0; j < 256; j += 64) {
        for (int l = 0; l < 32; ++l)
          q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
      }
    }
  }
}

void quantize_q6_k(const float* x, int64_t nb, BlockQ6_K* y) {
  int8_t L[256];
  float scales[16];
  for (int64_t i = 0; i < nb; ++i, x += 256) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      y[i].d = float_to_f16(0.f);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = float_to_f16(1 / iscale);
    for (int ib = 0; ib < 16; ++ib)
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < 16; ++j) {
      const float d = f16_to_float(y[i].d) * y[i].scales[j];
      if (d == 0)
        continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < 256; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l] & 0xf;
        const int q2 = L[j + l + 32] & 0xf;
        const int q3 = L[j + l + 64] & 0xf;
        const int q4 = L[j + l + 96] & 0xf;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                     ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
  }
}

void quantize_q8_0_blocks(const float* x, int64_t nb, Q8Block* y) {
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    y[i].scale_f16 = float_to_f16(d);
    for (int j = 0; j < 32; ++j)
      y[i].quants[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

}  // namespace

void quantize_row(DType dtype, const float* x, int64_t num_values, void* out) {
  const int64_t nb = num_values / dtype_block_size(dtype);
  CRESCENT_CHECK(is_block_quantized(dtype) && nb * dtype_block_size(dtype) == num_values)
      << "quantize_row: " << dtype_name(dtype) << " of " << num_values << " values";
  switch (dtype) {
    case DType::kQ8_0:
      return quantize_q8_0_blocks(x, nb, static_cast<Q8Block*>(out));
    case DType::kQ4_0:
      return quantize_q4_0(x, nb, static_cast<BlockQ4_0*>(out));
    case DType::kQ4_1:
      return quantize_q4_1(x, nb, static_cast<BlockQ4_1*>(out));
    case DType::kQ5_0:
      return quantize_q5(x, nb, static_cast<BlockQ5_0*>(out));
    case DType::kQ5_1:
      return quantize_q5(x, nb, static_cast<BlockQ5_1*>(out));
    case DType::kQ2_K:
      return quantize_q2_k(x, nb, static_cast<BlockQ2_K*>(out));
    case DType::kQ3_K:
      return quantize_q3_k(x, nb, static_cast<BlockQ3_K*>(out));
    case DType::kQ4_K:
      return quantize_q45_k(x, nb, static_cast<BlockQ4_K*>(out));
    case DType::kQ5_K:
      return quantize_q45_k(x, nb, static_cast<BlockQ5_K*>(out));
    case DType::kQ6_K:
      return quantize_q6_k(x, nb, static_cast<BlockQ6_K*>(out));
    case DType::kIQ4_NL:
      return internal::quantize_iq4_nl(x, nb, static_cast<BlockIQ4_NL*>(out));
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      break;
  }
}

void quantize_row_q8_k(const float* x, int64_t num_values, BlockQ8K* y) {
  if (const auto fn = internal::active_table().quantize_q8_k; fn != nullptr) {
    fn(x, num_values, y);
    return;
  }
  // ggml's quantize_row_q8_K_ref.
  for (int64_t i = 0; i < num_values / kQKBlockSize; ++i, x += kQKBlockSize) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQKBlockSize; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, sizeof(y[i].qs));
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQKBlockSize; ++j)
      y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < kQKBlockSize / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii)
        sum += y[i].qs[j * 16 + ii];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

float quant_row_dot(DType dtype, int64_t num_values, const void* w_row, const QuantizedActs& x) {
  const internal::RowDotFn fn = internal::active_table().row_dot[static_cast<int>(dtype)];
  CRESCENT_CHECK(fn != nullptr) << "no dot kernel for " << dtype_name(dtype);
  float out;
  fn(num_values, w_row, &x, 1, &out);
  return out;
}

}  // namespace crescent::kernels
