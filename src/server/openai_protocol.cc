#include "server/openai_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

#include "core/json.h"
#include "server/forced_tool_choice.h"
#include "server/guided_request.h"

namespace crescent::server {
namespace {

using json = nlohmann::json;

const char* type_name(const json& v) {
  return v.type_name();
}

ApiError wrong_type(const std::string& field, const char* expected, const json& v) {
  return bad_request("'" + field + "' must be " + expected + ", got " + type_name(v), field);
}

// Reads an optional number field; null counts as absent.
std::optional<ApiError> get_number(const json& body, const std::string& field, double* out,
                                   bool* present = nullptr) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return std::nullopt;
  }
  if (!it->is_number()) {
    return wrong_type(field, "a number", *it);
  }
  *out = it->get<double>();
  if (present != nullptr) {
    *present = true;
  }
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& body, const std::string& field, int64_t* out,
                                bool* present = nullptr) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return std::nullopt;
  }
  if (!it->is_number_integer()) {
    // 16.0 is fine, 16.5 is not.
    if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
        std::abs(it->get<double>()) < 9e15) {
      *out = static_cast<int64_t>(it->get<double>());
    } else {
      return wrong_type(field, "an integer", *it);
    }
  } else if (it->is_number_unsigned() &&
             it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return bad_request("'" + field + "' is too large", field);
  } else {
    *out = it->get<int64_t>();
  }
  if (present != nullptr) {
    *present = true;
  }
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& body, const std::string& field, bool* out) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) {
    return std::nullopt;
  }
  if (!it->is_boolean()) {
    return wrong_type(field, "a boolean", *it);
  }
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_token_ids(const json& v, const std::string& field,
                                      std::vector<int32_t>* out) {
  for (const auto& t : v) {
    if (!t.is_number_integer()) {
      return bad_request("'" + field + "' must be a string or a list of token ids", field);
    }
    int64_t id = t.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
      return bad_request("token id " + std::to_string(id) + " is out of range", field);
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

#define CRESCENT_RETURN_IF_API_ERROR(expr) \
  do {                                     \
    auto api_error_ = (expr);              \
    if (api_error_)                        \
      return api_error_;                   \
  } while (false)

std::optional<ApiError> parse_prompt(const json& body, GenerationRequest* out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    return bad_request("'prompt' is required", "prompt");
  }
  const json& p = *it;
  if (p.is_string()) {
    out->prompt_text = p.get<std::string>();
    return std::nullopt;
  }
  if (!p.is_array() || p.empty()) {
    return bad_request("'prompt' must be a string, a list of token ids, or a list of one of those",
                       "prompt");
  }
  if (p[0].is_array() || p[0].is_string()) {
    if (p.size() != 1) {
      return bad_request("only one prompt per request is supported (n=1, no batches)", "prompt");
    }
    if (p[0].is_string()) {
      out->prompt_text = p[0].get<std::string>();
      return std::nullopt;
    }
    std::vector<int32_t> ids;
    CRESCENT_RETURN_IF_API_ERROR(get_token_ids(p[0], "prompt", &ids));
    out->prompt_token_ids = std::move(ids);
    return std::nullopt;
  }
  std::vector<int32_t> ids;
  CRESCENT_RETURN_IF_API_ERROR(get_token_ids(p, "prompt", &ids));
  out->prompt_token_ids = std::move(ids);
  return std::nullopt;
}

// A client's string echoed in an error, cut short so that a huge one does not come back whole.
std::string clip(const std::string& s) {
  constexpr size_t kMaxEchoBytes = 64;
  return s.size() <= kMaxEchoBytes ? s : s.substr(0, kMaxEchoBytes) + "...";
}

// One OpenAI content part of message `message_index`: "text", or "image_url" with
// {"url": ..., "detail": ...} (or the url as a bare string, as vLLM accepts). Every other type
// (input_audio, video_url, file, refusal, ...) is refused by name.
std::optional<ApiError> parse_content_part(const json& part, int message_index,
                                           ChatMessage* message, GenerationRequest* out) {
  if (!part.is_object()) {
    return bad_request("each content part must be an object, got " + std::string(type_name(part)),
                       "messages");
  }
  auto type = part.find("type");
  if (type == part.end() || !type->is_string()) {
    return bad_request("each content part needs a string 'type'", "messages");
  }
  const std::string& type_value = type->get_ref<const std::string&>();
  if (type_value == "text") {
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return bad_request("a 'text' content part needs a string 'text'", "messages");
    }
    message->content += text->get_ref<const std::string&>();
    message->parts.push_back({false, text->get<std::string>()});
    return std::nullopt;
  }
  if (type_value == "image_url") {
    auto image = part.find("image_url");
    const json* url = nullptr;
    if (image != part.end() && image->is_string()) {
      url = &*image;
    } else if (image != part.end() && image->is_object()) {
      if (auto it = image->find("url"); it != image->end()) {
        url = &*it;
      }
      // OpenAI's resolution hint ("auto", "low", "high"); the Qwen2-VL processor sizes images
      // itself, so only its type is checked.
      if (auto it = image->find("detail");
          it != image->end() && !it->is_null() && !it->is_string()) {
        return bad_request("'image_url.detail' must be a string", "messages");
      }
    }
    if (url == nullptr || !url->is_string()) {
      return bad_request(
          R"(an 'image_url' content part needs "image_url": {"url": "..."} with a string url)",
          "messages");
    }
    if (url->get_ref<const std::string&>().empty()) {
      return bad_request("'image_url.url' must not be empty", "messages");
    }
    message->parts.push_back({true, ""});
    out->images.push_back({url->get<std::string>(), message_index});
    return std::nullopt;
  }
  return bad_request(
      "content part type '" + clip(type_value) + "' is not supported (only 'text' and 'image_url')",
      "messages");
}

