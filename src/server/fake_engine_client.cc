#include "server/fake_engine_client.h"

#include <algorithm>
#include <chrono>

#include "core/fnv.h"

namespace crescent::server {
namespace {

constexpr int kBlockSize = 16;
constexpr int32_t kBosToken = 1;

int blocks_for(int num_tokens) {
  return (num_tokens + kBlockSize - 1) / kBlockSize;
}

}  // namespace

FakeEngineClient::FakeEngineClient(Options options) : options_(options) {
  metrics_.num_blocks_total = options_.num_blocks_total;
  thread_ = std::thread([this] { run(); });
}

FakeEngineClient::~FakeEngineClient() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<std::vector<int32_t>> FakeEngineClient::tokenize(std::string_view text,
                                                        bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) {
    ids.push_back(kBosToken);
  }
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string_view::npos) {
      end = text.size();
    }
    if (end > pos) {
      uint32_t h = 2166136261u;
      for (size_t i = pos; i < end; ++i) {
        h = (h ^ static_cast<unsigned char>(text[i])) * 16777619u;
      }
      ids.push_back(static_cast<int32_t>(2 + h % static_cast<uint32_t>(options_.vocab_size - 2)));
    }
    pos = end + 1;
  }
  return ids;
}

std::string FakeEngineClient::token_text(int32_t token_id) const {
  return " w" + std::to_string(token_id);
}

Result<std::string> FakeEngineClient::render_chat(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_render_messages_ = messages;
    last_render_options_ = options;
  }
  // Everything that reaches the template shows in the text, so that tests see it in
  // usage.prompt_tokens.
  std::string out;
  if (options.chat_template) {
    out += "<template " + *options.chat_template + "> ";
  }
  if (!options.template_kwargs.empty()) {
    out += "<kwargs " + options.template_kwargs.dump() + "> ";
  }
  if (!options.tools.is_null()) {
    out += "<tools " + options.tools.dump() + "> ";
  }
  for (const auto& m : messages) {
    out += "<" + m.role + "> " + m.content + " ";
    if (!m.fields.empty()) {
      out += m.fields.dump() + " ";
    }
  }
  if (options.add_generation_prompt) {
    out += "<assistant>";
  }
  return out;
}

std::vector<ChatMessage> FakeEngineClient::last_render_messages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_render_messages_;
}

ChatRenderOptions FakeEngineClient::last_render_options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_render_options_;
}

int32_t FakeEngineClient::output_token(const std::vector<int32_t>& prompt, int k, int vocab_size) {
  Fnv1a64 h;
  for (int32_t t : prompt)
    h.word(static_cast<uint64_t>(t));
  h.word(static_cast<uint64_t>(k));
  return static_cast<int32_t>(2 + h.value() % static_cast<uint64_t>(vocab_size - 2));
}

Status FakeEngineClient::submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                                engine::SamplingParams sampling,
                                const SubmitOptions& submit_options, OutputCallback on_output) {
  RETURN_IF_ERROR(engine::validate(sampling, options_.vocab_size));
  if (prompt_token_ids.empty()) {
    return invalid_argument("the prompt is empty");
  }
  if (static_cast<int>(prompt_token_ids.size()) >= options_.max_model_len) {
    return invalid_argument("prompt of " + std::to_string(prompt_token_ids.size()) +
                            " tokens does not fit max_model_len " +
                            std::to_string(options_.max_model_len));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (running_.count(request_id) != 0) {
    return already_exists("request id " + request_id + " is in use");
  }
  last_submit_options_ = submit_options;
  last_sampling_ = sampling;
  Sequence seq;
  seq.prompt = std::move(prompt_token_ids);
  seq.sampling = std::move(sampling);
  seq.on_output = std::move(on_output);
  for (const auto& [word, texts] : options_.scripted_replies) {
    auto ids = tokenize(word, /*add_special_tokens=*/false);
    if (!texts.empty() && ids.is_ok() && ids->size() == 1 &&
        std::find(seq.prompt.begin(), seq.prompt.end(), (*ids)[0]) != seq.prompt.end()) {
      seq.script = &texts;
      break;
    }
  }
  metrics_.num_blocks_used += blocks_for(static_cast<int>(seq.prompt.size()));
  running_.emplace(std::move(request_id), std::move(seq));
  cv_.notify_all();
  return Status::ok();
}

void FakeEngineClient::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = running_.find(request_id);
  if (it != running_.end()) {
    it->second.aborted = true;
    cv_.notify_all();
  }
}

