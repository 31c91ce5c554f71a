#include "proxy/proxy_options.h"

#include <gtest/gtest.h>

namespace crescent::proxy {
namespace {

TEST(UpstreamUrlTest, ParsesHostAndPort) {
  auto u = parse_upstream_url("http://10.0.0.1:8010");
  ASSERT_TRUE(u.is_ok()) << u.status().to_string();
  EXPECT_EQ(u->host, "10.0.0.1");
  EXPECT_EQ(u->port, 8010);
  EXPECT_EQ(u->url, "http://10.0.0.1:8010");

  u = parse_upstream_url("HTTP://prefill-1.local/");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->host, "prefill-1.local");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->url, "HTTP://prefill-1.local");

  u = parse_upstream_url("http://[::1]:9000");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->host_port(), "[::1]:9000");
}

TEST(UpstreamUrlTest, RefusesWhatItCannotReach) {
  struct Case {
    const char* url;
    const char* why;
  };
  for (const Case& c :
       {Case{"https://h:1", "https"}, Case{"h:8000", "http://"}, Case{"http://h:8000/v1", "path"},
        Case{"http://:8000", "no host"}, Case{"http://h:", "empty port"},
        Case{"http://h:0", "port"}, Case{"http://h:65536", "port"}, Case{"http://h:80x", "port"},
        Case{"http://::1:80", "brackets"}, Case{"http://h h:1", "host"},
        Case{"http://[::1", "']'"}}) {
    auto u = parse_upstream_url(c.url);
    ASSERT_FALSE(u.is_ok()) << c.url;
    EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(u.status().message().find(c.why), std::string::npos)
        << c.url << ": " << u.status().message();
    EXPECT_NE(u.status().message().find(c.url), std::string::npos) << u.status().message();
  }
}

