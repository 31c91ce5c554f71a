#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/kernel_table.h"
#include "kernels/kv_convert.h"
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

// Stored K/V: the reference attends over the values as stored (each head row rounded or
// quantised as write_kv does), so only f32 math differs.
void round_to_dtype(std::vector<float>& x, KvDtype dtype, int64_t head_dim) {
  std::vector<std::byte> row(static_cast<size_t>(kv_row_bytes(dtype, head_dim)));
  for (size_t i = 0; i < x.size(); i += static_cast<size_t>(head_dim)) {
    store_kv_row(dtype, &x[i], head_dim, row.data());
    load_kv_row(dtype, row.data(), head_dim, &x[i]);
  }
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
    round_to_dtype(s.k, dtype, head_dim);
    round_to_dtype(s.v, dtype, head_dim);
  }
  // Check the layout directly: K of position p, kv head g sits at the documented offset.
  {
    const SeqData& s = seqs[1];
    const int64_t p = 13;
    const std::byte* k = kv.data() + s.block_table[p / block_size] * layout.block_num_bytes() +
                         2 * layer * layout.layer_part_bytes() +
                         (p % block_size) * num_kv_heads * layout.head_row_bytes();
    std::vector<float> stored(row);
    for (int g = 0; g < num_kv_heads; ++g) {
      load_kv_row(dtype, k + g * layout.head_row_bytes(), head_dim, &stored[g * head_dim]);
    }
    for (int64_t i = 0; i < row; ++i)
      ASSERT_EQ(stored[i], s.k[p * row + i]) << "element " << i;
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

// The AVX-512 / AVX2 prefill path (attend_rows) on the shapes it has to get right: blocks of
// more than 16 keys (two key chunks), blocks of fewer (chunks across blocks), GQA groups of 7
// (7 lane groups: pairs and a single), head dims up to 256.
TEST(PagedAttentionTest, Bf16KvTilesMatchNaiveAttention) {
  run_case(2, 7, 64, 32, KvDtype::kBf16);
  run_case(1, 2, 128, 5, KvDtype::kBf16);
  run_case(1, 3, 256, 16, KvDtype::kBf16);
}

// Causality holds even where a later position's V is not finite: no row may read a key it does
// not see, not even as 0 * V. 20 rows of one prefill (tasks of 16 and 4 rows; with a group of 3
// the AVX-512 tiles pair row 18's last head with row 19's first), V of the last position +inf in
// every dtype that can hold it.
TEST(PagedAttentionTest, AnInfiniteLaterValueDoesNotReachEarlierRows) {
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBf16, KvDtype::kF16}) {
    const int num_kv_heads = 1, group = 3, head_dim = 64, block_size = 16, len = 20;
    const int num_heads = num_kv_heads * group;
    KvCacheLayout layout{1, block_size, num_kv_heads, head_dim, dtype};
    std::vector<std::byte> kv(static_cast<size_t>(2 * layout.block_num_bytes()));
    const std::vector<int32_t> block_table = {1, 0};
    std::vector<float> k = random_floats(len * head_dim, 3);
    std::vector<float> v = random_floats(len * head_dim, 4);
    for (int d = 0; d < head_dim; ++d)
      v[(len - 1) * head_dim + d] = std::numeric_limits<float>::infinity();
    write_kv(k.data(), v.data(), len, 0, block_table.data(), 0, layout, kv.data());
    const std::vector<float> q = random_floats(len * num_heads * head_dim, 5);
    const AttentionSeq seq{0, len, 0, block_table.data()};
    ThreadPool pool(2);
    for (Isa isa : available_isas()) {
      ScopedIsa scoped(isa);
      std::vector<float> out(q.size());
      paged_attention({&seq, 1}, q.data(), num_heads, 0, layout, kv.data(), 0.125f, out.data(),
                      pool);
      for (int64_t i = 0; i < (len - 1) * num_heads * head_dim; ++i) {
        ASSERT_TRUE(std::isfinite(out[i])) << isa_name(isa) << " " << kv_dtype_name(dtype)
                                           << " row " << i / (num_heads * head_dim);
      }
    }
  }
}

TEST(PagedAttentionTest, F16KvMatchesNaiveAttention) {
  run_case(3, 1, 16, 5, KvDtype::kF16);
  run_case(2, 7, 12, 3, KvDtype::kF16);
}
// f16 K/V through the same prefill tiles (widened with vcvtph2ps).
TEST(PagedAttentionTest, F16KvTilesMatchNaiveAttention) {
  run_case(2, 7, 64, 32, KvDtype::kF16);
  run_case(1, 2, 128, 5, KvDtype::kF16);
}
TEST(PagedAttentionTest, Fp8KvMatchesNaiveAttention) {
  run_case(3, 1, 16, 5, KvDtype::kFp8E4m3);
  run_case(2, 7, 12, 3, KvDtype::kFp8E4m3);
}
TEST(PagedAttentionTest, Q8_0KvMatchesNaiveAttention) {
  run_case(2, 2, 64, 16, KvDtype::kQ8_0);
  run_case(1, 3, 32, 3, KvDtype::kQ8_0);
}

