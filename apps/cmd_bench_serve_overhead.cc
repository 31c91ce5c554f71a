// `crescent bench serve-overhead`: the OpenAI server's cost, as HTTP streamed tokens/s over
// the engine's own tokens/s in the same run, on the same model and prompts.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "apps/command.h"
#include "apps/flags.h"
#include "apps/model_flags.h"
#include "core/clock.h"
#include "net/http/http_client.h"
#include "server/engine_loop_client.h"
#include "server/openai_server.h"

namespace crescent::apps {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab) {
  std::uniform_int_distribution<int32_t> dist(0, std::max(1, vocab - 1024) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(len));
  for (auto& id : ids) {
    id = dist(rng);
  }
  return ids;
}

// Runs `concurrency` requests of max_tokens each straight on the engine; returns tokens/s.
Result<double> engine_tokens_per_s(server::EngineClient& engine,
                                   std::vector<std::vector<int32_t>> prompts, int max_tokens,
                                   int* id) {
  std::mutex mu;
  std::condition_variable cv;
  int num_done = 0;
  int64_t num_tokens = 0;
  auto start = SteadyClock::now();
  for (auto& prompt : prompts) {
    engine::SamplingParams s;
    s.temperature = 0;
    s.max_tokens = max_tokens;
    s.ignore_eos = true;
    RETURN_IF_ERROR(engine.submit("bench-" + std::to_string((*id)++), std::move(prompt), s, {},
                                  [&](const server::GenerationOutput& out) {
                                    std::lock_guard<std::mutex> lock(mu);
                                    num_tokens += static_cast<int64_t>(out.new_token_ids.size());
                                    if (out.finished) {
                                      ++num_done;
                                      cv.notify_all();
                                    }
                                  }));
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return num_done == static_cast<int>(prompts.size()); });
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return static_cast<double>(num_tokens) / secs;
}

