#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/test_util.h"

namespace crescent::kernels {
namespace {

using testing::available_isas;
using testing::random_floats;
using testing::ScopedIsa;

struct SeqData {
  int64_t len;              // tokens in the cache after this step
  int64_t start_pos;        // first query position
  std::vector<float> k, v;  // [len][kv_heads][head_dim]
  std::vector<int32_t> block_table;
};

// Naive causal attention for one query row over gathered contiguous K/V, in double.
std::vector<double> naive_attention(const float* q, const SeqData& s, int64_t pos, int num_heads,
                                    const KvCacheLayout& layout, float scale) {
  const int group = num_heads / layout.num_kv_heads;
  const int d = layout.head_dim;
  std::vector<double> out(int64_t{num_heads} * d, 0.0);
  for (int h = 0; h < num_heads; ++h) {
    const int g = h / group;
    std::vector<double> scores(pos + 1);
    double m = -1e300;
    for (int64_t j = 0; j <= pos; ++j) {
      double dot = 0;
      for (int i = 0; i < d; ++i) {
        dot += double{q[h * d + i]} * s.k[(j * layout.num_kv_heads + g) * d + i];
      }
      scores[j] = dot * scale;
      m = std::max(m, scores[j]);
    }
    double sum = 0;
    for (double& sc : scores) {
      sc = std::exp(sc - m);
      sum += sc;
    }
    for (int64_t j = 0; j <= pos; ++j) {
      for (int i = 0; i < d; ++i) {
        out[h * d + i] += scores[j] / sum * s.v[(j * layout.num_kv_heads + g) * d + i];
      }
    }
  }
  return out;
}

// bf16 K/V: the reference attends over the rounded values, so only f32 math differs.
void round_to_bf16(std::vector<float>& x) {
  for (float& f : x)
    f = bf16_to_float(float_to_bf16(f));
}

void run_case(int num_kv_heads, int group, int head_dim, int block_size,
              KvDtype dtype = KvDtype::kFloat32) {
  const int num_heads = num_kv_heads * group;
  KvCacheLayout layout{3, block_size, num_kv_heads, head_dim, dtype};
  const int layer = 1;
  // Sequences: a decode step, a chunked prefill continuing at start_pos > 0, a fresh prefill.
  std::vector<SeqData> seqs(3);
  seqs[0].len = 23;
  seqs[0].start_pos = 22;
  seqs[1].len = 41;
  seqs[1].start_pos = 9;
  seqs[2].len = 37;
  seqs[2].start_pos = 0;
  int64_t num_blocks = 0;
  for (auto& s : seqs)
    num_blocks += (s.len + block_size - 1) / block_size;
  // Shuffled block ids so that no sequence's blocks are contiguous or in order.
  std::vector<int32_t> ids(num_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(num_heads * 31 + head_dim));
  // Filled with NaN bytes (0xff) in either dtype, so reading an unwritten slot shows.
  std::vector<std::byte> kv(static_cast<size_t>((num_blocks + 3) * layout.block_num_bytes()),
                            std::byte{0xff});
  size_t next_id = 0;
  const int64_t row = int64_t{num_kv_heads} * head_dim;
  uint32_t seed = 1;
  for (auto& s : seqs) {
    for (int64_t b = 0; b < (s.len + block_size - 1) / block_size; ++b) {
      s.block_table.push_back(ids[next_id++]);
    }
    s.k = random_floats(s.len * row, seed++);
    s.v = random_floats(s.len * row, seed++);
    // Write in uneven chunks, as prefill chunks and decode steps would.
    for (int64_t t = 0; t < s.len;) {
      const int64_t n = std::min<int64_t>(s.len - t, 1 + (t % 7));
      write_kv(&s.k[t * row], &s.v[t * row], n, t, s.block_table.data(), layer, layout, kv.data());
      t += n;
    }
    if (dtype == KvDtype::kBf16) {
      round_to_bf16(s.k);
      round_to_bf16(s.v);
    }
  }
  // Check the layout directly: K of position p, kv head g sits at the documented offset.
  {
    const SeqData& s = seqs[1];
    const int64_t p = 13;
    const int64_t elem = kv_dtype_bytes(dtype);
    const std::byte* k = kv.data() + s.block_table[p / block_size] * layout.block_num_bytes() +
                         (2 * layer * layout.layer_part_elements() + (p % block_size) * row) * elem;
    for (int64_t i = 0; i < row; ++i) {
      float stored = 0;
      if (dtype == KvDtype::kBf16) {
        uint16_t h = 0;
        std::memcpy(&h, k + i * 2, 2);
        stored = bf16_to_float(h);
      } else {
        std::memcpy(&stored, k + i * 4, 4);
      }
      ASSERT_EQ(stored, s.k[p * row + i]) << "element " << i;
    }
  }

  std::vector<AttentionSeq> aseqs;
  int64_t total_rows = 0;
  for (auto& s : seqs) {
    aseqs.push_back({total_rows, s.len - s.start_pos, s.start_pos, s.block_table.data()});
    total_rows += s.len - s.start_pos;
  }
  const auto q = random_floats(total_rows * num_heads * head_dim, 99, -2, 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ThreadPool one(1);
  ThreadPool two(2);
  for (Isa isa : available_isas()) {
    ScopedIsa scoped(isa);
    std::vector<float> out1(q.size()), out2(q.size());
    paged_attention(aseqs, q.data(), num_heads, layer, layout, kv.data(), scale, out1.data(), one);
    paged_attention(aseqs, q.data(), num_heads, layer, layout, kv.data(), scale, out2.data(), two);
    ASSERT_EQ(0, std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)))
        << "thread count changed the result";
    for (size_t si = 0; si < seqs.size(); ++si) {
      for (int64_t t = 0; t < aseqs[si].num_tokens; ++t) {
        const int64_t r = aseqs[si].q_row + t;
        const auto ref = naive_attention(&q[r * num_heads * head_dim], seqs[si],
                                         seqs[si].start_pos + t, num_heads, layout, scale);
        for (int64_t i = 0; i < num_heads * head_dim; ++i) {
          ASSERT_NEAR(out2[r * num_heads * head_dim + i], ref[i], 2e-5)
              << isa_name(isa) << " seq " << si << " t " << t << " i " << i;
        }
      }
    }
  }
}

TEST(PagedAttentionTest, MatchesNaiveAttentionMha) {
  run_case(3, 1, 16, 5);
}
TEST(PagedAttentionTest, MatchesNaiveAttentionGqa2) {
  run_case(2, 2, 64, 16);
}
TEST(PagedAttentionTest, MatchesNaiveAttentionGqa7) {
  run_case(2, 7, 12, 3);
}

TEST(PagedAttentionTest, Bf16KvMatchesNaiveAttentionMha) {
  run_case(3, 1, 16, 5, KvDtype::kBf16);
}
TEST(PagedAttentionTest, Bf16KvMatchesNaiveAttentionGqa2) {
  run_case(2, 2, 64, 16, KvDtype::kBf16);
}
TEST(PagedAttentionTest, Bf16KvMatchesNaiveAttentionGqa7) {
  run_case(2, 7, 12, 3, KvDtype::kBf16);
}

// bf16 K/V against f32 K/V of the same values: the difference is the rounding of K and V only
// (at most 2^-8 relative per element), far inside this bound for unit-scale inputs.
TEST(PagedAttentionTest, Bf16KvCloseToF32Kv) {
  const int num_kv_heads = 2, group = 7, head_dim = 64, block_size = 16, len = 50;
  const int num_heads = num_kv_heads * group;
  const int64_t row = int64_t{num_kv_heads} * head_dim;
  const auto k = random_floats(len * row, 5);
  const auto v = random_floats(len * row, 6);
  const auto q = random_floats(int64_t{len} * num_heads * head_dim, 7, -2, 2);
  std::vector<int32_t> table = {3, 0, 2, 1};
  std::vector<float> out[2];
  ThreadPool pool(2);
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBf16}) {
    KvCacheLayout layout{1, block_size, num_kv_heads, head_dim, dtype};
    std::vector<std::byte> kv(static_cast<size_t>(4 * layout.block_num_bytes()));
    write_kv(k.data(), v.data(), len, 0, table.data(), 0, layout, kv.data());
    const AttentionSeq seq{0, len, 0, table.data()};
    auto& o = out[dtype == KvDtype::kBf16];
    o.resize(q.size());
    paged_attention({&seq, 1}, q.data(), num_heads, 0, layout, kv.data(),
                    1.0f / std::sqrt(static_cast<float>(head_dim)), o.data(), pool);
  }
  double max_diff = 0;
  for (size_t i = 0; i < q.size(); ++i)
    max_diff = std::max(max_diff, double{std::fabs(out[0][i] - out[1][i])});
  EXPECT_LT(max_diff, 1e-2);
  EXPECT_GT(max_diff, 0.0) << "the bf16 cache should round something";
}

