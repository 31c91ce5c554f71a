#include "model/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "kernels/quants.h"
#include "model/gguf_mmproj.h"

namespace crescent::model {

using nlohmann::json;

namespace {

struct GgmlTypeTraits {
  const char* name;
  int64_t block_size;  // elements per block; 0 = size unknown to us
  int64_t type_size;   // bytes per block
};

constexpr const char* kSupportedTypes =
    " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, "
    "IQ4_NL)";

const GgmlTypeTraits* ggml_traits(uint32_t type) {
  static const std::map<uint32_t, GgmlTypeTraits> kTypes = {
      {0, {"F32", 1, 4}},       {1, {"F16", 1, 2}},       {2, {"Q4_0", 32, 18}},
      {3, {"Q4_1", 32, 20}},    {6, {"Q5_0", 32, 22}},    {7, {"Q5_1", 32, 24}},
      {8, {"Q8_0", 32, 34}},    {9, {"Q8_1", 32, 36}},    {10, {"Q2_K", 256, 84}},
      {11, {"Q3_K", 256, 110}}, {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
      {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}}, {16, {"IQ2_XXS", 0, 0}},
      {17, {"IQ2_XS", 0, 0}},   {18, {"IQ3_XXS", 0, 0}},  {19, {"IQ1_S", 0, 0}},
      {20, {"IQ4_NL", 32, 18}}, {21, {"IQ3_S", 0, 0}},    {22, {"IQ2_S", 0, 0}},
      {23, {"IQ4_XS", 0, 0}},   {24, {"I8", 1, 1}},       {25, {"I16", 1, 2}},
      {26, {"I32", 1, 4}},      {27, {"I64", 1, 8}},      {28, {"F64", 1, 8}},
      {29, {"IQ1_M", 0, 0}},    {30, {"BF16", 1, 2}},     {34, {"TQ1_0", 0, 0}},
      {35, {"TQ2_0", 0, 0}}};
  auto it = kTypes.find(type);
  return it == kTypes.end() ? nullptr : &it->second;
}

int64_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

// The shortest decimal that reads back as the same float, as a double: 1e-6f -> 1e-6.
double float_to_short_double(float f) {
  char buf[32];
  for (int p = 1; p <= 9; ++p) {
    std::snprintf(buf, sizeof(buf), "%.*g", p, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f)
      return std::strtod(buf, nullptr);
  }
  return f;
}

class Cursor {
 public:
  Cursor(const MappedFile& file) : file_(file) {}
  int64_t pos() const { return pos_; }
  int64_t remaining() const { return file_.size() - pos_; }

  template <typename T>
  Result<T> read(std::string_view what) {
    if (remaining() < static_cast<int64_t>(sizeof(T)))
      return truncated(what);
    T v;
    std::memcpy(&v, file_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  Result<std::string_view> read_string(std::string_view what) {
    ASSIGN_OR_RETURN(uint64_t len, read<uint64_t>(what));
    if (len > static_cast<uint64_t>(remaining()))
      return truncated(what);
    std::string_view s(reinterpret_cast<const char*>(file_.data()) + pos_, len);
    pos_ += static_cast<int64_t>(len);
    return s;
  }
  Status skip(int64_t n, std::string_view what) {
    if (n < 0 || n > remaining())
      return truncated(what);
    pos_ += n;
    return Status::ok();
  }
  Status truncated(std::string_view what) const {
    return data_loss(file_.path() + ": truncated GGUF header while reading " + std::string(what) +
                     " at offset " + std::to_string(pos_));
  }

 private:
  const MappedFile& file_;
  int64_t pos_ = 0;
};

const std::vector<std::pair<std::string, std::string>>& layer_name_pairs() {
  static const std::vector<std::pair<std::string, std::string>> kPairs = {
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
  return kPairs;
}

const std::vector<std::pair<std::string, std::string>>& global_name_pairs() {
  static const std::vector<std::pair<std::string, std::string>> kPairs = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
  };
  return kPairs;
}

// Splits "<prefix><N>.<rest>" into N and rest.
bool split_layer(std::string_view name, std::string_view prefix, int64_t* layer,
                 std::string_view* rest) {
  if (name.substr(0, prefix.size()) != prefix)
    return false;
  name.remove_prefix(prefix.size());
  size_t i = 0;
  int64_t n = 0;
  while (i < name.size() && i < 9 && name[i] >= '0' && name[i] <= '9') {
    n = n * 10 + (name[i] - '0');
    ++i;
  }
  if (i == 0 || i >= name.size() || name[i] != '.')
    return false;
  if (i > 1 && name[0] == '0')
    return false;
  *layer = n;
  *rest = name.substr(i + 1);
  return true;
}

}  // namespace

std::string ggml_type_name(uint32_t ggml_type) {
  const GgmlTypeTraits* t = ggml_traits(ggml_type);
  return t ? std::string(t->name) : "type " + std::to_string(ggml_type);
}

std::string_view gguf_architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kQwen2Vl:
    case Architecture::kQwen25Vl:
      return "qwen2vl";
  }
  return "?";
}

std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name) {
  for (const auto& [g, h] : global_name_pairs()) {
    if (gguf_name == g)
      return h;
  }
  int64_t layer = 0;
  std::string_view rest;
  if (!split_layer(gguf_name, "blk.", &layer, &rest))
    return std::nullopt;
  for (const auto& [g, h] : layer_name_pairs()) {
    if (rest == g)
      return "model.layers." + std::to_string(layer) + "." + h;
  }
  return std::nullopt;
}

