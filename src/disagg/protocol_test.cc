// Pure-function tests: message encoding and validation, compat info, block-copy coalescing.

#include "disagg/protocol.h"

#include <gtest/gtest.h>

#include "disagg/block_copies.h"
#include "disagg/compat_info.h"
#include "disagg/connector_test_util.h"
#include "net/frame.h"

namespace crescent::disagg {
namespace {

TEST(CompatInfoTest, HashIsStableAndSensitiveToEveryField) {
  KvCompatInfo a = testing::test_compat();
  EXPECT_EQ(a.hash(), testing::test_compat().hash());
  std::vector<KvCompatInfo> variants(8, a);
  variants[0].model = "other";
  variants[1].dtype = "bf16";
  variants[2].num_layers = 3;
  variants[3].num_kv_heads = 4;
  variants[4].head_dim = 8;
  variants[5].block_size = 32;
  variants[6].layout = "layer:block";
  variants[7].weights = "0000000000000001 BF16";
  for (const auto& v : variants) {
    EXPECT_NE(v.hash(), a.hash());
    EXPECT_FALSE(describe_first_difference(a, v).empty());
  }
  EXPECT_EQ(describe_first_difference(a, a), "");
  EXPECT_EQ(describe_first_difference(variants[5], a), "block_size: 32 here, 16 at the peer");
  EXPECT_EQ(describe_first_difference(a, variants[1]), "dtype: \"f32\" here, \"bf16\" at the peer");
  EXPECT_EQ(describe_first_difference(variants[7], a),
            "weights: \"0000000000000001 BF16\" here, \"ffffffffffffffff BF16\" at the peer "
            "(another checkpoint or weight format of the same shape, or a crescent build that "
            "stores the weights in another layout)");
}

TEST(ProtocolTest, HelloRoundTripsAndIsValidated) {
  protocol::Hello h;
  h.compat = testing::test_compat();
  h.compat_hash = h.compat.hash();
  h.engine_id = "decode-0";
  h.segment_descriptor = "{}";
  h.region_id = 3;
  h.block_bytes = 8192;
  h.num_blocks = 10;
  h.heartbeat_interval_ms = 1000;
  auto back = protocol::decode_hello(protocol::encode(h));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->compat, h.compat);
  EXPECT_EQ(back->engine_id, "decode-0");
  EXPECT_EQ(back->num_blocks, 10u);

  std::string bytes = protocol::encode(h);
  EXPECT_FALSE(protocol::decode_hello(bytes.substr(0, bytes.size() - 1)).is_ok());
  EXPECT_FALSE(protocol::decode_hello(bytes + "x").is_ok());
  auto bad = h;
  bad.compat_hash ^= 1;
  EXPECT_FALSE(protocol::decode_hello(protocol::encode(bad)).is_ok());
  bad = h;
  bad.engine_id = "has space";
  EXPECT_FALSE(protocol::decode_hello(protocol::encode(bad)).is_ok());
  bad = h;
  bad.protocol_version = 1;
  auto r = protocol::decode_hello(protocol::encode(bad));
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("protocol version 1"), std::string::npos);
}

TEST(ProtocolTest, AskIsBoundedAndConsistent) {
  protocol::Ask a{"xfer-1", 50, 99, 1, {4, 5, 6}};
  auto back = protocol::decode_ask(protocol::encode(a));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->block_ids, a.block_ids);
  EXPECT_EQ(back->first_block, 1u);

  auto empty = a;
  empty.block_ids.clear();
  EXPECT_FALSE(protocol::decode_ask(protocol::encode(empty)).is_ok());
  auto negative = a;
  negative.block_ids[1] = -1;
  EXPECT_FALSE(protocol::decode_ask(protocol::encode(negative)).is_ok());
  auto short_prompt = a;
  short_prompt.num_prompt_tokens = 1;
  EXPECT_FALSE(protocol::decode_ask(protocol::encode(short_prompt)).is_ok());
  // A block count that claims more ids than the payload holds.
  std::string bytes = protocol::encode(a);
  EXPECT_FALSE(protocol::decode_ask(bytes.substr(0, bytes.size() - 4)).is_ok());
}

TEST(ProtocolTest, DoneCarriesStatus) {
  protocol::Done d{"xfer-1", deadline_exceeded("too slow"), 0, 12};
  auto back = protocol::decode_done(protocol::encode(d));
  ASSERT_TRUE(back.is_ok());
  EXPECT_EQ(back->status, d.status);
  EXPECT_EQ(back->write_ns, 12u);
  protocol::Done ok{"xfer-1", Status::ok(), 4096, 5};
  back = protocol::decode_done(protocol::encode(ok));
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(back->status.is_ok());
  // Status code out of range.
  net::ByteWriter w;
  w.bytes("xfer-1");
  w.u32(999);
  w.bytes("x");
  w.u64(0);
  w.u64(0);
  EXPECT_FALSE(protocol::decode_done(w.str()).is_ok());
}

TEST(ProtocolTest, BlocksToSend) {
  EXPECT_EQ(protocol::num_blocks_to_send(1, 16), 0u);
  EXPECT_EQ(protocol::num_blocks_to_send(2, 16), 1u);
  EXPECT_EQ(protocol::num_blocks_to_send(17, 16), 1u);
  EXPECT_EQ(protocol::num_blocks_to_send(18, 16), 2u);
  EXPECT_EQ(protocol::num_blocks_to_send(33, 16), 2u);
  EXPECT_NE(protocol::hash_prompt(testing::make_prompt(5, 1)),
            protocol::hash_prompt(testing::make_prompt(5, 2)));
}

TEST(BlockCopiesTest, CoalescesRunsConsecutiveOnBothSides) {
  std::vector<int32_t> src = {1, 2, 3, 7, 8, 9, 10};
  std::vector<int32_t> dst = {4, 5, 6, 20, 21, 0, 1};
  auto copies = coalesce_block_copies(src, dst);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(copies[0].src_block, 1);
  EXPECT_EQ(copies[0].dst_block, 4);
  EXPECT_EQ(copies[0].num_blocks, 3);
  EXPECT_EQ(copies[1].num_blocks, 2);
  EXPECT_EQ(copies[2].src_block, 9);
  EXPECT_EQ(copies[2].dst_block, 0);
  EXPECT_EQ(copies[2].num_blocks, 2);
  EXPECT_TRUE(coalesce_block_copies({}, {}).empty());
}

}  // namespace
}  // namespace crescent::disagg
