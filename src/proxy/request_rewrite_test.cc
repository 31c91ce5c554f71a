#include "proxy/request_rewrite.h"

#include <gtest/gtest.h>

#include "proxy/api_error.h"

namespace crescent::proxy {
namespace {

TEST(RequestRewriteTest, PrefillBodyAsksForOneTokenNotStreamed) {
  auto body = parse_client_body(
      R"({"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true},)"
      R"("max_tokens":64,"temperature":0})");
  ASSERT_TRUE(body.is_ok());
  EXPECT_EQ(prefill_body(*body, "xfer-1"),
            R"({"model":"m","prompt":"hi","stream":false,"max_tokens":1,"temperature":0,)"
            R"("kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,)"
            R"("transfer_id":"xfer-1"}})");
  // max_completion_tokens is set only when the client sent it.
  body = parse_client_body(R"({"messages":[],"max_completion_tokens":9})");
  ASSERT_TRUE(body.is_ok());
  EXPECT_EQ(prefill_body(*body, "t"),
            R"({"messages":[],"max_completion_tokens":1,"kv_transfer_params":)"
            R"({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"t"},)"
            R"("stream":false,"max_tokens":1})");
}

TEST(RequestRewriteTest, DecodeBodyIsTheClientsWithKvTransferParams) {
  auto body =
      parse_client_body(R"({"prompt":"hi","kv_transfer_params":{"old":true},"stream":true,"n":1})");
  ASSERT_TRUE(body.is_ok());
  PrefillSource source{.dp_rank = 1, .engine_id = "e1", .bootstrap_addr = "http://p:8998"};
  EXPECT_EQ(decode_body(*body, "xfer-9", source),
            R"({"prompt":"hi","kv_transfer_params":{"do_remote_decode":false,)"
            R"("do_remote_prefill":true,"remote_bootstrap_addr":"http://p:8998",)"
            R"("remote_engine_id":"e1","transfer_id":"xfer-9"},"stream":true,"n":1})");
}

// Tools reach both sides as the client wrote them: P renders the same prompt (its template
// shows the tools), D renders it too and parses the calls from its output.
TEST(RequestRewriteTest, ToolsAndToolChoiceReachBothSides) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",)"
      R"("properties":{"z":{},"a":{}}}}}],"tool_choice":"auto")";
  auto body = parse_client_body(R"({"messages":[{"role":"user","content":"x"}],)" + tools + "}");
  ASSERT_TRUE(body.is_ok());
  EXPECT_NE(prefill_body(*body, "t").find(tools), std::string::npos) << prefill_body(*body, "t");
  EXPECT_NE(decode_body(*body, "t", {}).find(tools), std::string::npos);
}

TEST(RequestRewriteTest, UnicodeAndNumbersSurvive) {
  auto body =
      parse_client_body(R"({"prompt":"h\u00e9 ✓","temperature":0.7,"seed":18446744073709551615})");
  ASSERT_TRUE(body.is_ok());
  std::string out = decode_body(*body, "t", {});
  EXPECT_NE(out.find("\"prompt\":\"hé ✓\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"temperature\":0.7"), std::string::npos) << out;
  EXPECT_NE(out.find("18446744073709551615"), std::string::npos) << out;
}