std::optional<std::string> hf_to_gguf_name(std::string_view hf_name) {
  for (const auto& [g, h] : global_name_pairs()) {
    if (hf_name == h)
      return g;
  }
  int64_t layer = 0;
  std::string_view rest;
  if (!split_layer(hf_name, "model.layers.", &layer, &rest))
    return std::nullopt;
  for (const auto& [g, h] : layer_name_pairs()) {
    if (rest == h)
      return "blk." + std::to_string(layer) + "." + g;
  }
  return std::nullopt;
}

int64_t llama_qk_hf_row(int64_t gguf_row, int64_t num_rows, int64_t num_heads) {
  // llama.cpp: w.reshape(heads, 2, hd/2, ...).swapaxes(1, 2): GGUF row (h, j, k) is HF row
  // (h, k, j), i.e. the two halves of each head are interleaved.
  const int64_t head_dim = num_rows / num_heads;
  const int64_t h = gguf_row / head_dim;
  const int64_t r = gguf_row % head_dim;
  return h * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

int64_t gguf_qk_permute_heads(const ModelConfig& config, std::string_view hf_name) {
  if (config.architecture != Architecture::kLlama)
    return 0;
  auto ends_with = [&](std::string_view s) {
    return hf_name.size() >= s.size() && hf_name.substr(hf_name.size() - s.size()) == s;
  };
  if (ends_with(".self_attn.q_proj.weight") || ends_with(".self_attn.q_proj.bias")) {
    return config.num_attention_heads;
  }
  if (ends_with(".self_attn.k_proj.weight") || ends_with(".self_attn.k_proj.bias")) {
    return config.num_key_value_heads;
  }
  return 0;
}

void quantize_q8_0(const float* x, int64_t num_values, Q8Block* out) {
  for (int64_t b = 0; b < num_values / kQ8BlockSize; ++b) {
    const float* v = x + b * kQ8BlockSize;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8BlockSize; ++i)
      amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].scale_f16 = float_to_f16(d);
    for (int64_t i = 0; i < kQ8BlockSize; ++i) {
      out[b].quants[i] = static_cast<int8_t>(std::round(v[i] * id));
    }
  }
}

void float_to_dtype(const float* values, int64_t num_values, DType dtype, void* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, values, static_cast<size_t>(num_values) * 4);
      break;
    case DType::kF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < num_values; ++i)
        o[i] = float_to_f16(values[i]);
      break;
    }
    case DType::kBF16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < num_values; ++i)
        o[i] = float_to_bf16(values[i]);
      break;
    }
    case DType::kQ8_0:
      quantize_q8_0(values, num_values, static_cast<Q8Block*>(out));
      break;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
      kernels::quantize_row(dtype, values, num_values, out);
      break;
  }
}