// The OpenAI fields of a message beside role and content that chat templates read, as vLLM
// passes them: an assistant's tool_calls (each function's JSON `arguments` string parsed into
// an object, as transformers' templates expect), a tool message's tool_call_id, and any
// message's name.
std::optional<ApiError> parse_message_fields(const json& m, ChatMessage* message) {
  // An empty list is a plain message.
  if (auto calls = m.find("tool_calls");
      calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty())) {
    if (message->role != "assistant") {
      return bad_request("'tool_calls' is only allowed in assistant messages", "messages");
    }
    if (!calls->is_array()) {
      return bad_request("'tool_calls' must be a list", "messages");
    }
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const json& call : *calls) {
      auto function = call.is_object() ? call.find("function") : call.end();
      if (!call.is_object() || function == call.end() || !function->is_object() ||
          !function->contains("name") || !(*function)["name"].is_string()) {
        return bad_request(
            R"(each tool call needs "function": {"name": "...", "arguments": "..."})", "messages");
      }
      nlohmann::ordered_json converted = call;
      nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
      auto args = function->find("arguments");
      if (args != function->end() && args->is_string() &&
          !args->get_ref<const std::string&>().empty()) {
        // Parsed in order: templates print the arguments with tojson, key order included.
        arguments = nlohmann::ordered_json::parse(args->get_ref<const std::string&>(), nullptr,
                                                  /*allow_exceptions=*/false);
        if (arguments.is_discarded()) {
          return bad_request("tool call '" + clip((*function)["name"].get<std::string>()) +
                                 "': 'arguments' is not valid JSON",
                             "messages");
        }
      } else if (args != function->end() && args->is_object()) {
        arguments = *args;
      } else if (args != function->end() && !args->is_null() && !args->is_string()) {
        return bad_request("a tool call's 'arguments' must be a JSON string", "messages");
      }
      converted["function"]["arguments"] = std::move(arguments);
      list.push_back(std::move(converted));
    }
    message->fields["tool_calls"] = std::move(list);
  }
  if (auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
    if (!id->is_string()) {
      return wrong_type("tool_call_id", "a string", *id);
    }
    if (message->role == "tool") {
      message->fields["tool_call_id"] = id->get<std::string>();
    }
  }
  if (auto name = m.find("name"); name != m.end() && name->is_string()) {
    message->fields["name"] = name->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const json& body, GenerationRequest* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) {
    return bad_request("'messages' is required", "messages");
  }
  if (!it->is_array()) {
    return wrong_type("messages", "a list", *it);
  }
  if (it->empty()) {
    return bad_request("'messages' must not be empty", "messages");
  }
  for (const auto& m : *it) {
    if (!m.is_object()) {
      return bad_request("each message must be an object", "messages");
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return bad_request("each message needs a string 'role'", "messages");
    }
    ChatMessage message;
    message.role = role->get<std::string>();
    // The deprecated function-calling shape is refused rather than rendered without it.
    if (message.role == "function") {
      return bad_request("messages with role 'function' are not supported (use 'tool')",
                         "messages");
    }
    if (auto call = m.find("function_call"); call != m.end() && !call->is_null()) {
      return bad_request("messages with 'function_call' are not supported (use 'tool_calls')",
                         "messages");
    }
    CRESCENT_RETURN_IF_API_ERROR(parse_message_fields(m, &message));
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      message.content = "";
    } else if (content->is_string()) {
      message.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Whether a role may hold images is the chat template's call: Qwen2-VL's renders them
      // in any message, text-only templates refuse them anywhere.
      const int message_index = static_cast<int>(out->messages.size());
      for (const auto& part : *content) {
        CRESCENT_RETURN_IF_API_ERROR(parse_content_part(part, message_index, &message, out));
      }
    } else {
      return bad_request("message 'content' must be a string or a list of content parts",
                         "messages");
    }
    out->messages.push_back(std::move(message));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const json& body, engine::SamplingParams* sampling) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) {
    return std::nullopt;
  }
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) {
      sampling->stop.push_back(it->get<std::string>());
    }
    return std::nullopt;
  }
  if (!it->is_array()) {
    return wrong_type("stop", "a string or a list of strings", *it);
  }
  for (const auto& s : *it) {
    if (!s.is_string()) {
      return bad_request("'stop' must be a string or a list of strings", "stop");
    }
    if (!s.get<std::string>().empty()) {
      sampling->stop.push_back(s.get<std::string>());
    }
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}. Whether the ids are in the
// vocabulary is checked once the engine is known.
std::optional<ApiError> parse_logit_bias(const json& body, engine::SamplingParams* sampling) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) {
    return std::nullopt;
  }
  if (!it->is_object()) {
    return wrong_type("logit_bias", "an object mapping token ids to biases", *it);
  }
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return bad_request(
          "'logit_bias' keys must be token ids (non-negative integers), got '" + clip(key) + "'",
          "logit_bias");
    }
    if (!value.is_number()) {
      return bad_request("'logit_bias' values must be numbers, got " +
                             std::string(type_name(value)) + " for token " + key,
                         "logit_bias");
    }
    const double bias = value.get<double>();
    if (!(bias >= -engine::kMaxLogitBias && bias <= engine::kMaxLogitBias)) {
      return bad_request("'logit_bias' values must be in [-100, 100], got " + std::to_string(bias) +
                             " for token " + key,
                         "logit_bias");
    }
    sampling->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  // Keys are ordered as strings ("10" < "9"), and "05" and "5" are one token.
  std::sort(sampling->logit_bias.begin(), sampling->logit_bias.end());
  for (size_t i = 1; i < sampling->logit_bias.size(); ++i) {
    if (sampling->logit_bias[i].first == sampling->logit_bias[i - 1].first) {
      return bad_request("'logit_bias' names token id " +
                             std::to_string(sampling->logit_bias[i].first) + " more than once",
                         "logit_bias");
    }
  }
  return std::nullopt;
}

