#pragma once
// Helpers shared by the EPD multi-process tests (tests/epd): images as data URLs, chat bodies,
// one-shot HTTP calls to a process on 127.0.0.1, samples of /metrics, the comparison of two
// greedy answers (text, tokens, logprobs and top logprobs), and the serve flags of the tiny
// Qwen2-VL model. Every call is bounded by a deadline; failures are gtest failures.

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/clock.h"

namespace crescent::testing {

using json = nlohmann::json;

// A deterministic RGB picture of width x height (a gradient shaped by seed) as a data URL:
// PNG (lossless; `png_level` is zlib's level, so two levels give different bytes of the same
// pixels) or JPEG of quality 90.
std::string png_data_url(int width, int height, int seed, int png_level = -1);
std::string jpeg_data_url(int width, int height, int seed);

// A chat request with `text` and one image part per URL, greedy, ignore_eos, with logprobs and
// 3 top logprobs per token.
json chat_body_of_urls(const std::vector<std::string>& urls, const std::string& text,
                       int max_tokens = 8);

struct Reply {
  int status = 0;  // 0: no HTTP answer (connection refused, reset, deadline)
  json body;
  std::string error;  // the client's error when status is 0
  double seconds = 0;
};

// POST JSON to 127.0.0.1:port; a transport failure is status 0 (not a test failure) so that
// fault tests can expect one.
Reply post_json(int port, const json& body, const std::string& path = "/v1/chat/completions",
                std::chrono::milliseconds timeout = std::chrono::milliseconds(90'000));
// GET; *status (optional) is 0 on a transport failure.
std::string http_get(int port, const std::string& path, int* status = nullptr);

// The first sample of `name` (the whole name before the labels) in /metrics; NaN (and a test
// failure) when absent.
double metric(int port, const std::string& name);
// Polls until metric(port, name) == value or `timeout` passes; returns the last value read.
double wait_for_metric(int port, const std::string& name, double value,
                       std::chrono::milliseconds timeout);

// Polls GET /health until it answers 200 (a proxy answers 503 until it has polled every
// upstream; a loaded machine can take seconds). A test failure naming `what`, with the last
// answer, when `timeout` passes first.
void wait_until_healthy(int port, const std::string& what,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000));

std::string text_of(const Reply& r);

// The answers are 200 with the same text, tokens and top logprobs (logprobs within tolerance).
void expect_same_answer(const Reply& got, const Reply& want, const std::string& what,
                        double tolerance = 1e-4);
// The same text and sampled tokens, their logprobs within tolerance; top logprobs unchecked
// (where two of them are nearly tied, rounding may swap them).
void expect_same_tokens(const Reply& got, const Reply& want, const std::string& what,
                        double tolerance);

int free_port();
std::string url_of(int port);

// `crescent serve` flags for the tiny Qwen2-VL model (made once per build tree), 2 threads,
// followed by `more`.
std::vector<std::string> model_args(std::vector<std::string> more);

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace crescent::testing
