// ec_transfer_params JSON (round trip, every bad field refused by name), the EC compat
// description, and the EC control messages (round trip, truncation, bounds, versions).

#include "disagg/ec_protocol.h"

#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace crescent::disagg {
namespace {

EcTensorRef good_ref(int i) {
  EcTensorRef r;
  r.mm_hash = "0123abcd" + std::to_string(i);
  r.engine_id = "encoder-0";
  r.worker_addr = "tcp://10.0.0.5:7100";
  r.bootstrap_addr = "http://10.0.0.1:8998";
  r.reservation_id = 17 + static_cast<uint64_t>(i);
  r.shape = {256, 1536};
  r.num_bytes = 256ull * 1536 * 4;
  r.expires_at_unix_ms = 1'700'000'000'000;
  return r;
}

// Whether `message` is about `field` of the item at `where`: the presence and type checks say
// "<where>: missing field 'F'" or "<where>: field 'F' ...", the value checks "<where>.F: ...".
bool names_field(const std::string& message, const std::string& where, const std::string& field) {
  return message.starts_with(where + "." + field + ": ") ||
         message.starts_with(where + ": field '" + field + "' ") ||
         message.starts_with(where + ": missing field '" + field + "'");
}

TEST(EcTransferParamsTest, RoundTrip) {
  std::vector<EcTensorRef> refs = {good_ref(0), good_ref(1)};
  refs[1].bootstrap_addr = "";
  nlohmann::json j = ec_transfer_params_to_json(refs);
  // Through text, as the proxy forwards it.
  auto parsed = parse_ec_transfer_params(nlohmann::json::parse(j.dump()));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  ASSERT_EQ(parsed->size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const EcTensorRef& a = refs[i];
    const EcTensorRef& b = (*parsed)[i];
    EXPECT_EQ(a.mm_hash, b.mm_hash);
    EXPECT_EQ(a.engine_id, b.engine_id);
    EXPECT_EQ(a.worker_addr, b.worker_addr);
    EXPECT_EQ(a.bootstrap_addr, b.bootstrap_addr);
    EXPECT_EQ(a.reservation_id, b.reservation_id);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.num_bytes, b.num_bytes);
    EXPECT_EQ(a.expires_at_unix_ms, b.expires_at_unix_ms);
  }
  EXPECT_TRUE(parse_ec_transfer_params(nlohmann::json{{"items", nlohmann::json::array()}}).is_ok());
}

TEST(EcTransferParamsTest, LocationRoundTripsAndIsAllOrNothing) {
  EcTensorRef ref = good_ref(0);
  ref.has_location = true;
  ref.region_id = 3;
  ref.offset = 4096;
  ref.instance = kMaxEcInstance;
  ref.stamp = kMaxEcInstance - 1;
  nlohmann::json j = nlohmann::json::parse(ec_transfer_params_to_json({&ref, 1}).dump());
  auto parsed = parse_ec_transfer_params(j);
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ((*parsed)[0].stamp, kMaxEcInstance - 1);
  EXPECT_TRUE((*parsed)[0].has_location);
  EXPECT_EQ((*parsed)[0].region_id, 3);
  EXPECT_EQ((*parsed)[0].offset, 4096u);
  EXPECT_EQ((*parsed)[0].instance, kMaxEcInstance);
  // Without one (an older encoder): has_location false, and no keys written.
  EcTensorRef plain = good_ref(1);
  nlohmann::json pj = ec_transfer_params_to_json({&plain, 1});
  EXPECT_FALSE(pj["items"][0].contains("region"));
  EXPECT_FALSE(pj["items"][0].contains("stamp"));
  auto plain_parsed = parse_ec_transfer_params(pj);
  ASSERT_TRUE(plain_parsed.is_ok());
  EXPECT_FALSE((*plain_parsed)[0].has_location);

  struct Case {
    std::string field;
    std::function<void(nlohmann::json&)> mutate;
  };
  std::vector<Case> cases = {
      {"region", [](nlohmann::json& i) { i.erase("region"); }},
      {"offset", [](nlohmann::json& i) { i.erase("offset"); }},
      {"instance", [](nlohmann::json& i) { i.erase("instance"); }},
      {"region", [](nlohmann::json& i) { i["region"] = -1; }},
      {"region", [](nlohmann::json& i) { i["region"] = "3"; }},
      {"offset", [](nlohmann::json& i) { i["offset"] = 1.5; }},
      {"offset", [](nlohmann::json& i) { i["offset"] = UINT64_MAX; }},
      {"instance", [](nlohmann::json& i) { i["instance"] = 0; }},
      {"instance", [](nlohmann::json& i) { i["instance"] = kMaxEcInstance + 1; }},
      {"stamp", [](nlohmann::json& i) { i["stamp"] = 0; }},
      {"stamp", [](nlohmann::json& i) { i["stamp"] = kMaxEcInstance + 1; }},
      {"stamp", [](nlohmann::json& i) { i["stamp"] = "7"; }},
      {"stamp",
       [](nlohmann::json& i) {  // a stamp without a location
         i.erase("region");
         i.erase("offset");
         i.erase("instance");
       }},
      {"offset", [](nlohmann::json& i) { i["offset"] = 4; }},  // no room for the stamp before
  };
  for (const Case& c : cases) {
    nlohmann::json bad = j;
    c.mutate(bad["items"][0]);
    auto r = parse_ec_transfer_params(bad);
    ASSERT_FALSE(r.is_ok()) << c.field << ": " << bad.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(names_field(r.status().message(), "ec_transfer_params.items[0]", c.field))
        << c.field << ": " << r.status().to_string();
  }
}