EngineMetrics FakeEngineClient::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineMetrics m = metrics_;
  m.num_running = static_cast<int>(running_.size());
  return m;
}

void FakeEngineClient::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !running_.empty(); });
    if (stop_) {
      return;
    }
    // One step: every running sequence gets a token (or its end).
    std::vector<std::pair<OutputCallback, GenerationOutput>> outputs;
    for (auto it = running_.begin(); it != running_.end();) {
      Sequence& seq = it->second;
      GenerationOutput out;
      out.num_prompt_tokens = static_cast<int>(seq.prompt.size());
      int old_len = static_cast<int>(seq.prompt.size()) + seq.num_output;
      if (seq.aborted) {
        out.finished = true;
        out.finish_reason = "abort";
      } else {
        if (seq.num_output == 0) {
          metrics_.num_prompt_tokens_total += static_cast<int64_t>(seq.prompt.size());
        }
        int32_t token = output_token(seq.prompt, seq.num_output, options_.vocab_size);
        ++seq.num_output;
        ++metrics_.num_generation_tokens_total;
        metrics_.num_blocks_used += blocks_for(old_len + 1) - blocks_for(old_len);
        out.new_token_ids.push_back(token);
        out.new_text =
            seq.script != nullptr ? (*seq.script)[seq.num_output - 1] : token_text(token);
        if (seq.sampling.logprobs) {
          TokenLogprobs lp;
          lp.sampled = {token, -0.5f};
          for (int i = 0; i < *seq.sampling.logprobs; ++i) {
            lp.top.push_back({i == 0 ? token : (token + i) % options_.vocab_size,
                              -0.5f - static_cast<float>(i)});
          }
          out.logprobs.push_back(std::move(lp));
        }
        bool stop_token = false;
        for (int32_t s : seq.sampling.stop_token_ids) {
          stop_token = stop_token || s == token;
        }
        if (seq.script != nullptr && seq.num_output >= static_cast<int>(seq.script->size()) &&
            seq.num_output < seq.sampling.max_tokens) {
          out.finished = true;
          out.finish_reason = "stop";
        } else if (stop_token) {
          out.finished = true;
          out.finish_reason = "stop";
          out.stop_token_id = token;
          out.new_text.clear();
        } else if (seq.num_output >= seq.sampling.max_tokens ||
                   old_len + 1 >= options_.max_model_len) {
          out.finished = true;
          out.finish_reason = "length";
        }
      }
      out.num_output_tokens = seq.num_output;
      if (out.finished) {
        metrics_.num_blocks_used -=
            blocks_for(static_cast<int>(seq.prompt.size()) + seq.num_output);
        outputs.emplace_back(std::move(seq.on_output), std::move(out));
        it = running_.erase(it);
      } else {
        outputs.emplace_back(seq.on_output, std::move(out));
        ++it;
      }
    }
    lock.unlock();
    for (auto& [callback, out] : outputs) {
      callback(out);
    }
    if (options_.step_delay_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.step_delay_us));
    }
    lock.lock();
  }
}

void FakeEngineClient::release_refused_transfer(const engine::KvTransferParams& params) {
  std::lock_guard<std::mutex> lock(mu_);
  released_transfers_.push_back(params.transfer_id);
}

std::vector<std::string> FakeEngineClient::released_transfers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return released_transfers_;
}

engine::SamplingParams FakeEngineClient::last_sampling() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_sampling_;
}

SubmitOptions FakeEngineClient::last_submit_options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_submit_options_;
}

}  // namespace crescent::server
