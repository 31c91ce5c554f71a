#include "model/chat_template.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace crescent::model {
namespace {

using Json = nlohmann::json;

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found("cannot open " + path);
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

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

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Python's str.lstrip/rstrip/strip with an explicit set of single-byte characters.
std::string_view lstrip_chars(std::string_view s, std::string_view chars) {
  const size_t i = s.find_first_not_of(chars);
  return i == std::string_view::npos ? std::string_view() : s.substr(i);
}
std::string_view rstrip_chars(std::string_view s, std::string_view chars) {
  const size_t i = s.find_last_not_of(chars);
  return i == std::string_view::npos ? std::string_view() : s.substr(0, i + 1);
}

// Python str.isspace() for the code point at s[pos..pos+len).
size_t python_space_length(std::string_view s, size_t pos) {
  const auto c = static_cast<unsigned char>(s[pos]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) {
    return 1;
  }
  static constexpr std::string_view kMultiByte[] = {
      "\xC2\x85",     "\xC2\xA0",     "\xE1\x9A\x80", "\xE2\x80\x80", "\xE2\x80\x81",
      "\xE2\x80\x82", "\xE2\x80\x83", "\xE2\x80\x84", "\xE2\x80\x85", "\xE2\x80\x86",
      "\xE2\x80\x87", "\xE2\x80\x88", "\xE2\x80\x89", "\xE2\x80\x8A", "\xE2\x80\xA8",
      "\xE2\x80\xA9", "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
  for (std::string_view m : kMultiByte) {
    if (s.substr(pos, m.size()) == m) {
      return m.size();
    }
  }
  return 0;
}

// Jinja's `trim` filter: Python str.strip() with no argument (Unicode whitespace).
std::string python_strip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = python_space_length(s, b);
    if (n == 0) {
      break;
    }
    b += n;
  }
  // Scan forward remembering where the last non-space character ended.
  size_t end = b;
  size_t pos = b;
  while (pos < s.size()) {
    const size_t n = python_space_length(s, pos);
    if (n > 0) {
      pos += n;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[pos]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    pos += len;
    end = pos;
  }
  return std::string(s.substr(b, end - b));
}

// Qwen2-VL / Qwen2.5-VL (chat_template.json and tokenizer_config.json of the -Instruct
// checkpoints; Qwen2-VL-7B's later revision adds {% generation %} tags, which render nothing).
// The family is recognised by the pieces of the template that the native renderer reproduces;
// a template that also uses features the renderer lacks (tools, reasoning, macros, raised
// errors, as in Qwen3-VL's) is not this family.
constexpr std::string_view kQwen2VlImage = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr std::string_view kQwen2VlDefaultSystemOpen =
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n";
constexpr std::string_view kQwen2VlDefaultSystemClose = "<|im_end|>\n{% endif %}";
constexpr std::string_view kQwen2VlVisionId =
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}";
constexpr std::string_view kQwen2VlRequired[] = {
    kQwen2VlImage,
    "<|im_start|>{{ message['role'] }}\n",
    "{% if message['content'] is string %}",
    "{% for content in message['content'] %}",
    "{% elif 'text' in content %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
};
constexpr std::string_view kQwen2VlForeign[] = {"tools",           "<think>",  "reasoning_content",
                                                "raise_exception", "{% macro", "{%- macro"};

bool contains(std::string_view s, std::string_view p) {
  return s.find(p) != std::string_view::npos;
}

bool is_qwen2_vl_like(std::string_view t) {
  return contains(t, "<|im_start|>") && contains(t, kQwen2VlImage);
}

