// --api-key across a disaggregated deployment, all real processes on the tiny model: a
// `serve --role prefill` and a `--role decode` started with the workers' key, and a
// `crescent proxy` that takes the clients' key (CRESCENT_API_KEY) and the workers' key
// (CRESCENT_UPSTREAM_API_KEY) from its environment. Clients without the proxy's key get 401s;
// with it, completions work whole and streamed through P and D, and the official openai npm
// client works with apiKey. /health and /metrics stay open on every process; no process
// prints a key.

#include <gtest/gtest.h>

#include <cstdlib>

#include "disagg/pd_client.h"
#include "disagg/pd_cluster.h"
#include "net/http/http_client.h"
#include "testing/node_script.h"

namespace crescent::testing {
namespace {

constexpr const char* kClientKey = "sk-client-4f1d2c";
constexpr const char* kWorkerKey = "sk-worker-9b7e35";

net::http::Headers bearer(const std::string& key) {
  return {{"Authorization", "Bearer " + key}};
}

int get_status(int port, const std::string& path, const net::http::Headers& headers = {}) {
  net::http::HttpClient client("127.0.0.1", port);
  auto r = client.request("GET", path, "", headers, Deadline::after_ms(20'000));
  return r.is_ok() ? r->status : 0;
}

TEST(PdApiKeyTest, KeysOnProxyPrefillAndDecode) {
  require_node_and_openai();

  ServeSpec spec;
  spec.kv_transfer_timeout_s = 20;
  spec.extra_args = {"--api-key", kWorkerKey};
  auto pd = start_pd(spec, spec, /*with_proxy=*/false);  // waited on the open /health
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();

  // The workers themselves refuse requests without their key, before any KV work starts.
  for (int port : {pd->prefill.port, pd->decode.port}) {
    Reply r = send(port, "/v1/completions", completion("hello", 2));
    EXPECT_EQ(r.status, 401) << r.describe();
    EXPECT_EQ(r.error["code"], 401) << r.describe();
    EXPECT_EQ(get_status(port, "/v1/models"), 401);
    EXPECT_EQ(get_status(port, "/v1/models", bearer(kWorkerKey)), 200);
    EXPECT_EQ(get_status(port, "/metrics"), 200);
    EXPECT_EQ(get_status(port, "/health"), 200);
  }

  ::setenv("CRESCENT_API_KEY", kClientKey, 1);
  ::setenv("CRESCENT_UPSTREAM_API_KEY", kWorkerKey, 1);
  auto proxy = start_proxy(pd->prefill, pd->decode);
  ::unsetenv("CRESCENT_API_KEY");
  ::unsetenv("CRESCENT_UPSTREAM_API_KEY");
  ASSERT_TRUE(proxy.is_ok()) << proxy.status().to_string() << pd->outputs();
  pd->proxy = std::move(proxy).value();
  const int port = pd->proxy.port;

  for (const net::http::Headers& wrong : {net::http::Headers{}, bearer(kWorkerKey),
                                          net::http::Headers{{"Authorization", kClientKey}}}) {
    SendOptions o;
    o.headers = wrong;
    Reply r = send(port, "/v1/completions", completion("hello", 2), o);
    EXPECT_EQ(r.status, 401) << r.describe();
    EXPECT_EQ(r.error["type"], "authentication_error") << r.describe();
  }
  EXPECT_EQ(get_status(port, "/v1/models"), 401);
  EXPECT_EQ(get_status(port, "/health"), 200);
  EXPECT_EQ(get_status(port, "/metrics"), 200);

  SendOptions with_key;
  with_key.headers = bearer(kClientKey);
  for (bool stream : {false, true}) {
    Reply r = send(port, "/v1/completions", completion("The quick brown fox", 6, stream), with_key);
    EXPECT_TRUE(r.is_ok()) << r.describe() << "\n" << pd->outputs();
    EXPECT_EQ(r.usage_of("completion_tokens"), 6) << r.describe();
  }
  EXPECT_EQ(get_status(port, "/v1/models", bearer(kClientKey)), 200);
  // The KV really moved from P to D (not a local prefill on D).
  std::string error;
  auto metrics = read_metrics(pd->decode.port, &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_GE(metric_sum(metrics, "crescent_kv_transfer_transfers_total",
                       {"role=\"decode\"", "result=\"ok\""}),
            2)
      << pd->outputs();

  std::string out;
  EXPECT_TRUE(run_node_script("tests/disagg/openai_api_key.mjs",
                              {pd->proxy.url() + "/v1", kModelName, kClientKey},
                              "openai api key: ok", &out))
      << out << pd->outputs();

  const std::string outputs = pd->outputs();
  EXPECT_EQ(outputs.find(kClientKey), std::string::npos) << outputs;
  EXPECT_EQ(outputs.find(kWorkerKey), std::string::npos) << outputs;
  EXPECT_EQ(pd->stop_all(), "");
}

// Without --upstream-api-key the proxy passes the client's header on: one key for clients and
// workers works, a proxy without any key in front of keyed workers does not answer 200.
TEST(PdApiKeyTest, OneKeyPassesThroughAProxyWithoutKeys) {
  ServeSpec spec;
  spec.kv_transfer_timeout_s = 20;
  spec.extra_args = {"--api-key", kWorkerKey};
  auto pd = start_pd(spec, spec, /*with_proxy=*/true);
  ASSERT_TRUE(pd.is_ok()) << pd.status().to_string();
  SendOptions with_key;
  with_key.headers = bearer(kWorkerKey);
  Reply ok = send(pd->proxy.port, "/v1/completions", completion("hello", 3), with_key);
  EXPECT_TRUE(ok.is_ok()) << ok.describe() << "\n" << pd->outputs();
  Reply refused = send(pd->proxy.port, "/v1/completions", completion("hello", 3));
  EXPECT_NE(refused.status, 200) << refused.describe();
  EXPECT_NE(refused.error_message.find("API key"), std::string::npos) << refused.describe();
  // P's half was refused too: nothing holds blocks.
  EXPECT_EQ(wait_blocks_used(pd->prefill.port, 0, Deadline::after_ms(5000)), 0);
  EXPECT_EQ(pd->stop_all(), "");
}

}  // namespace
}  // namespace crescent::testing