bool is_null(const json& v) {
  return v.is_null();
}
bool is_null_or_empty(const json& v) {
  // json::empty() is false for every string, "" included.
  return v.is_null() || ((v.is_array() || v.is_object()) && v.empty()) ||
         (v.is_string() && v.get_ref<const std::string&>().empty());
}
bool is_null_or_false(const json& v) {
  return v.is_null() || v == false;
}
bool is_null_or_one(const json& v) {
  return v.is_null() || (v.is_number() && v.get<double>() == 1);
}
bool is_null_or_zero(const json& v) {
  return v.is_null() || (v.is_number() && v.get<double>() == 0);
}
bool is_null_or_none(const json& v) {
  return v.is_null() || v == "none";
}
bool is_text_modality(const json& v) {
  return v.is_null() || v == json::array({"text"});
}

// Fields of OpenAI's and vLLM's APIs that crescent does not implement. Each is accepted only
// at a value that asks for nothing (`accepted`); any other value is a 400 naming the field,
// never a 200 with an answer that ignored it.
struct UnsupportedField {
  const char* name;
  bool (*asks_for_nothing)(const json&);
  const char* accepted;
};

constexpr UnsupportedField kUnsupportedFields[] = {
    {"use_beam_search", is_null_or_false, "null or false"},
    {"length_penalty", is_null_or_one, "null or 1"},
    {"functions", is_null_or_empty, "null or []"},
    {"function_call", is_null_or_none, R"(null or "none")"},
    {"documents", is_null, "null"},
    {"mm_processor_kwargs", is_null_or_empty, "null or {}"},
    {"guided_grammar", is_null, "null"},
    {"structured_outputs", is_null, "null"},
    {"allowed_token_ids", is_null, "null"},
    {"bad_words", is_null_or_empty, "null or []"},
    {"prompt_logprobs", is_null, "null"},
    {"return_tokens_as_token_ids", is_null_or_false, "null or false"},
    {"truncate_prompt_tokens", is_null, "null"},
    {"priority", is_null_or_zero, "null or 0"},
    {"cache_salt", is_null, "null"},
    {"suffix", is_null_or_empty, R"(null or "")"},
    {"prediction", is_null, "null"},
    {"audio", is_null, "null"},
    {"modalities", is_text_modality, R"(null or ["text"])"},
    {"reasoning_effort", is_null, "null"},
    {"web_search_options", is_null, "null"},
    {"logits_processors", is_null_or_empty, "null or []"},
    {"prompt_embeds", is_null, "null"},
    {"return_token_ids", is_null_or_false, "null or false"},
    {"vllm_xargs", is_null_or_empty, "null or {}"},
};