// Checks that `t` is a Qwen2-VL template and reads its default system prompt.
Result<std::string> qwen2_vl_default_system(std::string_view t) {
  for (std::string_view piece : kQwen2VlRequired) {
    if (!contains(t, piece)) {
      return unimplemented(
          "chat template: a Qwen2-VL-like template (<|im_start|> and image placeholders) without "
          "the Qwen2-VL structure is not supported");
    }
  }
  for (std::string_view piece : kQwen2VlForeign) {
    if (contains(t, piece)) {
      return unimplemented("chat template: a Qwen2-VL-like template that uses '" +
                           std::string(piece) + "' is not supported");
    }
  }
  const size_t open = t.find(kQwen2VlDefaultSystemOpen);
  const size_t begin =
      open == std::string_view::npos ? open : open + kQwen2VlDefaultSystemOpen.size();
  const size_t end =
      begin == std::string_view::npos ? begin : t.find(kQwen2VlDefaultSystemClose, begin);
  if (end == std::string_view::npos) {
    return unimplemented(
        "chat template: a Qwen2-VL-like template without its default system "
        "message block is not supported");
  }
  std::string_view system = t.substr(begin, end - begin);
  if (contains(system, "{{") || contains(system, "{%") || contains(system, "{#")) {
    return unimplemented(
        "chat template: a Qwen2-VL-like template whose default system message is not plain text "
        "is not supported");
  }
  return std::string(system);
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
  const std::string& t = config.chat_template;
  if (t.empty()) {
    return invalid_argument("tokenizer_config.json has no chat_template");
  }
  if (is_qwen2_vl_like(t)) {
    ASSIGN_OR_RETURN(std::string default_system, qwen2_vl_default_system(t));
    ChatTemplate c(ChatTemplateFamily::kQwen2Vl, std::move(config));
    c.qwen2_vl_default_system_ = std::move(default_system);
    c.qwen2_vl_has_vision_id_ = contains(c.config_.chat_template, kQwen2VlVisionId);
    return c;
  }
  if (t.find("<|im_start|>") != std::string::npos) {
    // Qwen3's template: ChatML, no default system prompt, <think> handling of assistant turns.
    if (t.find("</think>") != std::string::npos &&
        t.find("reasoning_content") != std::string::npos &&
        t.find("last_query_index") != std::string::npos) {
      return ChatTemplate(ChatTemplateFamily::kQwen3, std::move(config));
    }
    return unimplemented(
        "chat template: a ChatML (<|im_start|>) template other than Qwen3's is not supported");
  }
  if (t.find("<|start_header_id|>") != std::string::npos) {
    if (t.find("Cutting Knowledge Date") != std::string::npos ||
        t.find("tools") != std::string::npos) {
      return unimplemented(
          "chat template: Llama-3.1+ templates (tools, knowledge-date system preamble) are not "
          "supported; only the Llama-3 template is");
    }
    if (!config.bos_token) {
      return invalid_argument("chat template: Llama-3 template needs bos_token");
    }
    ChatTemplate c(ChatTemplateFamily::kLlama3, std::move(config));
    c.llama3_conditional_prompt_ =
        c.config_.chat_template.find("add_generation_prompt") != std::string::npos;
    return c;
  }
  return unimplemented("chat template: unrecognised template family");
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         bool add_generation_prompt) const {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return render(messages, options);
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatRenderOptions& options) const {
  if (messages.empty()) {
    return invalid_argument("chat template: no messages");
  }
  if (family_ != ChatTemplateFamily::kQwen2Vl) {
    for (const ChatMessage& m : messages) {
      if (m.has_images()) {
        return invalid_argument("this model's chat template does not take images");
      }
    }
  }
  switch (family_) {
    case ChatTemplateFamily::kQwen3:
      return render_qwen3(messages, options);
    case ChatTemplateFamily::kLlama3:
      return render_llama3(messages, options);
    case ChatTemplateFamily::kQwen2Vl:
      return render_qwen2_vl(messages, options);
  }
  return internal_error("chat template: bad family");
}

Result<std::string> ChatTemplate::render_qwen3(const std::vector<ChatMessage>& messages,
                                               const ChatRenderOptions& options) const {
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return invalid_argument("chat template: unknown role '" + m.role + "'");
    }
  }
  const size_t n = messages.size();
  std::string out;
  if (messages[0].role == "system") {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  // The last user message that is not a tool response ends the "query"; assistant turns after
  // it keep their reasoning.
  size_t last_query_index = n - 1;
  for (size_t k = n; k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query_index = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      const size_t close = m.content.find("</think>");
      if (close != std::string::npos) {
        // content.split('</think>')[-1].lstrip('\n')
        content =
            lstrip_chars(std::string_view(m.content).substr(m.content.rfind("</think>") + 8), "\n");
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string_view head = rstrip_chars(std::string_view(m.content).substr(0, close), "\n");
        const size_t open = head.rfind("<think>");
        if (open != std::string_view::npos) {
          head = head.substr(open + 7);
        }
        reasoning = lstrip_chars(head, "\n");
      }
      if (i > last_query_index && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n";
        out += rstrip_chars(lstrip_chars(reasoning, "\n"), "\n");
        out += "\n</think>\n\n";
        out += lstrip_chars(content, "\n");
      } else {
        out += "<|im_start|>assistant\n";
        out += content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") {
        out += "<|im_start|>user";
      }
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") {
        out += "<|im_end|>\n";
      }
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

Result<std::string> ChatTemplate::render_llama3(const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return invalid_argument("chat template: unknown role '" + m.role + "'");
    }
    if (i == 0) {
      out += *config_.bos_token;
    }
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + python_strip(m.content) +
           "<|eot_id|>";
  }
  if (options.add_generation_prompt || !llama3_conditional_prompt_) {
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  return out;
}

// The template writes `<|im_start|>{role}\n` for any role and the parts of a list content in
// order (images as placeholders, with "Picture N: " under add_vision_id); a string content and
// a list of text parts render the same.
Result<std::string> ChatTemplate::render_qwen2_vl(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const {
  std::string out;
  int num_images = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return invalid_argument("chat template: unknown role '" + m.role + "'");
    }
    if (i == 0 && m.role != "system") {
      out += "<|im_start|>system\n" + qwen2_vl_default_system_ + "<|im_end|>\n";
    }
    out += "<|im_start|>" + m.role + "\n";
    if (m.parts.empty()) {
      out += m.content;
    }
    for (const ChatContentPart& part : m.parts) {
      if (!part.is_image) {
        out += part.text;
        continue;
      }
      ++num_images;
      if (options.add_vision_id && qwen2_vl_has_vision_id_) {
        out += "Picture " + std::to_string(num_images) + ": ";
      }
      out += kQwen2VlImage;
    }
    out += "<|im_end|>\n";
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
  }
  return out;
}

}  // namespace crescent::model