// f32 -> bf16 -> f32 is exact for values with 8 significant bits, rounds to nearest even
// otherwise, and the bf16 dot/axpy of every ISA equal the widened f32 ones.
TEST(KvBf16Test, ConversionRoundTripAndOps) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.0f)), -3.0f);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), float_to_bf16(1.0f));  // tie: to even
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1.8p-8f)), 1.0f + 0x1p-7f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  const auto x = random_floats(1000, 11);
  for (float f : x) {
    const float r = bf16_to_float(float_to_bf16(f));
    ASSERT_LE(std::fabs(r - f), std::fabs(f) * 0x1p-8f) << f;
  }
  for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 64, 100}) {
    const auto a = random_floats(n, 20 + n);
    const auto b = random_floats(n, 40 + n);
    std::vector<uint16_t> b16(n);
    std::vector<float> b_wide(n);
    for (int64_t i = 0; i < n; ++i) {
      b16[i] = float_to_bf16(b[i]);
      b_wide[i] = bf16_to_float(b16[i]);
    }
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      const internal::KernelTable& t = internal::active_table();
      EXPECT_NEAR(t.dot_bf16(a.data(), b16.data(), n), t.dot(a.data(), b_wide.data(), n), 1e-4)
          << isa_name(isa) << " n " << n;
      std::vector<float> y1(a), y2(a);
      t.axpy_bf16(0.75f, b16.data(), y1.data(), n);
      t.axpy(0.75f, b_wide.data(), y2.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(y1[i], y2[i], 1e-6) << isa_name(isa) << " n " << n << " i " << i;
    }
  }
}