TEST(ProxyArgsTest, ReadsTheReferenceProxyFlags) {
  auto parsed = parse_proxy_args(
      {"--host", "0.0.0.0", "--port", "9000", "--prefill", "http://p1:8010", "9001", "--prefill",
       "http://p2:8010", "--prefill=http://p3:8010", "NONE", "--decode", "http://d1:8020",
       "--decode=http://d2:8020", "--request-timeout", "2.5", "--io-threads", "4"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const ProxyOptions& o = parsed->options;
  EXPECT_FALSE(parsed->help_requested);
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_EQ(o.port, 9000);
  ASSERT_EQ(o.prefills.size(), 3u);
  EXPECT_EQ(o.prefills[0].server.host, "p1");
  EXPECT_EQ(o.prefills[0].bootstrap_port, 9001);
  EXPECT_EQ(o.prefills[0].bootstrap_addr(), "http://p1:9001");
  EXPECT_EQ(o.prefills[1].bootstrap_port, kDefaultBootstrapPort);
  EXPECT_EQ(o.prefills[2].bootstrap_port, kDefaultBootstrapPort);
  ASSERT_EQ(o.decodes.size(), 2u);
  EXPECT_EQ(o.decodes[1].host, "d2");
  EXPECT_DOUBLE_EQ(o.request_timeout_s, 2.5);
  EXPECT_EQ(o.num_io_threads, 4);
}

TEST(ProxyArgsTest, EncodersAndColocatedPrefillDecodeServers) {
  auto parsed =
      parse_proxy_args({"--encode", "http://e1:8030", "--encode=http://e2:8030", "--prefill",
                        "http://p:8010", "--decode", "http://d:8020", "--encode-timeout-s", "5"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  const ProxyOptions& o = parsed->options;
  ASSERT_EQ(o.encoders.size(), 2u);
  EXPECT_FALSE(o.prefill_image_refs);
  auto refs = parse_proxy_args({"--encode", "http://e1:8030", "--prefill", "http://p:8010",
                                "--decode", "http://d:8020", "--prefill-images", "ref"});
  ASSERT_TRUE(refs.is_ok()) << refs.status().to_string();
  EXPECT_TRUE(refs->options.prefill_image_refs);
  EXPECT_EQ(o.encoders[0].url, "http://e1:8030");
  EXPECT_EQ(o.encoders[1].host, "e2");
  EXPECT_DOUBLE_EQ(o.encode_timeout_s, 5);
  EXPECT_TRUE(o.pds.empty());

  parsed = parse_proxy_args({"--encode", "http://e1:8030", "--pd", "http://pd:8000"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  ASSERT_EQ(parsed->options.pds.size(), 1u);
  EXPECT_EQ(parsed->options.pds[0].port, 8000);
  EXPECT_TRUE(parsed->options.prefills.empty());
  EXPECT_DOUBLE_EQ(parsed->options.encode_timeout_s, 60);
  EXPECT_TRUE(parse_proxy_args({"--pd", "http://pd:8000"}).is_ok());  // no encoders: a plain router
}

TEST(ProxyArgsTest, IPv6BootstrapAddressHasBrackets) {
  auto parsed = parse_proxy_args({"--prefill", "http://[fe80::1]:8010", "--decode", "http://d:1"});
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_EQ(parsed->options.prefills[0].bootstrap_addr(), "http://[fe80::1]:8998");
}

TEST(ProxyArgsTest, PrefillRegisteredInEtcd) {
  auto parsed = parse_proxy_args({"--prefill", "http://p1:8010", "etcd://10.0.0.9:2379/crescent/a/",
                                  "--decode", "http://d:1"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->options.prefills[0].bootstrap_addr(), "etcd://10.0.0.9:2379/crescent/a");
  auto bad =
      parse_proxy_args({"--prefill", "http://p1:8010", "etcd://h", "--decode", "http://d:1"});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("etcd://h"), std::string::npos) << bad.status().message();
}

TEST(ProxyArgsTest, HelpNeedsNothingElse) {
  auto parsed = parse_proxy_args({"--help"});
  ASSERT_TRUE(parsed.is_ok());
  EXPECT_TRUE(parsed->help_requested);
  EXPECT_NE(proxy_help_text().find("--prefill URL"), std::string::npos);
}

TEST(ProxyArgsTest, UsageErrorsSayWhatIsWrong) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::string p = "http://p:1";
  const std::string d = "http://d:1";
  for (const Case& c : std::vector<Case>{
           {{"--decode", d}, "--prefill"},
           {{"--prefill", p}, "--decode"},
           {{}, "--prefill"},
           {{"--prefill", p, "abc", "--decode", d}, "'abc'"},
           {{"--prefill", p, "0", "--decode", d}, "bootstrap port"},
           {{"--prefill", p, "70000", "--decode", d}, "bootstrap port"},
           {{"--prefill", "ftp://p:1", "--decode", d}, "ftp://p:1"},
           {{"--prefill", p, "--decode", "d:1"}, "d:1"},
           {{"--prefill", p, "--decode", d, "--port", "-1"}, "--port"},
           {{"--prefill", p, "--decode", d, "--port"}, "needs a value"},
           {{"--prefill", p, "--decode", d, "--request-timeout", "0"}, "--request-timeout"},
           {{"--prefill", p, "--decode", d, "--request-timeout", "x"}, "--request-timeout"},
           {{"--prefill", p, "--decode", d, "--io-threads", "0"}, "--io-threads"},
           {{"--prefill", p, "--decode", d, "--bogus", "1"}, "--bogus"},
           {{"--prefill", p, "9000", "9001", "--decode", d}, "'9001'"},
           {{"--prefill"}, "needs a value"},
           {{"--prefill", p, "--decode", d, "--encode", "e:1"}, "e:1"},
           {{"--prefill", p, "--decode", d, "--encode-timeout-s", "0"}, "--encode-timeout-s"},
           {{"--prefill", p, "--decode", d, "--prefill-images", "none"}, "'full' or 'ref'"},
           {{"--pd", "http://pd:1", "--decode", d}, "--pd"},
           {{"--pd", "http://pd:1", "--prefill", p}, "--pd"},
           {{"--encode", "http://e:1"}, "--prefill"},
           {{"--prefill", p, "--decode", d, "--api-key="}, "--api-key: the API key is empty"},
           {{"--prefill", p, "--decode", d, "--api-key", "a b"}, "--api-key: "},
           {{"--prefill", p, "--decode", d, "--upstream-api-key"}, "needs a value"},
           {{"--prefill", p, "--decode", d, "--upstream-api-key", "k\x01"}, "visible ASCII"},
       }) {
    auto parsed = parse_proxy_args(c.args);
    ASSERT_FALSE(parsed.is_ok()) << c.message;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << parsed.status().message();
  }
}

TEST(ProxyOptionsTest, ApiKeys) {
  auto parsed = parse_proxy_args({"--prefill", "http://p:1", "--decode", "http://d:1", "--api-key",
                                  "sk-client", "--upstream-api-key=sk-workers"});
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->options.api_key, "sk-client");
  EXPECT_EQ(parsed->options.upstream_api_key, "sk-workers");
  auto none = parse_proxy_args({"--prefill", "http://p:1", "--decode", "http://d:1"});
  ASSERT_TRUE(none.is_ok());
  EXPECT_TRUE(none->options.api_key.empty());
  EXPECT_TRUE(none->options.upstream_api_key.empty());
  EXPECT_NE(proxy_help_text().find("--upstream-api-key KEY"), std::string::npos);
}

TEST(ProxyArgsTest, RouterFlags) {
  const std::vector<std::string> base = {"--prefill", "http://p:1", "--decode", "http://d:2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return parse_proxy_args(args);
  };
  auto def = with({});
  ASSERT_TRUE(def.is_ok());
  EXPECT_FALSE(def->options.kv_aware_router);
  auto kv =
      with({"--router", "kv_aware", "--router-overlap-weight", "2.5", "--router-load-weight=0",
            "--router-poll-interval-ms", "50", "--router-max-index-entries", "1000"});
  ASSERT_TRUE(kv.is_ok()) << kv.status().to_string();
  EXPECT_TRUE(kv->options.kv_aware_router);
  EXPECT_EQ(kv->options.router_overlap_weight, 2.5);
  EXPECT_EQ(kv->options.router_load_weight, 0);
  EXPECT_EQ(kv->options.router_poll_interval_ms, 50);
  EXPECT_EQ(kv->options.router_max_index_entries, 1000u);
  EXPECT_TRUE(with({"--router", "round_robin"}).is_ok());
  for (const auto& bad : std::vector<std::vector<std::string>>{
           {"--router", "random"},
           {"--router", "kv_aware", "--router-load-weight", "-1"},
           {"--router", "kv_aware", "--router-poll-interval-ms", "0"},
           {"--router-overlap-weight", "2"}}) {
    auto r = with(bad);
    ASSERT_FALSE(r.is_ok()) << bad[0] << " " << bad[1];
    EXPECT_NE(r.status().message().find("--router"), std::string::npos) << r.status().message();
  }
  auto pd = parse_proxy_args({"--pd", "http://x:1", "--router", "kv_aware"});
  ASSERT_FALSE(pd.is_ok());
  EXPECT_NE(pd.status().message().find("--pd"), std::string::npos);
}

TEST(ProxyArgsTest, DiscoverMakesStaticServersOptional) {
  auto only = parse_proxy_args({"--discover", "etcd://10.0.0.9:2379/c1"});
  ASSERT_TRUE(only.is_ok()) << only.status().to_string();
  EXPECT_EQ(only->options.discover_url, "etcd://10.0.0.9:2379/c1");
  EXPECT_TRUE(only->options.prefills.empty());
  auto mixed =
      parse_proxy_args({"--discover", "etcd://h:2379/c1", "--decode", "http://10.0.0.2:8020"});
  ASSERT_TRUE(mixed.is_ok()) << mixed.status().to_string();
  EXPECT_EQ(mixed->options.decodes.size(), 1u);
  auto http = parse_proxy_args({"--discover", "http://h:2379"});
  ASSERT_FALSE(http.is_ok());
  EXPECT_NE(http.status().message().find("--discover"), std::string::npos);
  auto pd = parse_proxy_args({"--discover", "etcd://h:2379/c", "--pd", "http://h:1"});
  ASSERT_FALSE(pd.is_ok());
  EXPECT_NE(pd.status().message().find("--pd"), std::string::npos);
  auto kv = parse_proxy_args({"--discover", "etcd://h:2379/c", "--router", "kv_aware"});
  ASSERT_FALSE(kv.is_ok());
  EXPECT_NE(kv.status().message().find("kv_aware"), std::string::npos);
  EXPECT_NE(proxy_help_text().find("--discover URL"), std::string::npos);
}

}  // namespace
}  // namespace crescent::proxy