TEST(EcProtocolTest, ReleaseWithAndWithoutLocation) {
  using namespace ec_protocol;
  auto plain = decode_release(encode(Release{7, "h"}));
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_FALSE(plain->has_location);
  Release located{7, "h", true, 42, 2, 128};
  auto back = decode_release(encode(located));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_TRUE(back->has_location);
  EXPECT_EQ(back->instance, 42u);
  EXPECT_EQ(back->region_id, 2);
  EXPECT_EQ(back->offset, 128u);
  const std::string full = encode(located);
  EXPECT_EQ(decode_release(full.substr(0, full.size() - 1)).status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(decode_release(full + "x").is_ok());
  located.instance = 0;
  EXPECT_EQ(decode_release(encode(located)).status().code(), StatusCode::kInvalidArgument);
  located.instance = 1;
  located.region_id = -1;
  EXPECT_EQ(decode_release(encode(located)).status().code(), StatusCode::kInvalidArgument);
}

TEST(EcTransferParamsTest, EachBadFieldIsRefusedByName) {
  using json = nlohmann::json;
  struct Case {
    std::string field;
    std::function<void(json&)> mutate;
  };
  std::vector<Case> cases = {
      {"mm_hash", [](json& i) { i.erase("mm_hash"); }},
      {"mm_hash", [](json& i) { i["mm_hash"] = "has space"; }},
      {"mm_hash", [](json& i) { i["mm_hash"] = 5; }},
      {"engine_id", [](json& i) { i["engine_id"] = ""; }},
      {"worker_addr", [](json& i) { i["worker_addr"] = "10.0.0.5:7100"; }},
      {"worker_addr", [](json& i) { i["worker_addr"] = "tcp://10.0.0.5:99999"; }},
      {"bootstrap_addr", [](json& i) { i["bootstrap_addr"] = "ftp://x"; }},
      {"bootstrap_addr", [](json& i) { i.erase("bootstrap_addr"); }},
      {"reservation_id", [](json& i) { i["reservation_id"] = 0; }},
      {"reservation_id", [](json& i) { i["reservation_id"] = -3; }},
      {"reservation_id", [](json& i) { i["reservation_id"] = "7"; }},
      {"shape", [](json& i) { i["shape"] = json::array({256}); }},
      {"shape",
       [](json& i) {
         i["shape"] = json::array({256, 0});
       }},
      {"shape",
       [](json& i) {
         i["shape"] = json::array({256, 1.5});
       }},
      {"shape", [](json& i) { i["shape"] = "256x1536"; }},
      {"dtype", [](json& i) { i["dtype"] = "bfloat16"; }},
      {"num_bytes", [](json& i) { i["num_bytes"] = 12; }},
      {"num_bytes", [](json& i) { i.erase("num_bytes"); }},
      {"expires_at_unix_ms", [](json& i) { i["expires_at_unix_ms"] = -1; }},
  };
  for (const Case& c : cases) {
    std::vector<EcTensorRef> refs = {good_ref(0), good_ref(1)};
    json j = ec_transfer_params_to_json(refs);
    c.mutate(j["items"][1]);
    auto parsed = parse_ec_transfer_params(j);
    ASSERT_FALSE(parsed.is_ok()) << c.field << ": " << j.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(names_field(parsed.status().message(), "ec_transfer_params.items[1]", c.field))
        << "want " << c.field << " got " << parsed.status().message();
  }
  json wrong_type = ec_transfer_params_to_json(std::vector<EcTensorRef>{good_ref(0)});
  wrong_type["items"][0]["mm_hash"] = 5;
  EXPECT_EQ(parse_ec_transfer_params(wrong_type).status().message(),
            "ec_transfer_params.items[0]: field 'mm_hash' must be a string, got 5");
  EXPECT_FALSE(parse_ec_transfer_params(json::array()).is_ok());
  EXPECT_FALSE(parse_ec_transfer_params(json{{"items", 3}}).is_ok());
  auto not_object = parse_ec_transfer_params(json{{"items", json::array({1})}});
  ASSERT_FALSE(not_object.is_ok());
  EXPECT_NE(not_object.status().message().find("items[0]"), std::string::npos);
}

TEST(EcCompatTest, DifferenceNamesBothSides) {
  EcCompat a;
  a.vision_model = "vit";
  a.hidden_size = 1024;
  EcCompat b = a;
  EXPECT_EQ(describe_ec_compat_difference(a, "here", b, "there"), "");
  b.hidden_size = 2048;
  EXPECT_EQ(describe_ec_compat_difference(a, "the prefill worker", b, "encoder E"),
            "hidden_size: 1024 at the prefill worker, 2048 at encoder E");
  b = a;
  b.preprocess_hash = "p2";
  EXPECT_EQ(describe_ec_compat_difference(a, "x", b, "y"),
            "preprocess_hash: \"\" at x, \"p2\" at y");
}

TEST(EcProtocolTest, MessagesRoundTrip) {
  namespace p = ec_protocol;
  p::Hello h;
  h.compat.vision_model = "vit";
  h.compat.hidden_size = 1536;
  h.compat.preprocess_hash = "pp";
  h.consumer_name = "prefill-0";
  h.heartbeat_interval_ms = 1000;
  auto h2 = p::decode_hello(p::encode(h));
  ASSERT_TRUE(h2.is_ok()) << h2.status().to_string();
  EXPECT_EQ(h2->compat, h.compat);
  EXPECT_EQ(h2->consumer_name, "prefill-0");

  auto ok = p::decode_hello_ok(p::encode(p::HelloOk{p::kProtocolVersion, "enc", "{}"}));
  ASSERT_TRUE(ok.is_ok());
  EXPECT_EQ(ok->engine_id, "enc");

  auto acq = p::decode_acquire(p::encode(p::Acquire{5, "hash", 4096}));
  ASSERT_TRUE(acq.is_ok());
  EXPECT_EQ(acq->reservation_id, 5u);
  EXPECT_EQ(acq->num_bytes, 4096u);

  auto got = p::decode_acquired(p::encode(p::Acquired{5, 2, 128, 4096}));
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got->offset, 128u);

  auto failed =
      p::decode_acquire_failed(p::encode(p::AcquireFailed{5, p::AcquireFailure::kExpired, "gone"}));
  ASSERT_TRUE(failed.is_ok());
  EXPECT_EQ(failed->reason, p::AcquireFailure::kExpired);

  auto rel = p::decode_release(p::encode(p::Release{5, "hash"}));
  ASSERT_TRUE(rel.is_ok());
  auto released = p::decode_released(p::encode(p::Released{5, true}));
  ASSERT_TRUE(released.is_ok());
  EXPECT_TRUE(released->was_held);

  auto refused = p::decode_refused(p::encode(p::Refused{p::RefusalKind::kCompatibility, "no"}));
  ASSERT_TRUE(refused.is_ok());
  EXPECT_EQ(refused->message, "no");
}