// Fields of the chat endpoint that a completion request may carry only at values that ask for
// nothing.
constexpr UnsupportedField kChatOnlyFields[] = {
    {"chat_template", is_null_or_empty, "null"},
    {"chat_template_kwargs", is_null_or_empty, "null or {}"},
    {"continue_final_message", is_null_or_false, "null or false"},
    {"tools", is_null_or_empty, "null or []"},
    {"tool_choice", is_null_or_none, R"(null or "none")"},
};

std::optional<ApiError> refuse_unsupported(const json& body, Endpoint endpoint) {
  for (const UnsupportedField& f : kUnsupportedFields) {
    auto it = body.find(f.name);
    if (it != body.end() && !f.asks_for_nothing(*it)) {
      return bad_request(std::string("'") + f.name +
                             "' is not supported by this server (accepted only as " + f.accepted +
                             ")",
                         f.name);
    }
  }
  if (endpoint == Endpoint::kCompletions) {
    for (const UnsupportedField& f : kChatOnlyFields) {
      auto it = body.find(f.name);
      if (it != body.end() && !f.asks_for_nothing(*it)) {
        return bad_request(std::string("'") + f.name +
                               "' applies only to /v1/chat/completions (accepted here only as " +
                               f.accepted + ")",
                           f.name);
      }
    }
  }
  // vLLM's add_special_tokens, at what crescent does: the chat template holds its own special
  // tokens, a completion prompt gets the tokenizer's.
  const bool is_chat = endpoint == Endpoint::kChat;
  if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean() || it->get<bool>() != !is_chat) {
      return bad_request(std::string("'add_special_tokens' is not supported by this server "
                                     "(accepted only as null or ") +
                             (is_chat ? "false" : "true") + " on this endpoint)",
                         "add_special_tokens");
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_sampling(const json& body, GenerationRequest* out) {
  engine::SamplingParams& s = out->sampling;
  double d = 0;
  bool present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_number(body, "temperature", &d, &present));
  if (present) {
    if (d < 0 || d > 100) {
      return bad_request("'temperature' must be in [0, 100], got " + std::to_string(d),
                         "temperature");
    }
    s.temperature = static_cast<float>(d);
  }
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_number(body, "top_p", &d, &present));
  if (present) {
    if (!(d > 0 && d <= 1)) {
      return bad_request("'top_p' must be in (0, 1], got " + std::to_string(d), "top_p");
    }
    s.top_p = static_cast<float>(d);
  }
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_number(body, "min_p", &d, &present));
  if (present) {
    if (!(d >= 0 && d <= 1)) {
      return bad_request("'min_p' must be in [0, 1], got " + std::to_string(d), "min_p");
    }
    s.min_p = static_cast<float>(d);
  }
  int64_t i = 0;
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_int(body, "top_k", &i, &present));
  if (present) {
    if (i < -1 || i > std::numeric_limits<int32_t>::max()) {
      return bad_request("'top_k' must be -1 (off) or >= 0, got " + std::to_string(i), "top_k");
    }
    s.top_k = static_cast<int32_t>(i);
  }
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_int(body, "seed", &i, &present));
  if (present) {
    s.seed = static_cast<uint64_t>(i);
  }
  // Chat prefers max_completion_tokens; both are accepted on both endpoints.
  for (const char* field : {"max_tokens", "max_completion_tokens"}) {
    present = false;
    CRESCENT_RETURN_IF_API_ERROR(get_int(body, field, &i, &present));
    if (present) {
      if (i < 1) {
        return bad_request(
            std::string("'") + field + "' must be at least 1, got " + std::to_string(i), field);
      }
      s.max_tokens =
          static_cast<int32_t>(std::min<int64_t>(i, std::numeric_limits<int32_t>::max()));
      out->max_tokens_given = true;
      if (i > std::numeric_limits<int32_t>::max()) {
        return bad_request(std::string("'") + field + "' is too large: " + std::to_string(i),
                           field);
      }
    }
  }
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_int(body, "n", &i, &present));
  if (present && (i < 1 || i > kMaxChoices)) {
    return bad_request(
        "'n' must be from 1 to " + std::to_string(kMaxChoices) + ", got " + std::to_string(i), "n");
  }
  if (present) {
    out->n = static_cast<int>(i);
  }
  CRESCENT_RETURN_IF_API_ERROR(parse_stop(body, &s));
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) {
      return wrong_type("stop_token_ids", "a list of integers", *it);
    }
    CRESCENT_RETURN_IF_API_ERROR(get_token_ids(*it, "stop_token_ids", &s.stop_token_ids));
  }
  CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "ignore_eos", &s.ignore_eos));
  CRESCENT_RETURN_IF_API_ERROR(
      get_bool(body, "include_stop_str_in_output", &s.include_stop_str_in_output));
  present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_int(body, "min_tokens", &i, &present));
  if (present) {
    if (i < 0 || i > std::numeric_limits<int32_t>::max()) {
      return bad_request("'min_tokens' must be at least 0, got " + std::to_string(i), "min_tokens");
    }
    s.min_tokens = static_cast<int32_t>(i);
  }
  CRESCENT_RETURN_IF_API_ERROR(parse_logit_bias(body, &s));
  CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "skip_special_tokens", &s.skip_special_tokens));
  // Penalties are accepted only at their neutral value: crescent does not implement them.
  for (const char* field : {"presence_penalty", "frequency_penalty"}) {
    d = 0;
    CRESCENT_RETURN_IF_API_ERROR(get_number(body, field, &d));
    if (d != 0) {
      return bad_request(std::string("'") + field + "' is not supported (only 0)", field);
    }
  }
  present = false;
  d = 1;
  CRESCENT_RETURN_IF_API_ERROR(get_number(body, "repetition_penalty", &d, &present));
  if (present && d != 1) {
    return bad_request("'repetition_penalty' is not supported (only 1)", "repetition_penalty");
  }
  bool echo = false;
  CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "echo", &echo));
  if (echo) {
    return bad_request("'echo' is not supported", "echo");
  }

  if (out->endpoint == Endpoint::kCompletions) {
    present = false;
    CRESCENT_RETURN_IF_API_ERROR(get_int(body, "logprobs", &i, &present));
    if (present) {
      if (i < 0 || i > engine::kMaxLogprobs) {
        return bad_request("'logprobs' must be in [0, " + std::to_string(engine::kMaxLogprobs) +
                               "], got " + std::to_string(i),
                           "logprobs");
      }
      s.logprobs = static_cast<int32_t>(i);
      out->want_logprobs = true;
    }
  } else {
    CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "logprobs", &out->want_logprobs));
    present = false;
    i = 0;
    CRESCENT_RETURN_IF_API_ERROR(get_int(body, "top_logprobs", &i, &present));
    if (present && (i < 0 || i > engine::kMaxLogprobs)) {
      return bad_request("'top_logprobs' must be in [0, " + std::to_string(engine::kMaxLogprobs) +
                             "], got " + std::to_string(i),
                         "top_logprobs");
    }
    if (present && !out->want_logprobs && i > 0) {
      return bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    }
    if (out->want_logprobs) {
      s.logprobs = static_cast<int32_t>(i);
    }
  }
  return std::nullopt;
}

