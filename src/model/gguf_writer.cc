// The GGUF writer: GgufWriter (metadata, tensor table, aligned data), the model and tokenizer
// metadata crescent writes, and write_gguf() (a TensorSource converted to GGUF, each tensor in
// the type gguf_tensor_dtype() picks). The reader is gguf.cc.

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"

namespace crescent::model {

using nlohmann::json;

namespace {
template <typename T>
void append(std::vector<uint8_t>& buf, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  buf.insert(buf.end(), p, p + sizeof(T));
}
void append_string(std::vector<uint8_t>& buf, std::string_view s) {
  append<uint64_t>(buf, s.size());
  buf.insert(buf.end(), s.begin(), s.end());
}
}  // namespace

GgufWriter::GgufWriter(std::string path, int64_t alignment)
    : path_(std::move(path)), alignment_(alignment) {
  CRESCENT_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0) << "bad alignment";
  if (alignment != 32)
    set_u32("general.alignment", static_cast<uint32_t>(alignment));
}
GgufWriter::~GgufWriter() = default;

void GgufWriter::put_key(const std::string& key, GgufValueType type) {
  CRESCENT_CHECK(!out_) << "GGUF metadata set after write_header";
  append_string(kv_bytes_, key);
  append<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  ++num_kv_;
}
void GgufWriter::set_raw(const std::string& key, std::string_view type_and_value) {
  CRESCENT_CHECK(!out_) << "GGUF metadata set after write_header";
  CRESCENT_CHECK(type_and_value.size() >= 4) << "raw GGUF value without a type";
  append_string(kv_bytes_, key);
  kv_bytes_.insert(kv_bytes_.end(), type_and_value.begin(), type_and_value.end());
  ++num_kv_;
}
void GgufWriter::set_u32(const std::string& key, uint32_t value) {
  put_key(key, GgufValueType::kUint32);
  append(kv_bytes_, value);
}
void GgufWriter::set_i32(const std::string& key, int32_t value) {
  put_key(key, GgufValueType::kInt32);
  append(kv_bytes_, value);
}
void GgufWriter::set_u64(const std::string& key, uint64_t value) {
  put_key(key, GgufValueType::kUint64);
  append(kv_bytes_, value);
}
void GgufWriter::set_f32(const std::string& key, float value) {
  put_key(key, GgufValueType::kFloat32);
  append(kv_bytes_, value);
}
void GgufWriter::set_bool(const std::string& key, bool value) {
  put_key(key, GgufValueType::kBool);
  append<uint8_t>(kv_bytes_, value ? 1 : 0);
}
void GgufWriter::set_string(const std::string& key, std::string_view value) {
  put_key(key, GgufValueType::kString);
  append_string(kv_bytes_, value);
}
void GgufWriter::set_string_array(const std::string& key, const std::vector<std::string>& values) {
  put_key(key, GgufValueType::kArray);
  append<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kString));
  append<uint64_t>(kv_bytes_, values.size());
  for (const auto& v : values)
    append_string(kv_bytes_, v);
}
void GgufWriter::set_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  put_key(key, GgufValueType::kArray);
  append<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kInt32));
  append<uint64_t>(kv_bytes_, values.size());
  for (int32_t v : values)
    append(kv_bytes_, v);
}
void GgufWriter::set_f32_array(const std::string& key, const std::vector<float>& values) {
  put_key(key, GgufValueType::kArray);
  append<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufValueType::kFloat32));
  append<uint64_t>(kv_bytes_, values.size());
  for (float v : values)
    append(kv_bytes_, v);
}

Status GgufWriter::add_tensor(const std::string& gguf_name, DType dtype,
                              std::vector<int64_t> hf_shape) {
  if (hf_shape.empty() || hf_shape.size() > kGgufMaxDims) {
    return invalid_argument(gguf_name + ": GGUF tensors have 1 to 4 dimensions");
  }
  int64_t n = 1;
  for (int64_t d : hf_shape)
    n *= d;
  if (hf_shape.back() % dtype_block_size(dtype) != 0) {
    return invalid_argument(gguf_name + ": rows of " + std::to_string(hf_shape.back()) +
                            " values cannot be stored as " + std::string(dtype_name(dtype)) +
                            " (needs a multiple of " + std::to_string(dtype_block_size(dtype)) +
                            ")");
  }
  return add_tensor_raw(gguf_name, ggml_type_of(dtype), std::move(hf_shape),
                        dtype_num_bytes(dtype, n));
}

