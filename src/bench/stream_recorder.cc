#include "bench/stream_recorder.h"

#include <nlohmann/json.hpp>

namespace crescent::bench {

using json = nlohmann::json;

namespace {

std::string text_of(const json& choice, bool is_chat) {
  const json* field = nullptr;
  if (is_chat) {
    auto delta = choice.find("delta");
    if (delta != choice.end() && delta->is_object()) {
      auto content = delta->find("content");
      if (content != delta->end()) {
        field = &*content;
      }
    }
  } else {
    auto text = choice.find("text");
    if (text != choice.end()) {
      field = &*text;
    }
  }
  return field != nullptr && field->is_string() ? field->get<std::string>() : std::string();
}

// The chat stream's first chunk: {"delta": {"role": "assistant", "content": ""}} and no
// finish_reason. It is sent with the first token but is not one.
bool is_role_announcement(const json& choice) {
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object() || !delta->contains("role")) {
    return false;
  }
  auto content = delta->find("content");
  bool has_content = content != delta->end() && content->is_string() &&
                     !content->get_ref<const std::string&>().empty();
  auto finish = choice.find("finish_reason");
  bool has_finish = finish != choice.end() && !finish->is_null();
  return !has_content && !has_finish;
}

int64_t int_field(const json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

}  // namespace

StreamRecorder::StreamRecorder(bool is_chat, double start_s)
    : is_chat_(is_chat), start_s_(start_s), last_output_s_(start_s) {}

void StreamRecorder::fail(std::string message) {
  if (error_.empty()) {
    error_ = std::move(message);
  }
}

void StreamRecorder::on_event(std::string_view data, double now_s) {
  if (has_failed()) {
    return;
  }
  if (data == "[DONE]") {
    is_done_ = true;
    return;
  }
  if (is_done_) {
    return fail("event after data: [DONE]");
  }
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return fail("stream event is not a JSON object: " + std::string(data.substr(0, 200)));
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    std::string message = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                              ? (*e)["message"].get<std::string>()
                              : e->dump();
    return fail("error event in stream: " + message);
  }
  if (auto choices = j.find("choices");
      choices != j.end() && choices->is_array() && !choices->empty() && (*choices)[0].is_object()) {
    const json& choice = (*choices)[0];
    if (is_chat_ && is_role_announcement(choice)) {
      return;
    }
    if (!has_output_) {
      has_output_ = true;
      ttft_s_ = now_s - start_s_;
    } else {
      itl_s_.push_back(now_s - last_output_s_);
    }
    last_output_s_ = now_s;
    text_ += text_of(choice, is_chat_);
  }
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    output_tokens_ = int_field(*usage, "completion_tokens");
    prompt_tokens_ = int_field(*usage, "prompt_tokens");
  }
}

void StreamRecorder::finish(RequestOutput* out) const {
  out->error = error_;
  if (out->error.empty() && !has_output_) {
    out->error = "the stream ended without any output chunk";
  }
  if (out->error.empty() && !is_done_) {
    out->error = "the stream ended before data: [DONE]";
  }
  out->success = out->error.empty();
  out->ttft_s = ttft_s_;
  out->itl_s = itl_s_;
  out->latency_s = last_output_s_ - start_s_;
  out->generated_text = text_;
  out->output_tokens = output_tokens_;
  if (prompt_tokens_ >= 0) {
    out->prompt_len = prompt_tokens_;
  }
}

}  // namespace crescent::bench