TEST(RequestRewriteTest, RefusesBodiesThatAreNotObjects) {
  for (const char* bad : {"", "nope", "[]", "3", "{\"a\":"}) {
    auto body = parse_client_body(bad);
    ASSERT_FALSE(body.is_ok()) << bad;
    EXPECT_EQ(body.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(RequestRewriteTest, DecodeGetsEcRefsInsteadOfPixels) {
  auto body = parse_client_body(
      R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[)"
      R"({"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"auto"}},)"
      R"({"type":"text","text":"and"},{"type":"image_url","image_url":"file:///b.png"}]},)"
      R"({"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,CC"}}]}]})");
  ASSERT_TRUE(body.is_ok());
  const Json items =
      Json::parse(R"([{"mm_hash":"h1","grid":[1,2,2]},{"mm_hash":"h2"},{"mm_hash":"h3"}])");
  Json rewritten = *body;
  ASSERT_TRUE(replace_image_urls_with_ec_refs(rewritten, items));
  EXPECT_EQ(rewritten.dump(),
            R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[)"
            R"({"type":"image_url","image_url":{"url":"ec://h1","detail":"auto"}},)"
            R"({"type":"text","text":"and"},{"type":"image_url","image_url":"ec://h2"}]},)"
            R"({"role":"user","content":[{"type":"image_url","image_url":{"url":"ec://h3"}}]}]})");
  // Anything that does not pair each image with one item leaves the body as it was.
  for (const char* bad :
       {R"([{"mm_hash":"h1"},{"mm_hash":"h2"}])",
        R"([{"mm_hash":"h1"},{"mm_hash":"h2"},{"mm_hash":"h3"},{"mm_hash":"h4"}])",
        R"([{"mm_hash":"h1"},{"mm_hash":2},{"mm_hash":"h3"}])",
        R"([{"mm_hash":"h1"},"h2",{"mm_hash":"h3"}])", R"({"mm_hash":"h1"})"}) {
    Json unchanged = *body;
    EXPECT_FALSE(replace_image_urls_with_ec_refs(unchanged, Json::parse(bad))) << bad;
    EXPECT_EQ(unchanged, *body) << bad;
  }
  auto text_only = parse_client_body(R"({"messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(text_only.is_ok());
  EXPECT_FALSE(replace_image_urls_with_ec_refs(*text_only, Json::array()));
}

TEST(RequestRewriteTest, RequestIdFromHeaderOrFresh) {
  net::http::Request request;
  auto id = request_id_for(request);
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(id->size(), 36u);
  EXPECT_NE(*id, *request_id_for(request));
  request.headers["x-request-id"] = "abc-1";
  EXPECT_EQ(*request_id_for(request), "abc-1");
  EXPECT_EQ(transfer_id_for("abc-1"), "xfer-abc-1");
  request.headers["x-request-id"] = "has space";
  EXPECT_FALSE(request_id_for(request).is_ok());
  request.headers["x-request-id"] = std::string(257, 'a');
  EXPECT_FALSE(request_id_for(request).is_ok());
  request.headers["x-request-id"] = "";
  EXPECT_FALSE(request_id_for(request).is_ok());
}

TEST(RequestRewriteTest, Headers) {
  auto p = prefill_headers("r1", 3, "Bearer k");
  EXPECT_EQ(p, (net::http::Headers{{"Authorization", "Bearer k"},
                                   {"Content-Type", "application/json"},
                                   {"X-Request-Id", "r1"},
                                   {"X-data-parallel-rank", "3"}}));
  auto d = decode_headers("r1", "");
  EXPECT_EQ(d, (net::http::Headers{{"Content-Type", "application/json"}, {"X-Request-Id", "r1"}}));
}

TEST(ApiErrorTest, OpenAiShapesInOpenAiKeyOrder) {
  EXPECT_EQ(error_body(502, "prefill \"p\" failed", error_type_for(502)),
            R"({"error":{"message":"prefill \"p\" failed","type":"upstream_error","param":null,)"
            R"("code":502}})");
  EXPECT_EQ(sse_error_events(504, "late"),
            "data: {\"error\":{\"message\":\"late\",\"type\":\"timeout\",\"param\":null,"
            "\"code\":504}}\n\ndata: [DONE]\n\n");
  EXPECT_TRUE(is_openai_error(R"({"error":{"message":"x"}})"));
  EXPECT_FALSE(is_openai_error(R"({"error":"x"})"));
  EXPECT_FALSE(is_openai_error("oops"));
  EXPECT_EQ(error_type_for(400), "invalid_request_error");
  EXPECT_EQ(error_type_for(404), "not_found_error");
  EXPECT_EQ(error_type_for(503), "service_unavailable");
}

}  // namespace
}  // namespace crescent::proxy