// OpenAI's tools: [{"type": "function", "function": {"name": ..., "parameters": {...}}}].
std::optional<ApiError> check_tools(const json& tools) {
  if (!tools.is_array()) {
    return wrong_type("tools", "a list", tools);
  }
  for (const json& tool : tools) {
    auto function = tool.is_object() ? tool.find("function") : tool.end();
    if (!tool.is_object() || tool.value("type", json()) != "function" || function == tool.end() ||
        !function->is_object() || !function->contains("name") || !(*function)["name"].is_string() ||
        (*function)["name"].get_ref<const std::string&>().empty()) {
      return bad_request(
          R"(each tool must be {"type": "function", "function": {"name": "...", ...}})", "tools");
    }
    const std::string& name = (*function)["name"].get_ref<const std::string&>();
    if (auto p = function->find("parameters");
        p != function->end() && !p->is_null() && !p->is_object()) {
      return bad_request("tool '" + clip(name) +
                             "': 'parameters' must be a JSON Schema object, got " + type_name(*p),
                         "tools");
    }
    if (auto d = function->find("description");
        d != function->end() && !d->is_null() && !d->is_string()) {
      return bad_request("tool '" + clip(name) + "': 'description' must be a string", "tools");
    }
  }
  return std::nullopt;
}

// tool_choice with vLLM's rules. "required" and a named function become a guided-decoding
// constraint once the tools are parsed (apply_forced_tool_choice).
std::optional<ApiError> parse_tool_choice(const json& body, ToolChoice* out,
                                          std::string* name_out) {
  auto tools = body.find("tools");
  const bool has_tools = tools != body.end() && tools->is_array() && !tools->empty();
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) {
    *out = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
    return std::nullopt;
  }
  const json& choice = *it;
  if (choice == "none") {
    *out = ToolChoice::kNone;
    return std::nullopt;
  }
  if (tools == body.end() || tools->is_null()) {
    return bad_request("'tool_choice' needs 'tools'", "tool_choice");
  }
  if (choice == "auto" || choice == "required") {
    // With an empty list there is nothing to call (vLLM treats "required" so too).
    if (!has_tools) {
      *out = ToolChoice::kNone;
      return std::nullopt;
    }
    *out = choice == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
    return std::nullopt;
  }
  auto function = choice.is_object() ? choice.find("function") : choice.end();
  if (!choice.is_object() || choice.value("type", json()) != "function" ||
      function == choice.end() || !function->is_object() || !function->contains("name") ||
      !(*function)["name"].is_string()) {
    return bad_request(
        R"('tool_choice' must be "none", "auto", "required" or {"type": "function", )"
        R"("function": {"name": "..."}})",
        "tool_choice");
  }
  const std::string& name = (*function)["name"].get_ref<const std::string&>();
  bool found = false;
  for (const json& tool : *tools) {
    found = found || tool["function"]["name"] == name;  // check_tools checked the shape
  }
  if (!found) {
    return bad_request(
        "'tool_choice' names the function '" + clip(name) + "', which is not in 'tools'",
        "tool_choice");
  }
  *out = ToolChoice::kNamed;
  *name_out = name;
  return std::nullopt;
}