std::vector<float> llama3_rope_freq_factors(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const double low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
  const double high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < c.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(i) / c.head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(static_cast<float>(rs.factor));
    } else {
      const double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                            (rs.high_freq_factor - rs.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / rs.factor + smooth)));
    }
  }
  return factors;
}

// ---------------------------------------------------------------------------------------------
// Reader

GgufFile::~GgufFile() = default;

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  ASSIGN_OR_RETURN(f->file_, MappedFile::open(path));
  RETURN_IF_ERROR(f->parse());
  return f;
}

Status GgufFile::parse() {
  const std::string& path = file_->path();
  Cursor c(*file_);
  ASSIGN_OR_RETURN(uint32_t magic, c.read<uint32_t>("magic"));
  if (magic != kGgufMagic)
    return data_loss(path + ": not a GGUF file (bad magic)");
  ASSIGN_OR_RETURN(version_, c.read<uint32_t>("version"));
  if (version_ != 2 && version_ != 3) {
    return unimplemented(path + ": GGUF version " + std::to_string(version_) +
                         " is not supported (2 and 3 are)");
  }
  ASSIGN_OR_RETURN(uint64_t num_tensors, c.read<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(uint64_t num_kv, c.read<uint64_t>("metadata count"));
  // Every entry takes at least 8 bytes, so larger counts cannot be honest.
  if (num_tensors > static_cast<uint64_t>(file_->size()) / 8 ||
      num_kv > static_cast<uint64_t>(file_->size()) / 8) {
    return data_loss(path + ": tensor count " + std::to_string(num_tensors) +
                     " or metadata count " + std::to_string(num_kv) +
                     " is larger than the file can hold");
  }

  for (uint64_t i = 0; i < num_kv; ++i) {
    ASSIGN_OR_RETURN(std::string_view key_view, c.read_string("metadata key"));
    std::string key(key_view);
    const int64_t value_begin = c.pos();
    ASSIGN_OR_RETURN(uint32_t type_raw, c.read<uint32_t>("type of " + key));
    auto type = static_cast<GgufValueType>(type_raw);
    auto read_scalar = [&](GgufValueType t) -> Result<Scalar> {
      switch (t) {
        case GgufValueType::kUint8:
          return Scalar(uint64_t{*c.read<uint8_t>(key)});
        case GgufValueType::kInt8:
          return Scalar(int64_t{*c.read<int8_t>(key)});
        case GgufValueType::kUint16:
          return Scalar(uint64_t{*c.read<uint16_t>(key)});
        case GgufValueType::kInt16:
          return Scalar(int64_t{*c.read<int16_t>(key)});
        case GgufValueType::kUint32:
          return Scalar(uint64_t{*c.read<uint32_t>(key)});
        case GgufValueType::kInt32:
          return Scalar(int64_t{*c.read<int32_t>(key)});
        case GgufValueType::kUint64:
          return Scalar(*c.read<uint64_t>(key));
        case GgufValueType::kInt64:
          return Scalar(*c.read<int64_t>(key));
        case GgufValueType::kFloat32:
          return Scalar(float_to_short_double(*c.read<float>(key)));
        case GgufValueType::kFloat64:
          return Scalar(*c.read<double>(key));
        case GgufValueType::kBool:
          return Scalar(*c.read<uint8_t>(key) != 0);
        case GgufValueType::kString: {
          ASSIGN_OR_RETURN(std::string_view s, c.read_string(key));
          return Scalar(std::string(s));
        }
        default:
          return data_loss(path + ": metadata " + key + " has unknown type " +
                           std::to_string(static_cast<uint32_t>(t)));
      }
    };
    if (type == GgufValueType::kArray) {
      ASSIGN_OR_RETURN(uint32_t elem_raw, c.read<uint32_t>("array type of " + key));
      ASSIGN_OR_RETURN(uint64_t count, c.read<uint64_t>("array length of " + key));
      auto elem = static_cast<GgufValueType>(elem_raw);
      ArrayRef ref{elem, 0, c.pos()};
      if (elem == GgufValueType::kString) {
        if (count > static_cast<uint64_t>(c.remaining()) / 8)
          return c.truncated(key);
        for (uint64_t k = 0; k < count; ++k)
          RETURN_IF_ERROR(c.read_string(key));
      } else if (int64_t size = scalar_size(elem); size > 0) {
        if (count > static_cast<uint64_t>(c.remaining() / size))
          return c.truncated(key);
        RETURN_IF_ERROR(c.skip(static_cast<int64_t>(count) * size, key));
      } else {
        return unimplemented(path + ": metadata " + key + " is an array of type " +
                             std::to_string(elem_raw) + " (nested arrays are not supported)");
      }
      ref.count = static_cast<int64_t>(count);
      arrays_[key] = ref;
      raw_entries_.push_back({key, value_begin, c.pos()});
      continue;
    }
    // Only well-formed scalars are readable; a read error above is reported through *value.
    if (scalar_size(type) > 0 && c.remaining() < scalar_size(type))
      return c.truncated(key);
    ASSIGN_OR_RETURN(Scalar value, read_scalar(type));
    scalars_[key] = std::move(value);
    raw_entries_.push_back({key, value_begin, c.pos()});
  }

  int64_t alignment = 32;
  if (has_key("general.alignment")) {
    ASSIGN_OR_RETURN(alignment, get_int("general.alignment"));
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0 || alignment > (1 << 20)) {
      return data_loss(path + ": general.alignment " + std::to_string(alignment) +
                       " is not a power of two");
    }
  }

  std::set<std::string> seen;
  for (uint64_t i = 0; i < num_tensors; ++i) {
    GgufTensorInfo info;
    ASSIGN_OR_RETURN(std::string_view name, c.read_string("tensor name"));
    info.name = std::string(name);
    if (!seen.insert(info.name).second)
      return data_loss(path + ": duplicate tensor " + info.name);
    ASSIGN_OR_RETURN(uint32_t num_dims, c.read<uint32_t>("dims of " + info.name));
    if (num_dims < 1 || num_dims > kGgufMaxDims) {
      return data_loss(path + ": tensor " + info.name + " has " + std::to_string(num_dims) +
                       " dimensions");
    }
    int64_t num_elements = 1;
    for (uint32_t d = 0; d < num_dims; ++d) {
      ASSIGN_OR_RETURN(uint64_t dim, c.read<uint64_t>("dims of " + info.name));
      if (dim > (uint64_t{1} << 40) ||
          (dim != 0 && num_elements > (int64_t{1} << 50) / static_cast<int64_t>(dim))) {
        return data_loss(path + ": tensor " + info.name + " has an absurd shape");
      }
      info.dims.push_back(static_cast<int64_t>(dim));
      num_elements *= static_cast<int64_t>(dim);
    }
    ASSIGN_OR_RETURN(info.ggml_type, c.read<uint32_t>("type of " + info.name));
    ASSIGN_OR_RETURN(uint64_t offset, c.read<uint64_t>("offset of " + info.name));
    if (offset % static_cast<uint64_t>(alignment) != 0 || offset > (uint64_t{1} << 60)) {
      return data_loss(path + ": tensor " + info.name + " offset " + std::to_string(offset) +
                       " is not aligned to " + std::to_string(alignment));
    }
    info.offset = static_cast<int64_t>(offset);
    if (const GgmlTypeTraits* t = ggml_traits(info.ggml_type); t && t->block_size > 0) {
      if (info.dims[0] % t->block_size != 0) {
        return data_loss(path + ": tensor " + info.name + " row of " +
                         std::to_string(info.dims[0]) + " values is not a whole number of " +
                         t->name + " blocks");
      }
      info.num_bytes = num_elements / t->block_size * t->type_size;
    }
    tensors_.push_back(std::move(info));
  }

  const int64_t data_start = (c.pos() + alignment - 1) / alignment * alignment;
  const int64_t data_size = file_->size() - std::min(data_start, file_->size());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    const int64_t size = std::max<int64_t>(t.num_bytes, 0);
    if (t.offset > data_size || size > data_size - t.offset) {
      return data_loss(path + ": tensor " + t.name + " (" + std::to_string(size) +
                       " bytes at data offset " + std::to_string(t.offset) +
                       ") runs past the end of the file (" + std::to_string(data_size) +
                       " data bytes): the file is truncated or corrupt");
    }
    ranges.emplace_back(t.offset, t.offset + size);
    t.offset += data_start;
    if (auto hf = gguf_to_hf_name(t.name))
      by_hf_name_[*hf] = i;
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (ranges[order[i]].first < ranges[order[i - 1]].second) {
      return data_loss(path + ": tensors " + tensors_[order[i - 1]].name + " and " +
                       tensors_[order[i]].name + " overlap");
    }
  }

  if (has_key("general.architecture")) {
    ASSIGN_OR_RETURN(architecture_, get_string("general.architecture"));
    if (architecture_ == "llama") {
      ASSIGN_OR_RETURN(num_heads_, get_int("llama.attention.head_count"));
      num_kv_heads_ = num_heads_;
      if (has_key("llama.attention.head_count_kv")) {
        ASSIGN_OR_RETURN(num_kv_heads_, get_int("llama.attention.head_count_kv"));
      }
      if (num_heads_ <= 0 || num_kv_heads_ <= 0) {
        return data_loss(path + ": llama.attention.head_count(_kv) must be positive");
      }
    }
  }
  return Status::ok();
}