TEST(EcProtocolTest, BadPayloadsAreRefused) {
  namespace p = ec_protocol;
  std::string acquire = p::encode(p::Acquire{5, "hash", 4096});
  EXPECT_EQ(p::decode_acquire(acquire.substr(0, acquire.size() - 1)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(p::decode_acquire(acquire + "x").status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(p::decode_acquire(p::encode(p::Acquire{0, "hash", 4096})).is_ok());
  EXPECT_FALSE(p::decode_acquire(p::encode(p::Acquire{5, "bad hash", 4096})).is_ok());
  EXPECT_FALSE(p::decode_acquired(p::encode(p::Acquired{5, -1, 0, 4096})).is_ok());
  EXPECT_FALSE(p::decode_acquired(p::encode(p::Acquired{5, 1, ~0ull, 4096})).is_ok());
  EXPECT_FALSE(p::decode_released(p::encode(p::Released{0, true})).is_ok());

  p::Hello h;
  h.heartbeat_interval_ms = 1;
  EXPECT_FALSE(p::decode_hello(p::encode(h)).is_ok());
  h.heartbeat_interval_ms = 1000;
  h.protocol_version = 2;
  auto v = p::decode_hello(p::encode(h));
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("version 2"), std::string::npos);
  EXPECT_EQ(p::message_type_name(104), "EC_ACQUIRE");
  EXPECT_EQ(p::message_type_name(4), "message type 4");
}

}  // namespace
}  // namespace crescent::disagg