Status GgufWriter::add_tensor_raw(const std::string& gguf_name, uint32_t ggml_type,
                                  std::vector<int64_t> hf_shape, int64_t num_bytes) {
  if (out_)
    return failed_precondition(path_ + ": add_tensor after write_header");
  for (const auto& t : tensors_) {
    if (t.name == gguf_name)
      return invalid_argument(path_ + ": duplicate tensor " + gguf_name);
  }
  tensors_.push_back({gguf_name, ggml_type, std::move(hf_shape), num_bytes});
  return Status::ok();
}

Status GgufWriter::write_header() {
  if (out_)
    return failed_precondition(path_ + ": header already written");
  std::vector<uint8_t> head;
  append<uint32_t>(head, kGgufMagic);
  append<uint32_t>(head, 3);
  append<uint64_t>(head, tensors_.size());
  append<uint64_t>(head, num_kv_);
  head.insert(head.end(), kv_bytes_.begin(), kv_bytes_.end());
  int64_t offset = 0;
  for (const auto& t : tensors_) {
    append_string(head, t.name);
    append<uint32_t>(head, static_cast<uint32_t>(t.hf_shape.size()));
    for (auto it = t.hf_shape.rbegin(); it != t.hf_shape.rend(); ++it) {
      append<uint64_t>(head, static_cast<uint64_t>(*it));
    }
    append<uint32_t>(head, t.ggml_type);
    append<uint64_t>(head, static_cast<uint64_t>(offset));
    offset += (t.num_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  head.resize((head.size() + alignment_ - 1) / alignment_ * alignment_, 0);
  ASSIGN_OR_RETURN(out_, FileWriter::create(path_));
  RETURN_IF_ERROR(out_->write(head.data(), static_cast<int64_t>(head.size())));
  current_ = 0;
  current_written_ = 0;
  while (current_ < tensors_.size() && tensors_[current_].num_bytes == 0)
    ++current_;
  return Status::ok();
}

Status GgufWriter::write_data(const void* data, int64_t num_bytes) {
  if (!out_)
    return failed_precondition(path_ + ": write_data before write_header");
  const auto* p = static_cast<const uint8_t*>(data);
  while (num_bytes > 0) {
    if (current_ >= tensors_.size()) {
      return invalid_argument(path_ + ": more data written than the declared tensors hold");
    }
    const int64_t size = tensors_[current_].num_bytes;
    int64_t n = std::min(num_bytes, size - current_written_);
    RETURN_IF_ERROR(out_->write(p, n));
    p += n;
    num_bytes -= n;
    current_written_ += n;
    while (current_ < tensors_.size() && current_written_ == tensors_[current_].num_bytes) {
      const int64_t padded = (current_written_ + alignment_ - 1) / alignment_ * alignment_;
      RETURN_IF_ERROR(out_->write_zeros(padded - current_written_));
      ++current_;
      current_written_ = 0;
    }
  }
  return Status::ok();
}

Status GgufWriter::finish() {
  if (!out_)
    RETURN_IF_ERROR(write_header());
  if (current_ < tensors_.size()) {
    return failed_precondition(path_ + ": tensor " + tensors_[current_].name +
                               " was not written in full");
  }
  return out_->close();
}

void add_gguf_model_metadata(GgufWriter& w, const ModelConfig& c, const std::string& model_name) {
  const std::string arch(gguf_architecture_name(c.architecture));
  w.set_string("general.architecture", arch);
  w.set_string("general.name", model_name);
  auto u32 = [](int v) { return static_cast<uint32_t>(v); };
  w.set_u32(arch + ".vocab_size", u32(c.vocab_size));
  w.set_u32(arch + ".context_length", u32(c.max_position_embeddings));
  w.set_u32(arch + ".embedding_length", u32(c.hidden_size));
  w.set_u32(arch + ".block_count", u32(c.num_hidden_layers));
  w.set_u32(arch + ".feed_forward_length", u32(c.intermediate_size));
  w.set_u32(arch + ".attention.head_count", u32(c.num_attention_heads));
  w.set_u32(arch + ".attention.head_count_kv", u32(c.num_key_value_heads));
  w.set_u32(arch + ".attention.key_length", u32(c.head_dim));
  w.set_u32(arch + ".attention.value_length", u32(c.head_dim));
  w.set_u32(arch + ".rope.dimension_count", u32(c.head_dim));
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.set_f32(arch + ".rope.freq_base", static_cast<float>(c.rope_theta));
  if (c.rope_scaling.is_llama3) {
    w.set_f32("crescent.rope_scaling.factor", static_cast<float>(c.rope_scaling.factor));
    w.set_f32("crescent.rope_scaling.low_freq_factor",
              static_cast<float>(c.rope_scaling.low_freq_factor));
    w.set_f32("crescent.rope_scaling.high_freq_factor",
              static_cast<float>(c.rope_scaling.high_freq_factor));
    w.set_u32("crescent.rope_scaling.original_max_position_embeddings",
              u32(c.rope_scaling.original_max_position_embeddings));
  }
  if (c.is_multimodal()) {
    std::vector<int32_t> sections(c.mrope_section.begin(), c.mrope_section.end());
    sections.resize(std::max<size_t>(sections.size(), 4), 0);
    w.set_i32_array(arch + ".rope.dimension_sections", sections);
    w.set_string("crescent.architecture", architecture_name(c.architecture));
  }
  std::vector<int32_t> eos(c.eos_token_ids.begin(), c.eos_token_ids.end());
  w.set_i32_array("crescent.eos_token_ids", eos);
  if (!c.torch_dtype.empty())
    w.set_string("crescent.torch_dtype", c.torch_dtype);
}

namespace {

// tokenizer.ggml.pre for a tokenizer.json: llama.cpp's name for its split regex (tokenizer_gguf.h
// maps the names back), from the first Split or ByteLevel pre-tokenizer.
std::string gguf_pre_tokenizer_name(const json& pre) {
  if (!pre.is_object())
    return "default";
  const std::string type = pre.value("type", "");
  if (type == "Sequence" && pre.contains("pretokenizers")) {
    for (const json& sub : pre["pretokenizers"]) {
      std::string name = gguf_pre_tokenizer_name(sub);
      if (name != "default")
        return name;
    }
    return "default";
  }
  if (type == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex")) {
    const std::optional<SplitPattern> p =
        recognize_split_pattern(pre["pattern"]["Regex"].get<std::string>());
    if (p == SplitPattern::kQwen2)
      return "qwen2";
    if (p == SplitPattern::kLlama3)
      return "llama-bpe";
    if (p == SplitPattern::kGpt2)
      return "gpt2";
  }
  if (type == "ByteLevel" && pre.value("use_regex", true))
    return "gpt2";
  return "default";
}

// True if the tokenizer.json is byte-level BPE (a ByteLevel pre-tokenizer or decoder), the only
// kind tokenizer.ggml.model "gpt2" describes; SentencePiece-style BPE (Metaspace, byte fallback)
// would be llama.cpp's "llama" model, which neither side here implements.
bool is_byte_level(const json& tok) {
  auto has_byte_level = [](const json& j, const char* list_key, auto&& self) -> bool {
    if (!j.is_object())
      return false;
    if (j.value("type", "") == "ByteLevel")
      return true;
    if (j.contains(list_key) && j[list_key].is_array()) {
      for (const json& sub : j[list_key]) {
        if (self(sub, list_key, self))
          return true;
      }
    }
    return false;
  };
  return has_byte_level(tok.value("pre_tokenizer", json()), "pretokenizers", has_byte_level) ||
         has_byte_level(tok.value("decoder", json()), "decoders", has_byte_level);
}

// The ids a TemplateProcessing post-processor puts before and after the text (tokenizer.json's
// way of saying add_bos_token / add_eos_token).
void template_special_ids(const json& post, std::vector<int64_t>* prefix,
                          std::vector<int64_t>* suffix) {
  if (!post.is_object())
    return;
  if (post.value("type", "") == "Sequence" && post.contains("processors")) {
    for (const json& sub : post["processors"])
      template_special_ids(sub, prefix, suffix);
    return;
  }
  if (post.value("type", "") != "TemplateProcessing" || !post.contains("single"))
    return;
  bool seen_sequence = false;
  for (const json& item : post["single"]) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const std::string name = item["SpecialToken"].value("id", "");
      if (!post.contains("special_tokens") || !post["special_tokens"].contains(name))
        continue;
      for (const json& id : post["special_tokens"][name].value("ids", json::array()))
        (seen_sequence ? suffix : prefix)->push_back(id.get<int64_t>());
    }
  }
}

}  // namespace

