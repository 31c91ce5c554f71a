#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

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

void run_case(int num_kv_heads, int group, int head_dim, int block_size) {
  const int num_heads = num_kv_heads * group;
  KvCacheLayout layout{3, block_size, num_kv_heads, head_dim};
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
  std::vector<float> kv(static_cast<size_t>((num_blocks + 3) * layout.block_num_floats()), NAN);
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
  }
  // Check the layout directly: K of position p, kv head g sits at the documented offset.
  {
    const SeqData& s = seqs[1];
    const int64_t p = 13;
    const float* k = kv.data() + s.block_table[p / block_size] * layout.block_num_floats() +
                     2 * layer * layout.layer_part_floats() + (p % block_size) * row;
    ASSERT_EQ(0, std::memcmp(k, &s.k[p * row], row * sizeof(float)));
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

TEST(KvCacheLayoutTest, Sizes) {
  KvCacheLayout layout{24, 16, 2, 64};
  EXPECT_EQ(layout.layer_part_floats(), 16 * 2 * 64);
  EXPECT_EQ(layout.block_num_floats(), 2 * 24 * 16 * 2 * 64);
  EXPECT_EQ(layout.block_num_bytes(), 4 * 2 * 24 * 16 * 2 * 64);
}

}  // namespace
}  // namespace crescent::kernels
