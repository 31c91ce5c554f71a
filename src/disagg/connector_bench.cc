// disagg_connector_bench: the KV connector end to end in one process (two connectors, real
// transports): for each transport, the time from start_remote_prefill() (the prefill engine
// already holds the blocks) to the kRemoteKvReady event, for a prompt whose KV is shaped like
// Qwen2.5-0.5B's (24 layers, 2 KV heads, head_dim 64, block 16: 384 KiB per block in float32,
// 192 KiB in bf16 or f16, 96 KiB in fp8_e4m3, 102 KiB in q8_0).
// Usage: disagg_connector_bench [num_prompt_tokens=1024] [repetitions=20] [kv dtype=float32]
// (any --kv-cache-dtype value)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "disagg/connector_test_util.h"
#include "kernels/attention.h"

namespace t = crescent::disagg::testing;
using namespace crescent;
using crescent::disagg::KvTransferConnector;

int main(int argc, char** argv) {
  int num_tokens = argc > 1 ? std::atoi(argv[1]) : 1024;
  int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  auto parsed = kernels::parse_kv_dtype(argc > 3 ? argv[3] : "float32");
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().to_string().c_str());
    return 2;
  }
  const kernels::KvCacheLayout layout{24, 16, 2, 64, *parsed};
  t::SideOptions so;
  so.compat.dtype = std::string(kernels::kv_dtype_name(*parsed));
  so.compat.num_layers = 24;
  so.compat.num_kv_heads = 2;
  so.compat.head_dim = 64;
  so.block_bytes = static_cast<uint64_t>(layout.block_num_bytes());
  int num_blocks = (num_tokens - 1 + 15) / 16;
  so.num_blocks = num_blocks;
  so.transfer_timeout = std::chrono::milliseconds(30'000);
  for (auto kind : {transfer::TransportKind::kShm, transfer::TransportKind::kTcp,
                    transfer::TransportKind::kUcx}) {
    if (!transfer::is_transport_available(kind))
      continue;
    so.transport = kind;
    t::FakeBootstrap bootstrap;
    auto p = t::FakeEngine::create("bench-prefill", nullptr, so);
    auto d = t::FakeEngine::create("bench-decode", &bootstrap, so);
    if (!p || !d)
      return 1;
    bootstrap.set("bench-prefill", p->conn().worker_addr());
    std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
    for (int i = 0; i < num_blocks; ++i) {
      blocks[static_cast<size_t>(i)] = i;
      p->fill_pattern(i, 1);
    }
    auto prompt = t::make_prompt(num_tokens);
    std::vector<double> ms;
    for (int r = 0; r < reps + 1; ++r) {
      std::string t = "bench-" + std::to_string(r);
      if (!p->conn().hold_for_remote_decode("p" + t, t::prefill_params(t), prompt, blocks))
        return 1;
      auto t0 = std::chrono::steady_clock::now();
      d->conn().start_remote_prefill("d" + t, t::decode_params(t, "bench-prefill"), prompt, blocks,
                                     0);
      auto ev = d->wait_event("d" + t, std::chrono::milliseconds(30'000));
      auto t1 = std::chrono::steady_clock::now();
      if (!ev || !ev->status.is_ok()) {
        std::fprintf(stderr, "fetch failed: %s\n", ev ? ev->status.to_string().c_str() : "none");
        return 1;
      }
      if (!p->wait_event("p" + t, std::chrono::milliseconds(30'000)))
        return 1;
      if (r > 0)  // the first one connects (HELLO, segment open)
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (std::memcmp(d->block(num_blocks - 1), p->block(num_blocks - 1), so.block_bytes) != 0) {
      std::fprintf(stderr, "bytes differ\n");
      return 1;
    }
    std::sort(ms.begin(), ms.end());
    double bytes = static_cast<double>(so.block_bytes) * num_blocks;
    double p50 = ms[ms.size() / 2];
    auto m = d->conn().metrics();
    std::vector<double> write_ms;
    for (size_t i = 1; i < m.recent_fetches.size(); ++i) {
      write_ms.push_back(m.recent_fetches[i].transfer_s * 1e3);
    }
    std::sort(write_ms.begin(), write_ms.end());
    std::printf(
        "%-4s %s %5d tokens %4d blocks %7.1f MiB  fetch p50 %7.2f ms  p90 %7.2f ms  (%.2f GB/s)  "
        "P's write p50 %.2f ms\n",
        std::string(transfer::transport_name(kind)).c_str(), so.compat.dtype.c_str(), num_tokens,
        num_blocks, bytes / (1 << 20), p50, ms[ms.size() * 9 / 10], bytes / (p50 * 1e-3) / 1e9,
        write_ms[write_ms.size() / 2]);
  }
  return 0;
}
