#include "model/chat_template.h"

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "model/jinja/strings.h"

namespace crescent::model {
namespace {

using Json = nlohmann::ordered_json;

// A special-token field: a string, an AddedToken object {"content": ...}, or null.
std::optional<std::string> token_field(const Json& j, const char* key) {
  if (!j.contains(key)) {
    return std::nullopt;
  }
  const Json& v = j[key];
  if (v.is_string()) {
    return v.get<std::string>();
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

bool contains(std::string_view s, std::string_view p) {
  return s.find(p) != std::string_view::npos;
}

ChatTemplateFamily guess_family(std::string_view t) {
  if (contains(t, "<|im_start|>") && contains(t, "<|vision_start|>")) {
    return ChatTemplateFamily::kQwen2Vl;
  }
  if (contains(t, "<|im_start|>") && contains(t, "</think>") && contains(t, "reasoning_content")) {
    return ChatTemplateFamily::kQwen3;
  }
  if (contains(t, "<|start_header_id|>")) {
    return ChatTemplateFamily::kLlama3;
  }
  return ChatTemplateFamily::kOther;
}

// transformers' continue_final_message: cut the rendered chat right after the final message.
Result<std::string> cut_after_final_message(std::string rendered, const Json& final_message) {
  std::string text;
  const Json& content = final_message.contains("content") ? final_message["content"] : Json();
  if (content.is_string()) {
    text = content.get<std::string>();
  } else if (content.is_array()) {
    bool found = false;
    for (auto it = content.rbegin(); it != content.rend() && !found; ++it) {
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
        text = (*it)["text"].get<std::string>();
        found = true;
      }
    }
    if (!found) {
      return invalid_argument(
          "continue_final_message is set but the final message has no text to continue");
    }
  } else {
    return invalid_argument("continue_final_message is set but the final message has no content");
  }
  const std::string stripped = jinja::py_strip(text, std::nullopt, true, true);
  const size_t loc = rendered.rfind(stripped);
  if (loc == std::string::npos) {
    return invalid_argument(
        "continue_final_message is set but the final message does not appear in the chat after "
        "applying the chat template");
  }
  const std::string lstripped = jinja::py_strip(text, std::nullopt, true, false);
  if (std::string_view(rendered).substr(loc, lstripped.size()) == text) {
    rendered.resize(loc + lstripped.size());
  } else {
    rendered.resize(loc + stripped.size());
  }
  return rendered;
}

}  // namespace

bool ChatMessage::has_images() const {
  for (const ChatContentPart& part : parts) {
    if (part.is_image) {
      return true;
    }
  }
  return false;
}

Result<TokenizerConfig> TokenizerConfig::from_file(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto r = from_json(text);
  if (!r.is_ok()) {
    return r.status().with_context(path);
  }
  return r;
}

Result<TokenizerConfig> TokenizerConfig::from_json(std::string_view json) {
  Json j;
  try {
    j = Json::parse(json.begin(), json.end());
  } catch (const std::exception& e) {
    return invalid_argument(std::string("tokenizer_config.json: malformed JSON: ") + e.what());
  }
  if (!j.is_object()) {
    return invalid_argument("tokenizer_config.json: top level is not an object");
  }
  TokenizerConfig c;
  c.bos_token = token_field(j, "bos_token");
  c.eos_token = token_field(j, "eos_token");
  c.pad_token = token_field(j, "pad_token");
  if (j.contains("chat_template")) {
    const Json& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      for (const Json& e : t) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          c.chat_template = e["template"].get<std::string>();
        }
      }
      if (c.chat_template.empty()) {
        return invalid_argument("tokenizer_config.json: chat_template list has no 'default'");
      }
    } else if (!t.is_null()) {
      return invalid_argument("tokenizer_config.json: chat_template is neither string nor list");
    }
  }
  return c;
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config_file(const std::string& path) {
  ASSIGN_OR_RETURN(TokenizerConfig config, TokenizerConfig::from_file(path));
  return from_config(std::move(config));
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_config_json(std::string_view json) {
  ASSIGN_OR_RETURN(TokenizerConfig config, TokenizerConfig::from_json(json));
  return from_config(std::move(config));
}

Result<ChatTemplate> ChatTemplate::from_config(TokenizerConfig config) {
  if (config.chat_template.empty()) {
    return invalid_argument("tokenizer_config.json has no chat_template");
  }
  ASSIGN_OR_RETURN(jinja::Template compiled, jinja::Template::parse(config.chat_template));
  const ChatTemplateFamily family = guess_family(config.chat_template);
  return ChatTemplate(family, std::move(config), std::move(compiled));
}

Result<ChatTemplate> ChatTemplate::from_template(std::string jinja, TokenizerConfig config) {
  config.chat_template = std::move(jinja);
  return from_config(std::move(config));
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return render(messages, options);
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& options) const {
  Json list = Json::array();
  for (const ChatMessage& m : messages) {
    Json message = {{"role", m.role}};
    if (!m.has_images()) {
      message["content"] = m.content;
    } else {
      Json parts = Json::array();
      for (const ChatContentPart& part : m.parts) {
        if (part.is_image) {
          parts.push_back({{"type", "image"}});
        } else {
          parts.push_back({{"type", "text"}, {"text", part.text}});
        }
      }
      message["content"] = std::move(parts);
    }
    list.push_back(std::move(message));
  }
  return render_json(list, options);
}

Result<std::string> ChatTemplate::render_json(const Json& messages,
                                              const ChatRenderOptions& options) const {
  if (!messages.is_array() || messages.empty()) {
    return invalid_argument("chat template: no messages");
  }
  const std::string& t = config_.chat_template;
  for (const Json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return invalid_argument("chat template: every message needs a string 'role'");
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        !contains(t, "'" + role + "'") && !contains(t, "\"" + role + "\"")) {
      return invalid_argument("chat template: this model's chat template has no role '" + role +
                              "'");
    }
    if (m.contains("content") && m["content"].is_array() && !contains(t, "image")) {
      for (const Json& part : m["content"]) {
        if (part.is_object() && part.value("type", "") != "text") {
          return invalid_argument("this model's chat template does not take images");
        }
      }
    }
  }
  if (options.continue_final_message && options.add_generation_prompt) {
    return invalid_argument(
        "continue_final_message and add_generation_prompt cannot both be set: the first "
        "continues the last message, the second starts a new one");
  }
  if (!options.template_kwargs.is_object()) {
    return invalid_argument("chat_template_kwargs must be a JSON object");
  }
  // The variables transformers passes: messages, tools, documents, add_generation_prompt, the
  // special tokens, then the caller's kwargs (which win).
  Json vars = Json::object();
  vars["messages"] = messages;
  vars["tools"] = options.tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = options.add_generation_prompt;
  if (config_.bos_token) {
    vars["bos_token"] = *config_.bos_token;
  }
  if (config_.eos_token) {
    vars["eos_token"] = *config_.eos_token;
  }
  if (config_.pad_token) {
    vars["pad_token"] = *config_.pad_token;
  }
  if (options.enable_thinking) {
    vars["enable_thinking"] = *options.enable_thinking;
  }
  if (options.add_vision_id) {
    vars["add_vision_id"] = true;
  }
  for (const auto& [k, v] : options.template_kwargs.items()) {
    vars[k] = v;
  }
  ASSIGN_OR_RETURN(std::string text, compiled_.render(vars));
  if (options.continue_final_message) {
    return cut_after_final_message(std::move(text), messages.back());
  }
  return text;
}

}  // namespace crescent::model