Result<TensorView> GgufFile::get(const std::string& hf_name) const {
  auto it = by_hf_name_.find(hf_name);
  if (it == by_hf_name_.end())
    return not_found(path() + ": no tensor " + hf_name);
  const GgufTensorInfo& info = tensors_[it->second];
  std::optional<DType> dtype = dtype_of_ggml(info.ggml_type);
  if (!dtype) {
    return unimplemented(path() + ": tensor " + info.name + " (" + hf_name + ") has ggml type " +
                         ggml_type_name(info.ggml_type) + kSupportedTypes);
  }
  TensorView v;
  v.name = hf_name;
  v.dtype = *dtype;
  v.shape.assign(info.dims.rbegin(), info.dims.rend());
  v.data = file_->data() + info.offset;
  v.num_bytes = info.num_bytes;

  int64_t heads = 0;
  if (architecture_ == "llama") {
    ModelConfig probe;
    probe.architecture = Architecture::kLlama;
    probe.num_attention_heads = static_cast<int>(num_heads_);
    probe.num_key_value_heads = static_cast<int>(num_kv_heads_);
    heads = gguf_qk_permute_heads(probe, hf_name);
  }
  if (heads == 0)
    return v;
  const int64_t num_rows = v.shape[0];
  if (v.shape.size() > 2 || num_rows % (2 * heads) != 0) {
    return data_loss(path() + ": tensor " + info.name + " has shape " + shape_to_string(v.shape) +
                     ", which cannot be split into " + std::to_string(heads) + " heads");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto& buffer = unpermuted_[hf_name];
  if (!buffer) {
    const int64_t row_bytes = v.num_bytes / num_rows;
    auto out = std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(v.num_bytes));
    const auto* src = static_cast<const uint8_t*>(v.data);
    for (int64_t g = 0; g < num_rows; ++g) {
      std::memcpy(out->data() + llama_qk_hf_row(g, num_rows, heads) * row_bytes,
                  src + g * row_bytes, static_cast<size_t>(row_bytes));
    }
    buffer = std::move(out);
  }
  v.data = buffer->data();
  return v;
}