TEST(KvCacheLayoutTest, Sizes) {
  KvCacheLayout layout{24, 16, 2, 64};
  EXPECT_EQ(layout.layer_part_elements(), 16 * 2 * 64);
  EXPECT_EQ(layout.block_num_elements(), 2 * 24 * 16 * 2 * 64);
  EXPECT_EQ(layout.block_num_bytes(), 4 * 2 * 24 * 16 * 2 * 64);
  layout.dtype = KvDtype::kBf16;
  EXPECT_EQ(layout.block_num_bytes(), 2 * 2 * 24 * 16 * 2 * 64);
}

TEST(KvDtypeTest, ParsesTheFlag) {
  EXPECT_EQ(*parse_kv_dtype("float32"), KvDtype::kFloat32);
  EXPECT_EQ(*parse_kv_dtype("bf16"), KvDtype::kBf16);
  EXPECT_EQ(*parse_kv_dtype("auto"),
            active_isa() >= Isa::kAvx2 ? KvDtype::kBf16 : KvDtype::kFloat32);
  {
    ScopedIsa portable(Isa::kPortable);
    EXPECT_EQ(*parse_kv_dtype("auto"), KvDtype::kFloat32);
  }
  for (const char* name : {"f16", "fp8_e4m3", "q8_0"}) {
    Result<KvDtype> r = parse_kv_dtype(name);
    ASSERT_FALSE(r.is_ok()) << name;
    EXPECT_NE(r.status().message().find("--kv-cache-dtype"), std::string::npos);
    EXPECT_NE(r.status().message().find("not implemented"), std::string::npos) << name;
    EXPECT_NE(r.status().message().find(name), std::string::npos);
  }
  Result<KvDtype> bad = parse_kv_dtype("int4");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'int4'"), std::string::npos);
  EXPECT_EQ(kv_dtype_name(KvDtype::kBf16), "bf16");
  EXPECT_EQ(kv_dtype_name(KvDtype::kFloat32), "float32");
}

}  // namespace
}  // namespace crescent::kernels
