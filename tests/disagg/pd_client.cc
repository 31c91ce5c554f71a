#include "disagg/pd_client.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <sstream>
#include <thread>

#include "disagg/pd_cluster.h"
#include "net/http/http_client.h"

namespace crescent::testing {
namespace {

using net::http::HttpClient;

// Best minus second-best of a list of logprobs (infinity with fewer than two).
double margin_of(std::vector<double> v) {
  if (v.size() < 2) {
    return std::numeric_limits<double>::infinity();
  }
  std::sort(v.rbegin(), v.rend());
  return v[0] - v[1];
}

// Adds one choice's text, logprobs and finish reason (whole or chunk shape) to *reply.
void take_choice(const json& c, Reply* reply) {
  if (c.contains("text") && c["text"].is_string()) {
    reply->text += c["text"].get<std::string>();
  } else if (c.contains("message") && c["message"].is_object() &&
             c["message"]["content"].is_string()) {
    reply->text += c["message"]["content"].get<std::string>();
  } else if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
             c["delta"]["content"].is_string()) {
    reply->text += c["delta"]["content"].get<std::string>();
  }
  if (c.contains("logprobs") && c["logprobs"].is_object()) {
    const json& lp = c["logprobs"];
    if (lp.contains("content") && lp["content"].is_array()) {
      for (const auto& t : lp["content"]) {
        reply->tokens.push_back(t.value("token", ""));
        reply->logprobs.push_back(t.value("logprob", 0.0));
        std::vector<double> top;
        if (t.contains("top_logprobs") && t["top_logprobs"].is_array()) {
          for (const auto& e : t["top_logprobs"]) {
            top.push_back(e.value("logprob", 0.0));
          }
        }
        reply->margins.push_back(margin_of(std::move(top)));
      }
    } else if (lp.contains("tokens") && lp["tokens"].is_array()) {
      for (const auto& t : lp["tokens"]) {
        reply->tokens.push_back(t.is_string() ? t.get<std::string>() : t.dump());
      }
      for (const auto& v : lp["token_logprobs"]) {
        reply->logprobs.push_back(v.is_number() ? v.get<double>() : 0.0);
      }
      if (lp.contains("top_logprobs") && lp["top_logprobs"].is_array()) {
        for (const auto& t : lp["top_logprobs"]) {
          std::vector<double> top;
          for (const auto& [k, v] : t.items()) {
            top.push_back(v.is_number() ? v.get<double>() : 0.0);
          }
          reply->margins.push_back(margin_of(std::move(top)));
        }
      }
    }
  }
  if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
    reply->finish_reason = c["finish_reason"];
  }
}

void take_error(const json& j, Reply* reply) {
  if (j.is_object() && j.contains("error")) {
    reply->error = j["error"];
    if (reply->error.is_object() && reply->error.contains("message") &&
        reply->error["message"].is_string()) {
      reply->error_message = reply->error["message"];
    } else {
      reply->error_message = reply->error.dump();
    }
    if (reply->error_message.empty()) {
      reply->error_message = "(empty error message)";
    }
  }
}

}  // namespace

int Reply::usage_of(const std::string& field) const {
  if (!usage.is_object() || !usage.contains(field) || !usage[field].is_number_integer()) {
    return -1;
  }
  return usage[field].get<int>();
}

bool Reply::is_ok() const {
  return status == 200 && error_message.empty() && transport_error.empty() && (!streamed || done);
}

std::string Reply::describe() const {
  std::ostringstream s;
  s << "status " << status;
  if (!transport_error.empty()) {
    s << " transport error: " << transport_error;
  }
  if (!error_message.empty()) {
    s << " error: " << error_message;
  }
  s << (streamed ? " (streamed" : " (whole") << (done ? ", [DONE])" : ")");
  s << " after " << seconds << " s";
  std::string r = raw.size() > 600 ? raw.substr(0, 600) + "..." : raw;
  s << " body: " << r;
  return s.str();
}

json completion(const std::string& prompt, int max_tokens, bool stream) {
  json body = {{"model", kModelName},
               {"prompt", prompt},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"ignore_eos", true}};
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  return body;
}

Reply send(int port, const std::string& path, const json& body, const SendOptions& options) {
  Reply reply;
  reply.streamed = body.value("stream", false);
  net::http::Headers headers = options.headers;
  headers["Content-Type"] = "application/json";
  HttpClient client("127.0.0.1", port);
  auto start = std::chrono::steady_clock::now();
  auto deadline = Deadline::after_ms(options.timeout_ms);
  if (!reply.streamed) {
    auto r = client.request("POST", path, body.dump(), headers, deadline);
    reply.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!r.is_ok()) {
      reply.transport_error = r.status().to_string();
      return reply;
    }
    reply.status = r->status;
    reply.raw = r->body;
    json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded()) {
      reply.error_message = reply.status == 200 ? "" : "(body is not JSON)";
      if (reply.status == 200) {
        reply.transport_error = "200 with a body that is not JSON";
      }
      return reply;
    }
    take_error(j, &reply);
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      take_choice(j["choices"][0], &reply);
    }
    if (j.contains("usage")) {
      reply.usage = j["usage"];
    }
    return reply;
  }
  net::http::SseParser sse;
  int num_pieces = 0;
  bool bad_event = false;
  auto r = client.stream(
      "POST", path, body.dump(), headers,
      [&](std::string_view data) {
        reply.raw.append(data);
        sse.feed(data, [&](std::string_view e) {
          if (e == "[DONE]") {
            reply.done = true;
            return;
          }
          json j = json::parse(e, nullptr, false);
          if (j.is_discarded()) {
            bad_event = true;
            return;
          }
          take_error(j, &reply);
          if (j.contains("usage") && j["usage"].is_object()) {
            reply.usage = j["usage"];
          }
          if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
            ++reply.num_chunks;
            take_choice(j["choices"][0], &reply);
          }
        });
        ++num_pieces;
        if (options.on_piece) {
          options.on_piece();
        }
        return options.disconnect_after_pieces == 0 || num_pieces < options.disconnect_after_pieces;
      },
      deadline);
  reply.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!r.is_ok()) {
    reply.transport_error = r.status().to_string();
    return reply;
  }
  reply.status = r->status;
  if (reply.status != 200) {
    // An error answered before the stream began: a JSON body, not events.
    take_error(json::parse(reply.raw, nullptr, false), &reply);
    if (reply.error_message.empty()) {
      reply.error_message = "(status " + std::to_string(reply.status) + " without an error body)";
    }
  }
  if (bad_event) {
    reply.transport_error = "an SSE event that is not JSON";
  }
  return reply;
}