Status add_gguf_tokenizer_metadata(GgufWriter& w, std::string_view tokenizer_json,
                                   const ModelConfig& c, std::string_view chat_template) {
  constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;
  std::vector<std::string> tokens(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(c.vocab_size), 0);
  std::vector<std::string> merges;
  std::string pre;
  std::vector<int64_t> prefix, suffix;
  try {
    json tok = json::parse(tokenizer_json);
    const json& model = tok.at("model");
    if (model.value("type", "") != "BPE" || !is_byte_level(tok)) {
      return unimplemented(
          "tokenizer.json: only byte-level BPE tokenizers (GPT-2, Llama-3, Qwen) can be written "
          "to GGUF; SentencePiece-style ones would need tokenizer.ggml.model 'llama'");
    }
    auto place = [&](int64_t id, const std::string& text, int32_t type) -> Status {
      if (id < 0 || id >= c.vocab_size) {
        return invalid_argument("tokenizer.json: token id " + std::to_string(id) +
                                " is outside the model's vocabulary of " +
                                std::to_string(c.vocab_size));
      }
      tokens[static_cast<size_t>(id)] = text;
      types[static_cast<size_t>(id)] = type;
      return Status::ok();
    };
    for (const auto& [text, id] : model.at("vocab").items()) {
      RETURN_IF_ERROR(place(id.get<int64_t>(), text, kNormal));
    }
    if (auto it = tok.find("added_tokens"); it != tok.end() && it->is_array()) {
      for (const auto& t : *it) {
        RETURN_IF_ERROR(place(t.at("id").get<int64_t>(), t.at("content").get<std::string>(),
                              t.value("special", false) ? kControl : kUserDefined));
      }
    }
    for (const auto& m : model.at("merges")) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else {
        merges.push_back(m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
      }
    }
    pre = gguf_pre_tokenizer_name(tok.value("pre_tokenizer", json()));
    template_special_ids(tok.value("post_processor", json()), &prefix, &suffix);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("tokenizer.json: ") + e.what());
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 0) {
      tokens[i] = "[PAD" + std::to_string(i) + "]";
      types[i] = kUnused;
    }
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_i32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", merges);
  if (c.bos_token_id)
    w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*c.bos_token_id));
  if (!c.eos_token_ids.empty()) {
    w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids[0]));
  }
  // What the tokenizer.json's post-processor adds, so both tokenizers give the same ids.
  const bool add_bos = prefix.size() == 1 && c.bos_token_id && prefix[0] == *c.bos_token_id;
  const bool add_eos =
      suffix.size() == 1 && !c.eos_token_ids.empty() && suffix[0] == c.eos_token_ids[0];
  if ((!prefix.empty() && !add_bos) || (!suffix.empty() && !add_eos)) {
    return unimplemented(
        "tokenizer.json: a post-processor adding other tokens than the model's BOS/EOS cannot "
        "be written to GGUF");
  }
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
  w.set_bool("tokenizer.ggml.add_eos_token", add_eos);
  if (!chat_template.empty())
    w.set_string("tokenizer.chat_template", chat_template);
  return Status::ok();
}