std::vector<GgufFile::RawMetadata> GgufFile::raw_metadata() const {
  std::vector<RawMetadata> out;
  out.reserve(raw_entries_.size());
  for (const RawEntry& e : raw_entries_) {
    out.push_back({e.key, std::string_view(reinterpret_cast<const char*>(file_->data()) + e.begin,
                                           static_cast<size_t>(e.end - e.begin))});
  }
  return out;
}

std::vector<std::string> GgufFile::names() const {
  std::vector<std::string> out;
  for (const auto& [name, index] : by_hf_name_)
    out.push_back(name);
  return out;
}

Result<TensorView> GgufFile::get_by_gguf_name(const std::string& gguf_name) const {
  auto it = std::find_if(tensors_.begin(), tensors_.end(),
                         [&](const GgufTensorInfo& t) { return t.name == gguf_name; });
  if (it == tensors_.end())
    return not_found(path() + ": no tensor " + gguf_name);
  std::optional<DType> dtype = dtype_of_ggml(it->ggml_type);
  if (!dtype) {
    return unimplemented(path() + ": tensor " + gguf_name + " has ggml type " +
                         ggml_type_name(it->ggml_type) + kSupportedTypes);
  }
  TensorView v;
  v.name = gguf_name;
  v.dtype = *dtype;
  v.shape.assign(it->dims.rbegin(), it->dims.rend());
  v.data = file_->data() + it->offset;
  v.num_bytes = it->num_bytes;
  return v;
}