// bf16 K/V against f32 K/V of the same values: the difference is the rounding of K and V only
// (at most 2^-8 relative per element), far inside this bound for unit-scale inputs.
// Each stored type against f32 K/V of the same values: the difference is the rounding of K and
// V only. Bounds for unit-scale inputs (max |out difference|): bf16 and f16 round to 8 / 11
// significant bits, fp8_e4m3 to 4, q8_0 to amax/254 per block of 32.
TEST(PagedAttentionTest, StoredKvCloseToF32Kv) {
  const int num_kv_heads = 2, group = 7, head_dim = 64, block_size = 16, len = 50;
  const int num_heads = num_kv_heads * group;
  const int64_t row = int64_t{num_kv_heads} * head_dim;
  const auto k = random_floats(len * row, 5);
  const auto v = random_floats(len * row, 6);
  const auto q = random_floats(int64_t{len} * num_heads * head_dim, 7, -2, 2);
  std::vector<int32_t> table = {3, 0, 2, 1};
  ThreadPool pool(2);
  auto run = [&](KvDtype dtype) {
    KvCacheLayout layout{1, block_size, num_kv_heads, head_dim, dtype};
    std::vector<std::byte> kv(static_cast<size_t>(4 * layout.block_num_bytes()));
    write_kv(k.data(), v.data(), len, 0, table.data(), 0, layout, kv.data());
    const AttentionSeq seq{0, len, 0, table.data()};
    std::vector<float> o(q.size());
    paged_attention({&seq, 1}, q.data(), num_heads, 0, layout, kv.data(),
                    1.0f / std::sqrt(static_cast<float>(head_dim)), o.data(), pool);
    return o;
  };
  const std::vector<float> f32 = run(KvDtype::kFloat32);
  const std::pair<KvDtype, double> cases[] = {{KvDtype::kBf16, 1e-2},
                                              {KvDtype::kF16, 2e-3},
                                              {KvDtype::kFp8E4m3, 6e-2},
                                              {KvDtype::kQ8_0, 2e-2}};
  for (const auto& [dtype, bound] : cases) {
    const std::vector<float> o = run(dtype);
    double max_diff = 0;
    for (size_t i = 0; i < q.size(); ++i)
      max_diff = std::max(max_diff, double{std::fabs(f32[i] - o[i])});
    EXPECT_LT(max_diff, bound) << kv_dtype_name(dtype);
    EXPECT_GT(max_diff, 0.0) << kv_dtype_name(dtype) << " should round something";
  }
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

// The block-of-rows forms attention uses on the bf16 cache equal the per-row ops: rows `stride`
// apart, head dims with tails and more than one 64-value run.
TEST(AttentionOpsTest, RowBlocksEqualPerRowOpsOnEveryIsa) {
  for (int64_t dim : {7, 64, 100, 130}) {
    const int64_t stride = dim + 9;
    for (int n : {1, 5, 16}) {
      const auto q = random_floats(dim, 60 + dim);
      const auto rows_f = random_floats(n * stride, 70 + n);
      std::vector<uint16_t> rows(rows_f.size());
      for (size_t i = 0; i < rows.size(); ++i)
        rows[i] = float_to_bf16(rows_f[i]);
      const auto p = random_floats(n, 80 + n);
      for (Isa isa : available_isas()) {
        ScopedIsa scoped(isa);
        const internal::KernelTable& t = internal::active_table();
        std::vector<float> scores(n);
        t.dot_rows_bf16(q.data(), rows.data(), stride, n, dim, 0.125f, scores.data());
        std::vector<float> y1(q), y2(q);
        t.axpy_rows_bf16(p.data(), rows.data(), stride, n, dim, y1.data());
        for (int j = 0; j < n; ++j) {
          EXPECT_NEAR(scores[j], 0.125f * t.dot_bf16(q.data(), rows.data() + j * stride, dim), 1e-5)
              << isa_name(isa) << " dim " << dim << " row " << j;
          t.axpy_bf16(p[j], rows.data() + j * stride, y2.data(), dim);
        }
        for (int64_t i = 0; i < dim; ++i)
          ASSERT_NEAR(y1[i], y2[i], 1e-5) << isa_name(isa) << " dim " << dim << " i " << i;
      }
    }
  }
}

TEST(KvCacheLayoutTest, Sizes) {
  KvCacheLayout layout{24, 16, 2, 64};
  EXPECT_EQ(layout.head_row_bytes(), 4 * 64);
  EXPECT_EQ(layout.layer_part_bytes(), 4 * 16 * 2 * 64);
  EXPECT_EQ(layout.block_num_bytes(), 4 * 2 * 24 * 16 * 2 * 64);
  layout.dtype = KvDtype::kBf16;
  EXPECT_EQ(layout.block_num_bytes(), 2 * 2 * 24 * 16 * 2 * 64);
  layout.dtype = KvDtype::kF16;
  EXPECT_EQ(layout.block_num_bytes(), 2 * 2 * 24 * 16 * 2 * 64);
  layout.dtype = KvDtype::kFp8E4m3;
  EXPECT_EQ(layout.block_num_bytes(), 2 * 24 * 16 * 2 * 64);
  layout.dtype = KvDtype::kQ8_0;
  EXPECT_EQ(layout.head_row_bytes(), 2 * 34);
  EXPECT_EQ(layout.block_num_bytes(), 2 * 24 * 16 * 2 * 2 * 34);
}

}  // namespace
}  // namespace crescent::kernels