Status write_gguf(const std::string& path, const ModelConfig& config, const TensorSource& source,
                  const GgufWeightType& type, std::string_view tokenizer_json,
                  const std::string& model_name, std::string_view chat_template,
                  const std::function<void(int64_t, int64_t)>& progress) {
  GgufWriter w(path);
  add_gguf_model_metadata(w, config, model_name);
  w.set_u32("general.file_type", gguf_file_type(type));
  w.set_u32("general.quantization_version", 2);
  RETURN_IF_ERROR(add_gguf_tokenizer_metadata(w, tokenizer_json, config, chat_template));
  return write_gguf_tensors(w, config, source, type, progress);
}

Status write_gguf_tensors(GgufWriter& w, const ModelConfig& config, const TensorSource& source,
                          const GgufWeightType& type,
                          const std::function<void(int64_t, int64_t)>& progress) {
  struct Plan {
    TensorView view;
    DType out;
    int64_t heads;
  };
  std::vector<Plan> plans;
  for (const std::string& name : source.names()) {
    if (name.rfind("visual.", 0) == 0)
      continue;  // the vision tower goes to the mmproj file
    std::optional<std::string> gguf_name = hf_to_gguf_name(name);
    if (!gguf_name)
      return unimplemented("tensor " + name + " has no GGUF name");
    ASSIGN_OR_RETURN(TensorView view, source.get(name));
    if (view.shape.empty() || view.shape.size() > 2) {
      return invalid_argument(name + " has shape " + shape_to_string(view.shape) +
                              "; only 1-D and 2-D tensors are written to GGUF");
    }
    const DType out = gguf_tensor_dtype(type, config, name, view.shape);
    RETURN_IF_ERROR(w.add_tensor(*gguf_name, out, view.shape));
    plans.push_back({std::move(view), out, gguf_qk_permute_heads(config, name)});
  }
  std::vector<float> rope_factors;
  if (config.rope_scaling.is_llama3) {
    rope_factors = llama3_rope_freq_factors(config);
    RETURN_IF_ERROR(w.add_tensor("rope_freqs.weight", DType::kF32,
                                 {static_cast<int64_t>(rope_factors.size())}));
  }
  RETURN_IF_ERROR(w.write_header());
  int64_t total_bytes = 0;
  for (const Plan& p : plans)
    total_bytes += dtype_num_bytes(p.out, p.view.num_elements());
  int64_t done_bytes = 0;

  std::vector<uint8_t> converted;
  for (const Plan& p : plans) {
    const TensorView& v = p.view;
    // A permuted 1-D bias is handled as a column of single-value rows.
    const bool column = v.shape.size() == 1 && p.heads > 0;
    const int64_t num_rows = v.shape.size() == 2 || column ? v.shape[0] : 1;
    const int64_t num_cols = v.num_elements() / std::max<int64_t>(num_rows, 1);
    if (p.heads > 0 && num_rows % (2 * p.heads) != 0) {
      return invalid_argument(v.name + " has " + std::to_string(num_rows) +
                              " rows, which cannot be split into " + std::to_string(p.heads) +
                              " heads");
    }
    const int64_t src_row_bytes = dtype_num_bytes(v.dtype, num_cols);
    const int64_t out_row_bytes = dtype_num_bytes(p.out, num_cols);
    // Rows are converted in batches of about 4 MB, in parallel, then written in order.
    const int64_t batch_rows =
        std::clamp<int64_t>((4 << 20) / std::max<int64_t>(out_row_bytes, 1), 1, num_rows);
    converted.resize(static_cast<size_t>(batch_rows * out_row_bytes));
    for (int64_t first = 0; first < num_rows; first += batch_rows) {
      const int64_t n = std::min(batch_rows, num_rows - first);
      auto convert = [&](int64_t lo, int64_t hi) {
        std::vector<float> row(static_cast<size_t>(num_cols));
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t g = first + r;
          const int64_t src = p.heads > 0 ? llama_qk_hf_row(g, num_rows, p.heads) : g;
          TensorView src_row{v.name,
                             v.dtype,
                             {num_cols},
                             static_cast<const uint8_t*>(v.data) + src * src_row_bytes,
                             src_row_bytes};
          tensor_to_float(src_row, row.data());
          float_to_dtype(row.data(), num_cols, p.out, converted.data() + r * out_row_bytes);
        }
      };
      if (n * num_cols >= (1 << 18)) {
        ThreadPool::default_pool().parallel_range(n, convert);
      } else {
        convert(0, n);
      }
      RETURN_IF_ERROR(w.write_data(converted.data(), n * out_row_bytes));
    }
    done_bytes += dtype_num_bytes(p.out, v.num_elements());
    if (progress)
      progress(done_bytes, total_bytes);
  }
  if (!rope_factors.empty()) {
    RETURN_IF_ERROR(w.write_data(rope_factors.data(),
                                 static_cast<int64_t>(rope_factors.size() * sizeof(float))));
  }
  return w.finish();
}

}  // namespace crescent::model
