#include "bootstrap/wire.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crescent::bootstrap {
namespace {

TEST(ParseTcpAddr, AcceptsHostPortShapes) {
  auto a = parse_tcp_addr("tcp://127.0.0.1:5555");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 5555);
  auto b = parse_tcp_addr("tcp://prefill-0.example_net:65535");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->first, "prefill-0.example_net");
  auto c = parse_tcp_addr("tcp://[::1]:1");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->first, "::1");
  EXPECT_EQ(c->second, 1);
}

TEST(ParseTcpAddr, RefusesEverythingElseWithTheReason) {
  struct Case {
    std::string addr;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"", "expected tcp://host:port"},
      {"127.0.0.1:5555", "expected tcp://host:port"},
      {"http://127.0.0.1:5555", "expected tcp://host:port"},
      {"tcp://127.0.0.1", "missing ':PORT'"},
      {"tcp://:5555", "empty host"},
      {"tcp://127.0.0.1:", "1 to 5 digits"},
      {"tcp://127.0.0.1:0", "outside 1..65535"},
      {"tcp://127.0.0.1:65536", "outside 1..65535"},
      {"tcp://127.0.0.1:123456", "1 to 5 digits"},
      {"tcp://127.0.0.1:+80", "digits only"},
      {"tcp://127.0.0.1:80/x", "digits only"},
      {"tcp://a b:80", "bad character ' '"},
      {"tcp://host/x:80", "bad character '/'"},
      {"tcp://[::1:80", "unterminated '['"},
      {"tcp://[]:80", "empty IPv6 host"},
      {"tcp://[::1]80", "expected ':PORT'"},
      {"tcp://::1:80", "bad character ':'"},
  };
  for (const auto& c : cases) {
    auto r = parse_tcp_addr(c.addr);
    ASSERT_FALSE(r.is_ok()) << c.addr;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.addr;
    EXPECT_NE(r.status().message().find(c.reason), std::string::npos)
        << c.addr << " -> " << r.status().message();
    EXPECT_NE(r.status().message().find("'" + c.addr + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(ParseHttpUrl, AcceptsOptionalTrailingSlashOnly) {
  auto a = parse_http_url("http://127.0.0.1:8998");
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 8998);
  auto b = parse_http_url("http://localhost:8998/");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->first, "localhost");
  for (std::string bad : {"127.0.0.1:8998", "https://h:1", "http://h", "http://h:1/query",
                          "http://h:1//", "http://:1", "http://h:0", "tcp://h:1", ""}) {
    auto r = parse_http_url(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("bad bootstrap url '" + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(RegistrationJson, RoundTrips) {
  WorkerRegistration r{"engine-a", 2, 1, 3, "tcp://10.0.0.1:7000"};
  auto parsed = parse_registration_json(registration_json(r));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->engine_id, "engine-a");
  EXPECT_EQ(parsed->dp_rank, 2);
  EXPECT_EQ(parsed->tp_rank, 1);
  EXPECT_EQ(parsed->pp_rank, 3);
  EXPECT_EQ(parsed->addr, "tcp://10.0.0.1:7000");
}

TEST(RegistrationJson, IgnoresUnknownFields) {
  auto parsed = parse_registration_json(
      R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1","tp_size":2})");
  EXPECT_TRUE(parsed.is_ok()) << parsed.status().to_string();
}

TEST(RegistrationJson, ValidationTable) {
  const std::string long_id(kMaxEngineIdBytes + 1, 'x');
  struct Case {
    std::string body;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{", "not valid JSON"},
      {"[]", "must be a JSON object, got array"},
      {R"({"dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})", "missing field 'engine_id'"},
      {R"({"engine_id":7,"dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'engine_id' must be a string"},
      {R"({"engine_id":"","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'engine_id' must not be empty"},
      {R"({"engine_id":")" + long_id +
           R"(","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "257 bytes, more than 256"},
      {R"({"engine_id":"a\nb","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "control character"},
      {R"({"engine_id":"e","tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "missing field 'dp_rank'"},
      {R"({"engine_id":"e","dp_rank":"0","tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'dp_rank' must be an integer, got \"0\""},
      {R"({"engine_id":"e","dp_rank":0.5,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'dp_rank' must be an integer, got 0.5"},
      {R"({"engine_id":"e","dp_rank":true,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'dp_rank' must be an integer, got true"},
      {R"({"engine_id":"e","dp_rank":-1,"tp_rank":0,"pp_rank":0,"addr":"tcp://h:1"})",
       "'dp_rank' must be in 0..1023, got -1"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":1024,"pp_rank":0,"addr":"tcp://h:1"})",
       "'tp_rank' must be in 0..1023, got 1024"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":-5,"addr":"tcp://h:1"})",
       "'pp_rank' must be in 0..1023, got -5"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":18446744073709551615,"addr":"tcp://h:1"})",
       "'pp_rank' must be in 0..1023"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":0})", "missing field 'addr'"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":null})",
       "'addr' must be a string, got null"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"h:1"})",
       "field 'addr': bad address 'h:1'"},
      {R"({"engine_id":"e","dp_rank":0,"tp_rank":0,"pp_rank":0,"addr":"tcp://0.0.0.0:1"})",
       "wildcard address"},
  };
  for (const auto& c : cases) {
    auto r = parse_registration_json(c.body);
    ASSERT_FALSE(r.is_ok()) << c.body;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(r.status().message().find(c.reason), std::string::npos)
        << c.body << " -> " << r.status().message();
  }
}

TEST(QueryJson, RoundTripsTheVllmShape) {
  QueryResult table;
  table[0].engine_id = "p0";
  table[0].worker_addr[0][0] = "tcp://10.0.0.1:7000";
  table[0].worker_addr[1][0] = "tcp://10.0.0.1:7001";
  table[10].engine_id = "p10";
  table[10].worker_addr[0][0] = "tcp://10.0.0.2:7000";
  std::string text = query_json(table);
  EXPECT_NE(text.find(R"("0":{"engine_id":"p0","worker_addr":{"0":{"0":"tcp://10.0.0.1:7000"},)"
                      R"("1":{"0":"tcp://10.0.0.1:7001"}}})"),
            std::string::npos)
      << text;
  auto parsed = parse_query_json(text);
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->size(), 2u);
  EXPECT_EQ(parsed->at(10).engine_id, "p10");
  EXPECT_EQ(parsed->at(0).worker_addr.at(1).at(0), "tcp://10.0.0.1:7001");
  auto empty = parse_query_json("{}");
  ASSERT_TRUE(empty.is_ok());
  EXPECT_TRUE(empty->empty());
}

TEST(QueryJson, RefusesOtherShapesAsDataLoss) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"nope", "not valid JSON"},
      {"[]", "not a JSON object"},
      {R"({"x":{}})", "dp rank key 'x'"},
      {R"({"-1":{}})", "dp rank key '-1'"},
      {R"({"01":{}})", "dp rank key '01'"},
      {R"({"0":3})", "dp rank 0 is not an object"},
      {R"({"0":{"worker_addr":{}}})", "no string 'engine_id'"},
      {R"({"0":{"engine_id":"e"}})", "no object 'worker_addr'"},
      {R"({"0":{"engine_id":"e","worker_addr":{"a":{}}}})", "tp rank key 'a'"},
      {R"({"0":{"engine_id":"e","worker_addr":{"0":[]}}})", "tp rank 0 is not an object"},
      {R"({"0":{"engine_id":"e","worker_addr":{"0":{"0":1}}}})", "tp 0 pp 0 is not a string"},
  };
  for (const auto& [body, reason] : cases) {
    auto r = parse_query_json(body);
    ASSERT_FALSE(r.is_ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << body;
    EXPECT_NE(r.status().message().find(reason), std::string::npos)
        << body << " -> " << r.status().message();
  }
}

TEST(ErrorJson, RoundTripsAndFallsBackToTheRawBody) {
  auto e = parse_error_json(error_json("it broke", "invalid_request_error", "c1"));
  EXPECT_EQ(e.message, "it broke");
  EXPECT_EQ(e.code, "c1");
  auto raw = parse_error_json("plain text");
  EXPECT_EQ(raw.message, "plain text");
  EXPECT_EQ(raw.code, "");
}

TEST(RegistrationJson, TheEncodeRoleIsOptionalAndChecked) {
  WorkerRegistration dp{"prefill-a", 0, 0, 0, "tcp://10.0.0.1:7000"};
  // A dp rank's registration stays vLLM's: no "role".
  EXPECT_EQ(registration_json(dp).find("role"), std::string::npos);
  WorkerRegistration enc{"encode-a", 0, 0, 0, "tcp://10.0.0.1:7500"};
  enc.role = "encode";
  auto back = parse_registration_json(registration_json(enc));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->role, "encode");
  EXPECT_EQ(back->addr, enc.addr);
  // Without ranks.
  auto bare = parse_registration_json(
      R"({"engine_id":"encode-b","addr":"tcp://10.0.0.1:7501","role":"encode"})");
  ASSERT_TRUE(bare.is_ok()) << bare.status().to_string();
  EXPECT_EQ(bare->dp_rank, 0);
  // A dp rank's registration still needs its ranks; unknown roles and bad types are refused.
  EXPECT_FALSE(parse_registration_json(R"({"engine_id":"p","addr":"tcp://10.0.0.1:1"})").is_ok());
  auto role = parse_registration_json(
      R"({"engine_id":"p","addr":"tcp://10.0.0.1:1","role":"prefill","dp_rank":0,"tp_rank":0,"pp_rank":0})");
  EXPECT_EQ(role.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(role.status().message().find("role"), std::string::npos);
  EXPECT_FALSE(
      parse_registration_json(R"({"engine_id":"p","addr":"tcp://10.0.0.1:1","role":1})").is_ok());
  // The encoders' table round trips.
  EncoderTable table{{"encode-a", "tcp://10.0.0.1:7500"}, {"encode-b", "tcp://10.0.0.1:7501"}};
  auto parsed = parse_encoders_json(encoders_json(table));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(*parsed, table);
  EXPECT_EQ(parse_encoders_json(R"({"a":{"worker_addr":3}})").status().code(),
            StatusCode::kDataLoss);
}

TEST(RegistrationJson, TheLeaseIsOptionalAndChecked) {
  WorkerRegistration r{"p", 0, 0, 0, "tcp://10.0.0.1:7000"};
  // Without a lease the body stays vLLM's.
  EXPECT_EQ(registration_json(r).find("lease_ttl_s"), std::string::npos);
  r.lease_ttl_s = 2.5;
  auto back = parse_registration_json(registration_json(r));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->lease_ttl_s, 2.5);
  for (const char* ttl : {"0", "-1", "3601", "\"10\"", "true"}) {
    auto bad = parse_registration_json(
        std::string(R"({"engine_id":"p","dp_rank":0,"tp_rank":0,"pp_rank":0,)") +
        R"("addr":"tcp://10.0.0.1:1","lease_ttl_s":)" + ttl + "}");
    ASSERT_FALSE(bad.is_ok()) << ttl;
    EXPECT_NE(bad.status().message().find("field 'lease_ttl_s'"), std::string::npos)
        << bad.status().message();
  }
}

TEST(RegisteredJson, RoundTripsAndReadsVllmsAnswer) {
  Registered granted = parse_registered_json(registered_json(Registered{3, 2.0}));
  EXPECT_EQ(granted.epoch, 3u);
  EXPECT_EQ(granted.lease_ttl_s, 2.0);
  Registered vllm = parse_registered_json(R"({"status":"ok"})");
  EXPECT_EQ(vllm.epoch, 0u);
  EXPECT_EQ(vllm.lease_ttl_s, 0);
  EXPECT_EQ(registered_json(Registered{1, 0}), R"({"epoch":1,"status":"ok"})");
}

TEST(QueryJson, CarriesTheEpochWhenKnown) {
  QueryResult table;
  table[0].engine_id = "p";
  table[0].epoch = 4;
  table[0].worker_addr[0][0] = "tcp://10.0.0.1:7000";
  table[1].engine_id = "v";  // a vLLM bootstrap's entry: no epoch
  table[1].worker_addr[0][0] = "tcp://10.0.0.1:7001";
  const std::string body = query_json(table);
  EXPECT_EQ(body.find("epoch", body.find("\"1\"")), std::string::npos) << body;
  auto back = parse_query_json(body);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->at(0).epoch, 4u);
  EXPECT_EQ(back->at(1).epoch, 0u);
  EXPECT_EQ(
      parse_query_json(R"({"0":{"engine_id":"p","epoch":-1,"worker_addr":{}}})").status().code(),
      StatusCode::kDataLoss);
}

}  // namespace
}  // namespace crescent::bootstrap