bool GgufFile::has_key(const std::string& key) const {
  return scalars_.count(key) > 0 || arrays_.count(key) > 0;
}

Result<const GgufFile::Scalar*> GgufFile::scalar(const std::string& key) const {
  auto it = scalars_.find(key);
  if (it == scalars_.end()) {
    if (arrays_.count(key))
      return invalid_argument(path() + ": metadata " + key + " is an array");
    return not_found(path() + ": metadata key " + key + " is missing");
  }
  return &it->second;
}

Result<const GgufFile::ArrayRef*> GgufFile::array(const std::string& key) const {
  auto it = arrays_.find(key);
  if (it == arrays_.end()) {
    if (scalars_.count(key))
      return invalid_argument(path() + ": metadata " + key + " is not an array");
    return not_found(path() + ": metadata key " + key + " is missing");
  }
  return &it->second;
}

Result<int64_t> GgufFile::get_int(const std::string& key) const {
  ASSIGN_OR_RETURN(const Scalar* s, scalar(key));
  if (const auto* u = std::get_if<uint64_t>(s)) {
    if (*u > static_cast<uint64_t>(INT64_MAX))
      return invalid_argument(path() + ": " + key + " is too large");
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(s))
    return *i;
  return invalid_argument(path() + ": metadata " + key + " is not an integer");
}

Result<double> GgufFile::get_float(const std::string& key) const {
  ASSIGN_OR_RETURN(const Scalar* s, scalar(key));
  if (const auto* d = std::get_if<double>(s))
    return *d;
  if (const auto* u = std::get_if<uint64_t>(s))
    return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(s))
    return static_cast<double>(*i);
  return invalid_argument(path() + ": metadata " + key + " is not a number");
}

Result<std::string> GgufFile::get_string(const std::string& key) const {
  ASSIGN_OR_RETURN(const Scalar* s, scalar(key));
  if (const auto* str = std::get_if<std::string>(s))
    return *str;
  return invalid_argument(path() + ": metadata " + key + " is not a string");
}

Result<bool> GgufFile::get_bool(const std::string& key) const {
  ASSIGN_OR_RETURN(const Scalar* s, scalar(key));
  if (const auto* b = std::get_if<bool>(s))
    return *b;
  return invalid_argument(path() + ": metadata " + key + " is not a bool");
}

Result<int64_t> GgufFile::get_array_size(const std::string& key) const {
  ASSIGN_OR_RETURN(const ArrayRef* a, array(key));
  return a->count;
}