// The chat template's inputs besides the messages, with vLLM's rules.
std::optional<ApiError> parse_chat_render(const json& body, GenerationRequest* out) {
  ChatRenderOptions& r = out->chat_render;
  CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "add_generation_prompt", &r.add_generation_prompt));
  CRESCENT_RETURN_IF_API_ERROR(get_bool(body, "continue_final_message", &r.continue_final_message));
  if (r.continue_final_message && r.add_generation_prompt) {
    return bad_request(
        "'continue_final_message' and 'add_generation_prompt' cannot both be true (the first "
        "continues the final message, the second starts a new one; add_generation_prompt "
        "defaults to true)",
        "continue_final_message");
  }
  if (r.continue_final_message && out->messages.back().role != "assistant") {
    return bad_request(
        "'continue_final_message' needs the final message to be an assistant's, "
        "got '" +
            clip(out->messages.back().role) + "'",
        "continue_final_message");
  }
  if (auto it = body.find("chat_template"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      return wrong_type("chat_template", "a string", *it);
    }
    // "" is the model's template, as in vLLM.
    if (!it->get_ref<const std::string&>().empty()) {
      r.chat_template = it->get<std::string>();
    }
  }
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      return wrong_type("chat_template_kwargs", "an object", *it);
    }
    // The request's own fields say these; a kwarg would silently override them.
    for (const char* key : {"messages", "tools"}) {
      if (it->contains(key)) {
        return bad_request(std::string("'chat_template_kwargs' must not set '") + key +
                               "' (give it as the request's own field)",
                           "chat_template_kwargs");
      }
    }
    r.template_kwargs = *it;
  }
  return std::nullopt;
}