json prefill_params(const std::string& transfer_id) {
  return {{"do_remote_decode", true}, {"do_remote_prefill", false}, {"transfer_id", transfer_id}};
}

json decode_params(const std::string& transfer_id, const std::string& bootstrap_url,
                   const std::string& engine_id) {
  return {{"do_remote_decode", false},
          {"do_remote_prefill", true},
          {"remote_bootstrap_addr", bootstrap_url},
          {"remote_engine_id", engine_id},
          {"transfer_id", transfer_id}};
}

json prefill_body(json body, const std::string& transfer_id) {
  body["max_tokens"] = 1;
  if (body.contains("max_completion_tokens")) {
    body["max_completion_tokens"] = 1;
  }
  body["stream"] = false;
  body.erase("stream_options");
  body["kv_transfer_params"] = prefill_params(transfer_id);
  return body;
}

json decode_body(json body, const std::string& transfer_id, const std::string& bootstrap_url,
                 const std::string& engine_id) {
  body["kv_transfer_params"] = decode_params(transfer_id, bootstrap_url, engine_id);
  return body;
}

std::string query_engine_id(const std::string& bootstrap_url, std::string* error) {
  const std::string prefix = "http://127.0.0.1:";
  if (bootstrap_url.rfind(prefix, 0) != 0) {
    *error = "not a 127.0.0.1 url: " + bootstrap_url;
    return "";
  }
  HttpClient client("127.0.0.1", std::stoi(bootstrap_url.substr(prefix.size())));
  auto r = client.request("GET", "/query", "", {}, Deadline::after_ms(5000));
  if (!r.is_ok()) {
    *error = r.status().to_string();
    return "";
  }
  json j = json::parse(r->body, nullptr, false);
  if (r->status != 200 || !j.is_object() || !j.contains("0") || !j["0"].is_object() ||
      !j["0"].contains("engine_id") || !j["0"]["engine_id"].is_string()) {
    *error = "GET /query answered " + std::to_string(r->status) + ": " + r->body;
    return "";
  }
  return j["0"]["engine_id"];
}

std::map<std::string, double> read_metrics(int port, std::string* error) {
  std::map<std::string, double> samples;
  HttpClient client("127.0.0.1", port);
  auto r = client.request("GET", "/metrics", "", {}, Deadline::after_ms(5000));
  if (!r.is_ok() || r->status != 200) {
    if (error != nullptr) {
      *error = r.is_ok() ? "status " + std::to_string(r->status) : r.status().to_string();
    }
    return samples;
  }
  std::istringstream lines(r->body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    auto space = line.rfind(' ');
    if (space == std::string::npos) {
      continue;
    }
    try {
      samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
    } catch (const std::exception&) {
      if (error != nullptr) {
        *error = "unparsable metrics line: " + line;
      }
    }
  }
  return samples;
}

double metric_sum(const std::map<std::string, double>& metrics, const std::string& name,
                  const std::vector<std::string>& label_filters) {
  double sum = 0;
  for (const auto& [key, value] : metrics) {
    auto brace = key.find('{');
    if (key.substr(0, brace) != name) {
      continue;
    }
    std::string labels = brace == std::string::npos ? "" : key.substr(brace);
    bool match = true;
    for (const auto& f : label_filters) {
      match = match && labels.find(f) != std::string::npos;
    }
    if (match) {
      sum += value;
    }
  }
  return sum;
}

double wait_metric_at_least(int port, const std::string& name,
                            const std::vector<std::string>& label_filters, double value,
                            Deadline deadline) {
  double v = metric_sum(read_metrics(port), name, label_filters);
  while (v < value && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = metric_sum(read_metrics(port), name, label_filters);
  }
  return v;
}

double blocks_used(int port) {
  std::string error;
  auto m = read_metrics(port, &error);
  if (m.empty()) {
    return -1;
  }
  return metric_sum(m, "crescent_kv_cache_blocks_used");
}

double wait_blocks_used(int port, double expected, Deadline deadline) {
  double v = blocks_used(port);
  while (v != expected && !deadline.is_expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = blocks_used(port);
  }
  return v;
}

}  // namespace crescent::testing