Result<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  ASSIGN_OR_RETURN(const ArrayRef* a, array(key));
  if (a->element_type != GgufValueType::kString) {
    return invalid_argument(path() + ": metadata " + key + " is not an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(a->count));
  int64_t pos = a->offset;  // validated by parse()
  for (int64_t i = 0; i < a->count; ++i) {
    uint64_t len = 0;
    std::memcpy(&len, file_->data() + pos, 8);
    out.emplace_back(reinterpret_cast<const char*>(file_->data()) + pos + 8, len);
    pos += 8 + static_cast<int64_t>(len);
  }
  return out;
}

Result<std::vector<double>> GgufFile::get_float_array(const std::string& key) const {
  ASSIGN_OR_RETURN(const ArrayRef* a, array(key));
  std::vector<double> out;
  const uint8_t* p = file_->data() + a->offset;  // validated by parse()
  for (int64_t i = 0; i < a->count; ++i) {
    if (a->element_type == GgufValueType::kFloat32) {
      float v;
      std::memcpy(&v, p + i * 4, 4);
      out.push_back(float_to_short_double(v));
    } else if (a->element_type == GgufValueType::kFloat64) {
      double v;
      std::memcpy(&v, p + i * 8, 8);
      out.push_back(v);
    } else {
      return invalid_argument(path() + ": metadata " + key + " is not an array of floats");
    }
  }
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  ASSIGN_OR_RETURN(const ArrayRef* a, array(key));
  std::vector<int64_t> out;
  const uint8_t* p = file_->data() + a->offset;
  const int64_t size = scalar_size(a->element_type);
  for (int64_t i = 0; i < a->count; ++i, p += size) {
    switch (a->element_type) {
      case GgufValueType::kUint8:
        out.push_back(*p);
        break;
      case GgufValueType::kInt8:
        out.push_back(static_cast<int8_t>(*p));
        break;
      case GgufValueType::kUint16: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        out.push_back(v);
        break;
      }
      case GgufValueType::kInt16: {
        int16_t v;
        std::memcpy(&v, p, 2);
        out.push_back(v);
        break;
      }
      case GgufValueType::kUint32: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        out.push_back(v);
        break;
      }
      case GgufValueType::kInt32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        out.push_back(v);
        break;
      }
      case GgufValueType::kUint64: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        out.push_back(static_cast<int64_t>(v));
        break;
      }
      case GgufValueType::kInt64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out.push_back(v);
        break;
      }
      default:
        return invalid_argument(path() + ": metadata " + key + " is not an array of integers");
    }
  }
  return out;
}