// kv_transfer_params as DESIGN.md §2 fixes them. Unknown keys are ignored (vLLM's connectors
// add their own); the ones crescent reads must have the right type and fit together.
std::optional<ApiError> parse_kv_transfer_params(const json& p, engine::KvTransferParams* out) {
  constexpr size_t kMaxFieldBytes = 512;
  const std::string prefix = "kv_transfer_params.";
  CRESCENT_RETURN_IF_API_ERROR(get_bool(p, "do_remote_prefill", &out->do_remote_prefill));
  CRESCENT_RETURN_IF_API_ERROR(get_bool(p, "do_remote_decode", &out->do_remote_decode));
  for (auto [field, dst] : {std::pair{"transfer_id", &out->transfer_id},
                            std::pair{"remote_engine_id", &out->remote_engine_id},
                            std::pair{"remote_bootstrap_addr", &out->remote_bootstrap_addr}}) {
    auto it = p.find(field);
    if (it == p.end() || it->is_null()) {
      continue;
    }
    if (!it->is_string()) {
      return wrong_type(prefix + field, "a string", *it);
    }
    if (it->get_ref<const std::string&>().size() > kMaxFieldBytes) {
      return bad_request(
          "'" + prefix + field + "' is longer than " + std::to_string(kMaxFieldBytes) + " bytes",
          prefix + field);
    }
    *dst = it->get<std::string>();
  }
  if (out->do_remote_prefill && out->do_remote_decode) {
    return bad_request(
        "kv_transfer_params: do_remote_prefill and do_remote_decode cannot both be true",
        "kv_transfer_params");
  }
  if (out->is_remote() && out->transfer_id.empty()) {
    return bad_request("kv_transfer_params: 'transfer_id' is required with do_remote_" +
                           std::string(out->do_remote_prefill ? "prefill" : "decode"),
                       prefix + "transfer_id");
  }
  if (out->do_remote_prefill) {
    for (auto [field, value] : {std::pair{"remote_engine_id", &out->remote_engine_id},
                                std::pair{"remote_bootstrap_addr", &out->remote_bootstrap_addr}}) {
      if (value->empty()) {
        return bad_request(
            std::string("kv_transfer_params: '") + field + "' is required with do_remote_prefill",
            prefix + field);
      }
    }
  }
  return std::nullopt;
}

// best_of (after n and stream): at least n, and not above n in a stream (the best choices are
// known only at the end), as vLLM rules.
std::optional<ApiError> parse_best_of(const json& body, GenerationRequest* out) {
  int64_t i = 0;
  bool present = false;
  CRESCENT_RETURN_IF_API_ERROR(get_int(body, "best_of", &i, &present));
  if (!present) {
    out->best_of = out->n;
    return std::nullopt;
  }
  if (i < out->n || i > kMaxChoices) {
    return bad_request("'best_of' must be from n (" + std::to_string(out->n) + ") to " +
                           std::to_string(kMaxChoices) + ", got " + std::to_string(i),
                       "best_of");
  }
  if (out->stream && i > out->n) {
    return bad_request(
        "'best_of' greater than 'n' cannot be streamed: the best choices are "
        "known only when all have finished",
        "best_of");
  }
  out->best_of = static_cast<int>(i);
  if (out->best_of > out->n && !out->sampling.logprobs.has_value()) {
    out->sampling.logprobs = 0;  // the sampled tokens' logprobs rank the choices
  }
  return std::nullopt;
}

}  // namespace

ApiError bad_request(std::string message, std::string param) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError api_error(int http_status, std::string message, std::string type) {
  ApiError e;
  e.http_status = http_status;
  e.message = std::move(message);
  e.type = std::move(type);
  return e;
}

