#pragma once
// FakeEngineClient: a deterministic EngineClient without a model, for the server's unit tests.
// Words are tokens (id = hash % vocab); request i's k-th output token is a function of its
// prompt and k, so repeated requests give the same text. It runs its own "engine" thread that
// emits one token per running request per step, counts blocks like a paged KV cache
// (block_size 16) and honours max_tokens, stop_token_ids, max_model_len and abort.

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "server/engine_client.h"

namespace crescent::server {

class FakeEngineClient : public EngineClient {
 public:
  struct Options {
    int max_model_len = 256;
    int vocab_size = 1000;
    int num_blocks_total = 1024;
    int step_delay_us = 200;
    // Scripted replies: a prompt that holds the word (a token of tokenize()) is answered with
    // these texts, one token each, and then stops (finish_reason "stop", as at an EOS). Lets
    // tests of the server drive its output parsing (tool calls) through real HTTP.
    std::vector<std::pair<std::string, std::vector<std::string>>> scripted_replies;
  };
  explicit FakeEngineClient(Options options);
  ~FakeEngineClient() override;

  int max_model_len() const override { return options_.max_model_len; }
  int vocab_size() const override { return options_.vocab_size; }
  Result<std::vector<int32_t>> tokenize(std::string_view text,
                                        bool add_special_tokens) const override;
  std::string token_text(int32_t token_id) const override;
  Result<std::string> render_chat(const std::vector<ChatMessage>& messages,
                                  const ChatRenderOptions& options) const override;
  Status submit(std::string request_id, std::vector<int32_t> prompt_token_ids,
                engine::SamplingParams sampling, const SubmitOptions& options,
                OutputCallback on_output) override;
  void abort(const std::string& request_id) override;
  void release_refused_transfer(const engine::KvTransferParams& params) override;
  EngineMetrics metrics() const override;

  // The options of the last accepted submit(), for tests of the server's parsing.
  SubmitOptions last_submit_options() const;
  engine::SamplingParams last_sampling() const;
  // The transfer ids given to release_refused_transfer(), in order.
  std::vector<std::string> released_transfers() const;
  // What the last render_chat() was given.
  std::vector<ChatMessage> last_render_messages() const;
  ChatRenderOptions last_render_options() const;

  // The token the fake produces at output position k for this prompt.
  static int32_t output_token(const std::vector<int32_t>& prompt, int k, int vocab_size);

 private:
  struct Sequence {
    std::vector<int32_t> prompt;
    engine::SamplingParams sampling;
    OutputCallback on_output;
    int num_output = 0;
    bool aborted = false;
    const std::vector<std::string>* script = nullptr;  // in options_.scripted_replies
  };
  void run();

  Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Sequence> running_;
  EngineMetrics metrics_;
  SubmitOptions last_submit_options_;
  engine::SamplingParams last_sampling_;
  std::vector<std::string> released_transfers_;
  mutable std::vector<ChatMessage> last_render_messages_;  // set by the const render_chat()
  mutable ChatRenderOptions last_render_options_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace crescent::server