Result<ModelConfig> GgufFile::model_config() const {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string arch, get_string("general.architecture"));
  if (arch == "llama") {
    c.architecture = Architecture::kLlama;
  } else if (arch == "qwen2") {
    c.architecture = Architecture::kQwen2;
  } else if (arch == "qwen3") {
    c.architecture = Architecture::kQwen3;
  } else if (arch == "qwen2vl") {
    c.architecture = Architecture::kQwen2Vl;
    if (has_key("crescent.architecture")) {
      ASSIGN_OR_RETURN(std::string name, get_string("crescent.architecture"));
      if (name == architecture_name(Architecture::kQwen25Vl))
        c.architecture = Architecture::kQwen25Vl;
    }
  } else {
    return unimplemented(path() + ": general.architecture '" + arch +
                         "' is not supported (llama, qwen2, qwen3, qwen2vl are)");
  }
  c.architecture_name = std::string(architecture_name(c.architecture));
  auto int_key = [&](const std::string& suffix) -> Result<int> {
    ASSIGN_OR_RETURN(int64_t v, get_int(arch + "." + suffix));
    if (v <= 0 || v > INT32_MAX) {
      return invalid_argument(path() + ": " + arch + "." + suffix + " = " + std::to_string(v) +
                              " is out of range");
    }
    return static_cast<int>(v);
  };
  ASSIGN_OR_RETURN(c.hidden_size, int_key("embedding_length"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, int_key("block_count"));
  ASSIGN_OR_RETURN(c.intermediate_size, int_key("feed_forward_length"));
  ASSIGN_OR_RETURN(c.num_attention_heads, int_key("attention.head_count"));
  c.num_key_value_heads = c.num_attention_heads;
  if (has_key(arch + ".attention.head_count_kv")) {
    ASSIGN_OR_RETURN(c.num_key_value_heads, int_key("attention.head_count_kv"));
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  if (has_key(arch + ".attention.key_length")) {
    ASSIGN_OR_RETURN(c.head_dim, int_key("attention.key_length"));
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings, int_key("context_length"));
  ASSIGN_OR_RETURN(c.rms_norm_eps, get_float(arch + ".attention.layer_norm_rms_epsilon"));
  if (has_key(arch + ".rope.freq_base")) {
    ASSIGN_OR_RETURN(c.rope_theta, get_float(arch + ".rope.freq_base"));
  }

  if (has_key("crescent.rope_scaling.factor")) {
    c.rope_scaling.is_llama3 = true;
    ASSIGN_OR_RETURN(c.rope_scaling.factor, get_float("crescent.rope_scaling.factor"));
    ASSIGN_OR_RETURN(c.rope_scaling.low_freq_factor,
                     get_float("crescent.rope_scaling.low_freq_factor"));
    ASSIGN_OR_RETURN(c.rope_scaling.high_freq_factor,
                     get_float("crescent.rope_scaling.high_freq_factor"));
    ASSIGN_OR_RETURN(int64_t original,
                     get_int("crescent.rope_scaling.original_max_position_embeddings"));
    c.rope_scaling.original_max_position_embeddings = static_cast<int>(original);
  } else if (auto it = std::find_if(tensors_.begin(), tensors_.end(),
                                    [](const auto& t) { return t.name == "rope_freqs.weight"; });
             it != tensors_.end()) {
    // llama.cpp stores llama3 scaling only as per-pair factors. Recover the parameters by
    // assuming Llama 3.1/3.2's low/high/original values and checking every factor matches.
    if (it->ggml_type != kGgmlTypeF32 || it->dims.size() != 1 || it->dims[0] != c.head_dim / 2) {
      return unimplemented(path() + ": rope_freqs.weight has an unexpected type or shape");
    }
    std::vector<float> stored(static_cast<size_t>(it->dims[0]));
    std::memcpy(stored.data(), file_->data() + it->offset, stored.size() * 4);
    c.rope_scaling = {true, *std::max_element(stored.begin(), stored.end()), 1.0, 4.0, 8192};
    std::vector<float> expected = llama3_rope_freq_factors(c);
    for (size_t i = 0; i < stored.size(); ++i) {
      if (std::fabs(stored[i] - expected[i]) > 1e-3f * std::fabs(expected[i])) {
        return unimplemented(path() +
                             ": rope_freqs.weight does not match llama3 scaling with "
                             "low_freq_factor 1, high_freq_factor 4, original context 8192");
      }
    }
  } else if (has_key(arch + ".rope.scaling.type")) {
    ASSIGN_OR_RETURN(std::string type, get_string(arch + ".rope.scaling.type"));
    if (type != "none") {
      return unimplemented(path() + ": RoPE scaling type '" + type + "' is not supported");
    }
  }

  auto embd = by_hf_name_.find("model.embed_tokens.weight");
  if (embd != by_hf_name_.end()) {
    const auto& dims = tensors_[embd->second].dims;
    if (dims.size() != 2)
      return data_loss(path() + ": token_embd.weight is not 2-D");
    c.vocab_size = static_cast<int>(dims[1]);
  } else if (has_key("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(int64_t n, get_array_size("tokenizer.ggml.tokens"));
    c.vocab_size = static_cast<int>(n);
  } else {
    return invalid_argument(path() + ": cannot tell the vocabulary size (no token_embd.weight)");
  }
  c.tie_word_embeddings = by_hf_name_.count("lm_head.weight") == 0;
  c.has_qkv_bias = c.architecture == Architecture::kQwen2 || arch == "qwen2vl" ||
                   by_hf_name_.count("model.layers.0.self_attn.q_proj.bias") > 0;
  c.has_qk_norm = c.architecture == Architecture::kQwen3;
  if (arch == "qwen2vl")
    RETURN_IF_ERROR(read_qwen2vl_text_config(*this, &c));

  if (has_key("tokenizer.ggml.bos_token_id")) {
    ASSIGN_OR_RETURN(int64_t bos, get_int("tokenizer.ggml.bos_token_id"));
    c.bos_token_id = static_cast<int>(bos);
  }
  if (has_key("crescent.eos_token_ids")) {
    ASSIGN_OR_RETURN(auto ids, get_int_array("crescent.eos_token_ids"));
    for (int64_t id : ids)
      c.eos_token_ids.push_back(static_cast<int>(id));
  } else {
    for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                            "tokenizer.ggml.eom_token_id"}) {
      if (!has_key(key))
        continue;
      ASSIGN_OR_RETURN(int64_t id, get_int(key));
      if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end()) {
        c.eos_token_ids.push_back(static_cast<int>(id));
      }
    }
  }
  if (has_key("crescent.torch_dtype")) {
    ASSIGN_OR_RETURN(c.torch_dtype, get_string("crescent.torch_dtype"));
  }
  Status valid = validate_model_config(c);
  if (!valid.is_ok())
    return valid.with_context(path());
  return c;
}

// ---------------------------------------------------------------------------------------------
// Writer

}  // namespace crescent::model