// The same over HTTP: one streaming client per request; the tokens are counted by the final
// usage chunk, and every token must have come in a chunk of its own.
Result<double> http_tokens_per_s(int port, std::vector<std::vector<int32_t>> prompts,
                                 int max_tokens) {
  std::vector<std::thread> threads;
  std::vector<Status> statuses(prompts.size());
  std::vector<int64_t> counts(prompts.size(), 0);
  auto start = SteadyClock::now();
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      net::http::HttpClient client("127.0.0.1", port);
      nlohmann::json body = {{"prompt", prompts[i]}, {"max_tokens", max_tokens},
                             {"temperature", 0},     {"ignore_eos", true},
                             {"stream", true},       {"stream_options", {{"include_usage", true}}}};
      net::http::SseParser sse;
      int64_t usage = -1;
      int64_t num_chunks = 0;
      auto r = client.stream(
          "POST", "/v1/completions", body.dump(), {{"Content-Type", "application/json"}},
          [&](std::string_view data) {
            sse.feed(data, [&](std::string_view event) {
              if (event == "[DONE]") {
                return;
              }
              auto j = nlohmann::json::parse(event, nullptr, false);
              if (j.is_discarded()) {
                return;
              }
              if (!j["choices"].empty()) {
                ++num_chunks;
              }
              if (j.contains("usage") && j["usage"].is_object()) {
                usage = j["usage"]["completion_tokens"].get<int64_t>();
              }
            });
            return true;
          },
          Deadline::after_ms(600'000));
      if (!r.is_ok()) {
        statuses[i] = r.status();
      } else if (r->status != 200 || usage != max_tokens || num_chunks < max_tokens) {
        statuses[i] =
            internal_error("HTTP " + std::to_string(r->status) + ", " + std::to_string(num_chunks) +
                           " chunks, usage says " + std::to_string(usage) + " tokens");
      }
      counts[i] = usage;
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RETURN_IF_ERROR(statuses[i]);
    total += counts[i];
  }
  return static_cast<double>(total) / secs;
}

int run_bench_serve_overhead(const std::vector<std::string>& args) {
  ModelFlags model_flags;
  model_flags.threads = 2;
  std::string concurrencies = "1,32";
  int prompt_len = 32;
  int max_tokens = 64;
  int reps = 3;
  FlagParser flags(
      "crescent bench serve-overhead --model DIR|FILE [--concurrency 1,32] [--max-tokens 64]",
      "Measures tokens/s streamed over HTTP (SSE, 127.0.0.1) by the OpenAI server and the\n"
      "engine's own tokens/s on the same workload in the same run, alternating, and reports\n"
      "their ratio per concurrency (best of --reps each). Prefix caching is off so that every\n"
      "repetition computes.");
  model_flags.add_to(flags);
  flags.add("concurrency", &concurrencies, "comma-separated concurrencies");
  flags.add("prompt-len", &prompt_len, "prompt tokens per request (random ids)");
  flags.add("max-tokens", &max_tokens, "output tokens per request (ignore_eos)");
  flags.add("reps", &reps, "repetitions; the best of each side is reported");
  if (int code = flags.parse_or_exit_code(args); code >= 0) {
    return code;
  }
  model_flags.enable_prefix_caching = false;
  auto loaded_or = model_flags.load();
  if (!loaded_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", loaded_or.status().to_string().c_str());
    return 1;
  }
  auto client_or = server::EngineLoopClient::create(loaded_or->get());
  if (!client_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", client_or.status().to_string().c_str());
    return 1;
  }
  auto& engine = *client_or;
  server::OpenAiServerOptions options;
  options.http.port = 0;
  options.http.num_io_threads = 1;
  auto server_or = server::OpenAiServer::start(options);
  if (!server_or.is_ok()) {
    std::fprintf(stderr, "error: %s\n", server_or.status().to_string().c_str());
    return 1;
  }
  auto& server = *server_or;
  server->set_engine(engine.get());
  std::mt19937 rng(7);
  int vocab = engine->vocab_size();
  int id = 0;
  std::printf("model %s, %d threads, prompt %d tokens, %d output tokens per request\n",
              model_flags.model.c_str(), model_flags.threads, prompt_len, max_tokens);
  std::printf("%-12s %14s %14s %8s\n", "concurrency", "engine tok/s", "http tok/s", "ratio");
  std::stringstream list(concurrencies);
  std::string item;
  while (std::getline(list, item, ',')) {
    int c = std::atoi(item.c_str());
    if (c <= 0) {
      std::fprintf(stderr, "error: bad concurrency '%s'\n", item.c_str());
      return 2;
    }
    double best_engine = 0, best_http = 0;
    for (int r = 0; r < reps + 1; ++r) {  // r == 0 warms up
      std::vector<std::vector<int32_t>> a, b;
      for (int i = 0; i < c; ++i) {
        a.push_back(random_prompt(rng, prompt_len, vocab));
        b.push_back(random_prompt(rng, prompt_len, vocab));
      }
      auto e = engine_tokens_per_s(*engine, a, max_tokens, &id);
      auto h = http_tokens_per_s(server->port(), b, max_tokens);
      if (!e.is_ok() || !h.is_ok()) {
        std::fprintf(stderr, "error: %s\n",
                     (!e.is_ok() ? e.status() : h.status()).to_string().c_str());
        return 1;
      }
      if (r > 0) {
        best_engine = std::max(best_engine, *e);
        best_http = std::max(best_http, *h);
      }
    }
    std::printf("%-12d %14.1f %14.1f %8.3f\n", c, best_engine, best_http, best_http / best_engine);
    std::fflush(stdout);
  }
  server->stop();
  return 0;
}

}  // namespace

CRESCENT_REGISTER_COMMAND(bench_serve_overhead, "bench serve-overhead",
                          "HTTP streaming tokens/s as a fraction of the engine's own",
                          run_bench_serve_overhead)

}  // namespace crescent::apps