json error_json(const ApiError& error) {
  json e = {{"message", error.message}, {"type", error.type}};
  e["param"] = error.param.empty() ? json(nullptr) : json(error.param);
  e["code"] = error.http_status;
  return json{{"error", e}};
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<engine::KvTransferParams> remote_prefill_of(const std::string& body) {
  if (body.find("do_remote_prefill") == std::string::npos) {
    return std::nullopt;
  }
  auto parsed = parse_json(body, "the request body");
  if (!parsed.is_ok() || !parsed->is_object()) {
    return std::nullopt;
  }
  auto it = parsed->find("kv_transfer_params");
  engine::KvTransferParams params;
  if (it == parsed->end() || !it->is_object() || parse_kv_transfer_params(*it, &params) ||
      !params.do_remote_prefill) {
    return std::nullopt;
  }
  return params;
}

std::optional<ApiError> parse_generation_request(const std::string& body, Endpoint endpoint,
                                                 GenerationRequest* out) {
  out->endpoint = endpoint;
  // The parser rejects invalid UTF-8 inside strings, so prompts reach the tokenizer valid.
  auto parsed = parse_json(body, "the request body");
  if (!parsed.is_ok()) {
    return bad_request(parsed.status().message());
  }
  json j = std::move(parsed).value();
  if (!j.is_object()) {
    return bad_request("the request body must be a JSON object");
  }
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) {
      return wrong_type("model", "a string", *it);
    }
    out->model = it->get<std::string>();
  }
  if (endpoint == Endpoint::kCompletions) {
    CRESCENT_RETURN_IF_API_ERROR(parse_prompt(j, out));
  } else {
    CRESCENT_RETURN_IF_API_ERROR(parse_messages(j, out));
  }
  CRESCENT_RETURN_IF_API_ERROR(refuse_unsupported(j, endpoint));
  CRESCENT_RETURN_IF_API_ERROR(parse_sampling(j, out));
  CRESCENT_RETURN_IF_API_ERROR(parse_guided_decoding(body, j, &out->sampling.guided));
  if (endpoint == Endpoint::kChat) {
    CRESCENT_RETURN_IF_API_ERROR(parse_chat_render(j, out));
    if (auto it = j.find("tools"); it != j.end() && !it->is_null()) {
      CRESCENT_RETURN_IF_API_ERROR(check_tools(*it));
    }
    CRESCENT_RETURN_IF_API_ERROR(parse_tool_choice(j, &out->tool_choice, &out->tool_choice_name));
    CRESCENT_RETURN_IF_API_ERROR(get_bool(j, "parallel_tool_calls", &out->parallel_tool_calls));
    if (auto it = j.find("tools"); it != j.end() && it->is_array() && !it->empty()) {
      // Parsed again in order: templates print the tools with tojson, key order included.
      auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_discarded()) {
        return bad_request("the request body does not parse");  // parse_json took it: a bug
      }
      out->chat_render.tools = std::move(ordered["tools"]);
    }
    CRESCENT_RETURN_IF_API_ERROR(apply_forced_tool_choice(out));
  }
  CRESCENT_RETURN_IF_API_ERROR(get_bool(j, "stream", &out->stream));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return wrong_type("stream_options", "an object", *it);
    }
    CRESCENT_RETURN_IF_API_ERROR(get_bool(*it, "include_usage", &out->include_usage));
    CRESCENT_RETURN_IF_API_ERROR(
        get_bool(*it, "continuous_usage_stats", &out->continuous_usage_stats));
    // vLLM's rule: options of a stream that is not there would be silently dropped ({} asks
    // for nothing, as in vLLM).
    if (!out->stream && !it->empty()) {
      return bad_request("'stream_options' can only be given when 'stream' is true",
                         "stream_options");
    }
  }
  CRESCENT_RETURN_IF_API_ERROR(parse_best_of(j, out));
  if (auto it = j.find("kv_transfer_params"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return wrong_type("kv_transfer_params", "an object", *it);
    }
    CRESCENT_RETURN_IF_API_ERROR(parse_kv_transfer_params(*it, &out->kv_transfer));
    out->kv_transfer_params = *it;
  }
  if (auto it = j.find("ec_transfer_params"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) {
      return wrong_type("ec_transfer_params", "an object", *it);
    }
    out->ec_transfer_params = *it;
  }
  engine::SamplingParams& s = out->sampling;
  if (out->max_tokens_given && s.min_tokens > s.max_tokens) {
    // A prefill server's request (do_remote_decode) is the client's body with max_tokens set
    // to 1 by the proxy; its one token is thrown away and the decode server, which gets the
    // client's max_tokens, applies min_tokens. So only the decode side checks it.
    if (out->kv_transfer.do_remote_decode) {
      s.min_tokens = s.max_tokens;
    } else {
      return bad_request("'min_tokens' (" + std::to_string(s.min_tokens) +
                             ") must not be greater than 'max_tokens' (" +
                             std::to_string(s.max_tokens) + ")",
                         "min_tokens");
    }
  }
  return std::nullopt;
}

}  // namespace crescent::server
