#include "model/gguf_mmproj.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "model/gguf.h"
#include "model/make_model.h"

namespace crescent::model {

namespace {

// clip.cpp's image size for Qwen-VL files (it derives the real size from each image) and its
// window size when clip.vision.window_size is absent.
constexpr uint32_t kClipImageSize = 560;
constexpr int kClipDefaultWindowSize = 112;

// How one GGUF tensor is cut from an HF one.
enum class PartKind {
  kWhole,
  kThird,          // row block `index` of qkv's [3 * embed, ...] (a weight or a bias)
  kTemporalSlice,  // patch_embed [embed, C, T, p, p] -> [embed, C, p, p] at t = index
};

struct Part {
  std::string gguf_name;
  PartKind kind = PartKind::kWhole;
  int index = 0;
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The GGUF tensors an HF tensor of the tower becomes (empty for a name outside the tower).
std::vector<Part> gguf_parts(std::string_view hf_name) {
  if (hf_name == "visual.patch_embed.proj.weight") {
    return {{"v.patch_embd.weight", PartKind::kTemporalSlice, 0},
            {"v.patch_embd.weight.1", PartKind::kTemporalSlice, 1}};
  }
  const std::string_view kind = ends_with(hf_name, ".weight") ? "weight" : "bias";
  const std::string_view stem = hf_name.substr(0, hf_name.size() - kind.size() - 1);
  std::string suffix = ".";
  suffix += kind;
  static const std::map<std::string_view, std::string_view> kMerger = {
      {"visual.merger.ln_q", "v.post_ln"},
      {"visual.merger.mlp.0", "mm.0"},
      {"visual.merger.mlp.2", "mm.2"},
  };
  if (auto it = kMerger.find(stem); it != kMerger.end())
    return {{std::string(it->second) + suffix}};
  constexpr std::string_view kBlocks = "visual.blocks.";
  if (stem.substr(0, kBlocks.size()) != kBlocks)
    return {};
  const std::string_view rest = stem.substr(kBlocks.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos)
    return {};
  std::string prefix = "v.blk.";
  prefix.append(rest.substr(0, dot)).append(".");
  const std::string_view module = rest.substr(dot + 1);
  if (module == "attn.qkv") {
    return {{prefix + "attn_q" + suffix, PartKind::kThird, 0},
            {prefix + "attn_k" + suffix, PartKind::kThird, 1},
            {prefix + "attn_v" + suffix, PartKind::kThird, 2}};
  }
  static const std::map<std::string_view, std::string_view> kBlock = {
      {"norm1", "ln1"},          {"norm2", "ln2"},
      {"attn.proj", "attn_out"}, {"mlp.fc1", "ffn_up"},
      {"mlp.fc2", "ffn_down"},   {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"}, {"mlp.down_proj", "ffn_down"},
  };
  if (auto it = kBlock.find(module); it != kBlock.end())
    return {{prefix + std::string(it->second) + suffix}};
  return {};
}

// Shape, row length and the source element offset of each row of a part cut from `shape`.
struct PartLayout {
  std::vector<int64_t> shape;  // HF order
  int64_t num_rows = 0;
  int64_t row_len = 0;
  int64_t src_offset(int64_t row) const { return (row * stride + shift) * row_len; }
  int64_t stride = 1;  // in rows of the source
  int64_t shift = 0;
};

PartLayout layout_of(const Part& part, const std::vector<int64_t>& hf_shape) {
  PartLayout l;
  switch (part.kind) {
    case PartKind::kWhole:
      l.shape = hf_shape;
      l.row_len = hf_shape.back();
      l.num_rows = 1;
      for (size_t i = 0; i + 1 < hf_shape.size(); ++i)
        l.num_rows *= hf_shape[i];
      break;
    case PartKind::kThird: {
      const int64_t rows = hf_shape[0] / 3;
      l.shape = hf_shape;
      l.shape[0] = rows;
      if (hf_shape.size() == 1) {  // a bias: one row of `rows` values
        l.row_len = rows;
        l.num_rows = 1;
        l.shift = part.index;
      } else {
        l.row_len = hf_shape[1];
        l.num_rows = rows;
        l.shift = part.index * rows;
      }
      break;
    }
    case PartKind::kTemporalSlice: {
      // [embed, C, T, p, p]: rows of p * p values, T of them per (embed, C).
      l.shape = {hf_shape[0], hf_shape[1], hf_shape[3], hf_shape[4]};
      l.row_len = hf_shape[3] * hf_shape[4];
      l.num_rows = hf_shape[0] * hf_shape[1];
      l.stride = hf_shape[2];
      l.shift = part.index;
      break;
    }
  }
  return l;
}

// clip.cpp runs full attention in block i when (i + 1) % n_wa_pattern == 0.
std::vector<int> fullatt_blocks(int n_wa_pattern, int depth) {
  std::vector<int> blocks;
  for (int i = 0; i < depth; ++i) {
    if (n_wa_pattern <= 0 || (i + 1) % n_wa_pattern == 0)
      blocks.push_back(i);
  }
  return blocks;
}

// ---------------------------------------------------------------------------------------------
// Reader

class MmprojSource : public TensorSource {
 public:
  explicit MmprojSource(std::unique_ptr<GgufFile> file) : file_(std::move(file)) {}

  Result<TensorView> get(const std::string& hf_name) const override {
    auto it = entries_.find(hf_name);
    if (it == entries_.end())
      return not_found(file_->path() + ": no tensor " + hf_name);
    if (!it->second.error.is_ok())
      return it->second.error;
    return it->second.view;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, entry] : entries_)
      out.push_back(name);
    return out;
  }

  // Makes the HF tensor `spec` from its GGUF parts.
  Status add(const TensorSpec& spec) {
    const std::vector<Part> parts = gguf_parts(spec.name);
    CRESCENT_CHECK(!parts.empty()) << spec.name << " has no GGUF name";
    Entry& entry = entries_[spec.name];
    std::vector<TensorView> views;
    for (const Part& part : parts) {
      const std::vector<int64_t> expected = layout_of(part, spec.shape).shape;
      Result<TensorView> v = file_->get_by_gguf_name(part.gguf_name);
      if (v.status().code() == StatusCode::kUnimplemented) {
        entry.error = v.status();  // a ggml type we cannot compute with: reported by get()
        return Status::ok();
      }
      if (!v.is_ok())
        return v.status();
      if (v->shape != expected) {
        return invalid_argument(file_->path() + ": " + part.gguf_name + " has shape " +
                                shape_to_string(v->shape) + ", expected " +
                                shape_to_string(expected) + " (for " + spec.name + ")");
      }
      views.push_back(*std::move(v));
    }
    if (parts.size() == 1) {
      entry.view = views[0];
      entry.view.name = spec.name;
      return Status::ok();
    }
    // Joined tensors keep the parts' dtype when they share one; Q8_0 rows and the patch
    // embedding's interleaved slices are rebuilt from floats otherwise.
    const bool same_dtype = std::all_of(
        views.begin(), views.end(), [&](const TensorView& v) { return v.dtype == views[0].dtype; });
    const bool keep =
        same_dtype && (parts[0].kind == PartKind::kThird || views[0].dtype != DType::kQ8_0);
    const DType out = keep ? views[0].dtype : DType::kF32;
    int64_t num_elements = 1;
    for (int64_t d : spec.shape)
      num_elements *= d;
    entry.owned.resize(static_cast<size_t>(dtype_num_bytes(out, num_elements)));
    std::vector<float> floats;
    for (size_t i = 0; i < parts.size(); ++i) {
      const PartLayout l = layout_of(parts[i], spec.shape);
      const TensorView& v = views[i];
      if (keep && l.stride == 1) {  // a contiguous block: copy bytes (any dtype, Q8_0 rows too)
        std::memcpy(entry.owned.data() + dtype_num_bytes(out, l.src_offset(0)), v.data,
                    static_cast<size_t>(v.num_bytes));
        continue;
      }
      const int64_t elem_bytes = keep ? dtype_num_bytes(out, 1) : 4;
      if (!keep) {
        floats.resize(static_cast<size_t>(v.num_elements()));
        tensor_to_float(v, floats.data());
      }
      const auto* src = keep ? static_cast<const uint8_t*>(v.data)
                             : reinterpret_cast<const uint8_t*>(floats.data());
      for (int64_t r = 0; r < l.num_rows; ++r) {
        std::memcpy(entry.owned.data() + l.src_offset(r) * elem_bytes,
                    src + r * l.row_len * elem_bytes, static_cast<size_t>(l.row_len * elem_bytes));
      }
    }
    entry.view = TensorView{spec.name, out, spec.shape, entry.owned.data(),
                            static_cast<int64_t>(entry.owned.size())};
    return Status::ok();
  }

 private:
  struct Entry {
    TensorView view;
    std::vector<uint8_t> owned;  // joined tensors; view.data points here (entries never move)
    Status error = Status::ok();
  };
  std::unique_ptr<GgufFile> file_;
  std::map<std::string, Entry> entries_;
};

Result<int> positive_int(const GgufFile& f, const std::string& key) {
  ASSIGN_OR_RETURN(int64_t v, f.get_int(key));
  if (v <= 0 || v > INT32_MAX) {
    return invalid_argument(f.path() + ": " + key + " = " + std::to_string(v) + " is out of range");
  }
  return static_cast<int>(v);
}

Result<VisionConfig> read_vision_config(const GgufFile& f) {
  const std::string& path = f.path();
  std::string arch;
  if (f.has_key("general.architecture")) {
    ASSIGN_OR_RETURN(arch, f.get_string("general.architecture"));
  }
  if (arch != "clip") {
    return invalid_argument(path + ": not an mmproj file (general.architecture is '" + arch +
                            "', expected 'clip')");
  }
  bool has_vision = false;
  if (f.has_key("clip.has_vision_encoder")) {
    ASSIGN_OR_RETURN(has_vision, f.get_bool("clip.has_vision_encoder"));
  }
  if (!has_vision)
    return invalid_argument(path + ": the mmproj file has no vision encoder");
  std::string projector;
  for (const char* key : {"clip.projector_type", "clip.vision.projector_type"}) {
    if (projector.empty() && f.has_key(key)) {
      ASSIGN_OR_RETURN(projector, f.get_string(key));
    }
  }
  VisionConfig c;
  if (projector == mmproj_projector_type(VisionArchitecture::kQwen2Vl)) {
    c.architecture = VisionArchitecture::kQwen2Vl;
  } else if (projector == mmproj_projector_type(VisionArchitecture::kQwen25Vl) ||
             projector == "qwen2.5o") {  // Qwen2.5-Omni: the same vision tower
    c.architecture = VisionArchitecture::kQwen25Vl;
  } else {
    return unimplemented(path + ": mmproj projector type '" + projector +
                         "' is not supported (qwen2vl_merger, qwen2.5vl_merger are)");
  }
  ASSIGN_OR_RETURN(c.embed_dim, positive_int(f, "clip.vision.embedding_length"));
  ASSIGN_OR_RETURN(c.depth, positive_int(f, "clip.vision.block_count"));
  ASSIGN_OR_RETURN(c.num_heads, positive_int(f, "clip.vision.attention.head_count"));
  ASSIGN_OR_RETURN(c.out_hidden_size, positive_int(f, "clip.vision.projection_dim"));
  ASSIGN_OR_RETURN(c.patch_size, positive_int(f, "clip.vision.patch_size"));
  if (f.has_key("clip.vision.spatial_merge_size")) {
    ASSIGN_OR_RETURN(c.spatial_merge_size, positive_int(f, "clip.vision.spatial_merge_size"));
  }
  ASSIGN_OR_RETURN(c.norm_eps, f.get_float("clip.vision.attention.layer_norm_epsilon"));
  for (auto [key, out] : {std::pair{"clip.vision.image_mean", &c.image_mean},
                          std::pair{"clip.vision.image_std", &c.image_std}}) {
    ASSIGN_OR_RETURN(std::vector<double> values, f.get_float_array(key));
    if (values.size() != 3)
      return invalid_argument(path + ": " + key + " must hold 3 values");
    for (int i = 0; i < 3; ++i)
      (*out)[i] = static_cast<float>(values[i]);
  }
  if (c.architecture == VisionArchitecture::kQwen25Vl) {
    ASSIGN_OR_RETURN(int64_t pattern, f.get_int("clip.vision.n_wa_pattern"));
    c.fullatt_block_indexes = fullatt_blocks(static_cast<int>(pattern), c.depth);
    c.window_size = kClipDefaultWindowSize;
    if (f.has_key("clip.vision.window_size")) {
      ASSIGN_OR_RETURN(c.window_size, positive_int(f, "clip.vision.window_size"));
    }
  }
  // Shapes the metadata does not state reliably: the MLP width (llama.cpp's converter writes
  // Qwen2-VL's LLM width as feed_forward_length) and the input channels.
  ASSIGN_OR_RETURN(TensorView up, f.get_by_gguf_name("v.blk.0.ffn_up.weight"));
  ASSIGN_OR_RETURN(TensorView patch, f.get_by_gguf_name("v.patch_embd.weight"));
  if (up.shape.size() != 2 || patch.shape.size() != 4) {
    return invalid_argument(path + ": v.blk.0.ffn_up.weight or v.patch_embd.weight has an " +
                            "unexpected number of dimensions");
  }
  c.intermediate_size = static_cast<int>(up.shape[0]);
  c.in_channels = static_cast<int>(patch.shape[1]);
  c.temporal_patch_size = 2;  // the two slices v.patch_embd.weight and .weight.1
  Status valid = validate_vision_config(c);
  if (!valid.is_ok())
    return valid.with_context(path);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Writer

struct WritePlan {
  TensorView view;  // the HF tensor
  PartLayout layout;
  DType out;
};

}  // namespace

Status read_qwen2vl_text_config(const GgufFile& f, ModelConfig* config) {
  ModelConfig& c = *config;
  const std::string& path = f.path();
  const std::string key = "qwen2vl.rope.dimension_sections";
  ASSIGN_OR_RETURN(std::vector<int64_t> sections, f.get_int_array(key));
  // llama.cpp pads the three (temporal, height, width) sections to four with a zero.
  if (sections.size() == 4 && sections[3] == 0)
    sections.pop_back();
  int64_t sum = 0;
  for (int64_t s : sections) {
    if (s <= 0 || s > c.head_dim)
      return invalid_argument(path + ": " + key + " holds an out-of-range section");
    sum += s;
  }
  if (sections.size() != 3 || sum != c.head_dim / 2) {
    return invalid_argument(path + ": " + key + " must be three M-RoPE sections summing to " +
                            "head_dim / 2 = " + std::to_string(c.head_dim / 2));
  }
  c.mrope_section.assign(sections.begin(), sections.end());
  // Token ids: from the vocabulary when the file carries one, else Qwen's.
  c.image_token_id = 151655;
  c.vision_start_token_id = 151652;
  c.vision_end_token_id = 151653;
  if (f.has_key("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(std::vector<std::string> tokens, f.get_string_array("tokenizer.ggml.tokens"));
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (tokens[id] == "<|image_pad|>") {
        c.image_token_id = static_cast<int>(id);
      } else if (tokens[id] == "<|vision_start|>") {
        c.vision_start_token_id = static_cast<int>(id);
      } else if (tokens[id] == "<|vision_end|>") {
        c.vision_end_token_id = static_cast<int>(id);
      }
    }
  }
  for (int id : {c.image_token_id, c.vision_start_token_id, c.vision_end_token_id}) {
    if (id >= c.vocab_size) {
      return invalid_argument(path + ": image token id " + std::to_string(id) +
                              " is outside the vocabulary of " + std::to_string(c.vocab_size));
    }
  }
  return Status::ok();
}

std::string_view mmproj_projector_type(VisionArchitecture arch) {
  return arch == VisionArchitecture::kQwen2Vl ? "qwen2vl_merger" : "qwen2.5vl_merger";
}

Result<std::unique_ptr<TensorSource>> open_mmproj(const std::string& path, VisionConfig* config) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::open(path));
  ASSIGN_OR_RETURN(VisionConfig vision, read_vision_config(*file));
  auto source = std::make_unique<MmprojSource>(std::move(file));
  for (const TensorSpec& spec : vision_tensor_specs(vision))
    RETURN_IF_ERROR(source->add(spec));
  *config = std::move(vision);
  return std::unique_ptr<TensorSource>(std::move(source));
}

Status write_mmproj_gguf(const std::string& path, const VisionConfig& v, const TensorSource& source,
                         DType dtype, const std::string& model_name,
                         const std::function<void(int64_t, int64_t)>& progress) {
  if (v.temporal_patch_size != 2) {
    return invalid_argument("mmproj: temporal_patch_size " + std::to_string(v.temporal_patch_size) +
                            " cannot be written (clip.cpp splits the patch embedding in two)");
  }
  int n_wa_pattern = 0;
  if (v.architecture == VisionArchitecture::kQwen25Vl) {
    // convert_hf_to_gguf.py: n_wa_pattern = fullatt[0] + 1, and the rest must follow it.
    n_wa_pattern = v.fullatt_block_indexes.empty() ? 0 : v.fullatt_block_indexes[0] + 1;
    if (n_wa_pattern == 0 || fullatt_blocks(n_wa_pattern, v.depth) != v.fullatt_block_indexes) {
      return invalid_argument(
          "mmproj: fullatt_block_indexes must be every n-th block up to the last one "
          "(clip.cpp only knows n_wa_pattern)");
    }
  }

  GgufWriter w(path);
  w.set_string("general.architecture", "clip");
  w.set_string("general.type", "mmproj");
  w.set_string("general.name", model_name);
  w.set_u32("general.file_type", gguf_file_type(dtype));
  w.set_bool("clip.has_vision_encoder", true);
  w.set_string("clip.projector_type", mmproj_projector_type(v.architecture));
  auto u32 = [](int x) { return static_cast<uint32_t>(x); };
  w.set_u32("clip.vision.image_size", kClipImageSize);
  w.set_u32("clip.vision.patch_size", u32(v.patch_size));
  w.set_u32("clip.vision.embedding_length", u32(v.embed_dim));
  w.set_u32("clip.vision.feed_forward_length", u32(v.intermediate_size));
  w.set_u32("clip.vision.block_count", u32(v.depth));
  w.set_u32("clip.vision.attention.head_count", u32(v.num_heads));
  w.set_u32("clip.vision.projection_dim", u32(v.out_hidden_size));
  w.set_f32("clip.vision.attention.layer_norm_epsilon", static_cast<float>(v.norm_eps));
  w.set_f32_array("clip.vision.image_mean",
                  std::vector<float>(v.image_mean.begin(), v.image_mean.end()));
  w.set_f32_array("clip.vision.image_std",
                  std::vector<float>(v.image_std.begin(), v.image_std.end()));
  w.set_u32("clip.vision.spatial_merge_size", u32(v.spatial_merge_size));
  if (v.architecture == VisionArchitecture::kQwen25Vl) {
    // Qwen2-VL's quick_gelu is clip.cpp's default activation; Qwen2.5-VL's MLP is SwiGLU.
    w.set_bool("clip.use_silu", true);
    w.set_u32("clip.vision.n_wa_pattern", u32(n_wa_pattern));
    w.set_u32("clip.vision.window_size", u32(v.window_size));
  }

  std::vector<WritePlan> plans;
  for (const TensorSpec& spec : vision_tensor_specs(v)) {
    ASSIGN_OR_RETURN(TensorView view, require_tensor(source, spec.name, spec.shape));
    for (const Part& part : gguf_parts(spec.name)) {
      PartLayout layout = layout_of(part, spec.shape);
      if (view.dtype == DType::kQ8_0 &&
          (layout.row_len % kQ8BlockSize != 0 || layout.stride != 1)) {
        return unimplemented(spec.name + ": Q8_0 source rows cannot be split for the mmproj");
      }
      // llama.cpp: the patch embedding stays F32 (F16 in an F16 file), 1-D tensors F32, and
      // rows Q8_0 cannot hold fall back to F16.
      DType out = dtype;
      if (part.kind == PartKind::kTemporalSlice) {
        out = dtype == DType::kF16 ? DType::kF16 : DType::kF32;
      } else if (layout.shape.size() == 1) {
        out = DType::kF32;
      } else if (dtype == DType::kQ8_0 && layout.row_len % kQ8BlockSize != 0) {
        out = DType::kF16;
      }
      RETURN_IF_ERROR(w.add_tensor(part.gguf_name, out, layout.shape));
      plans.push_back({view, std::move(layout), out});
    }
  }
  RETURN_IF_ERROR(w.write_header());
  int64_t total_bytes = 0;
  for (const WritePlan& p : plans)
    total_bytes += dtype_num_bytes(p.out, p.layout.num_rows * p.layout.row_len);
  int64_t done_bytes = 0;
  std::vector<uint8_t> converted;
  for (const WritePlan& p : plans) {
    const PartLayout& l = p.layout;
    const int64_t out_row_bytes = dtype_num_bytes(p.out, l.row_len);
    const int64_t batch_rows =
        std::clamp<int64_t>((4 << 20) / std::max<int64_t>(out_row_bytes, 1), 1, l.num_rows);
    converted.resize(static_cast<size_t>(batch_rows * out_row_bytes));
    for (int64_t first = 0; first < l.num_rows; first += batch_rows) {
      const int64_t n = std::min(batch_rows, l.num_rows - first);
      auto convert = [&](int64_t lo, int64_t hi) {
        std::vector<float> row(static_cast<size_t>(l.row_len));
        for (int64_t r = lo; r < hi; ++r) {
          const auto* src = static_cast<const uint8_t*>(p.view.data) +
                            dtype_num_bytes(p.view.dtype, l.src_offset(first + r));
          TensorView src_row{p.view.name,
                             p.view.dtype,
                             {l.row_len},
                             src,
                             dtype_num_bytes(p.view.dtype, l.row_len)};
          tensor_to_float(src_row, row.data());
          float_to_dtype(row.data(), l.row_len, p.out, converted.data() + r * out_row_bytes);
        }
      };
      if (n * l.row_len >= (1 << 18)) {
        ThreadPool::default_pool().parallel_range(n, convert);
      } else {
        convert(0, n);
      }
      RETURN_IF_ERROR(w.write_data(converted.data(), n * out_row_bytes));
    }
    done_bytes += dtype_num_bytes(p.out, l.num_rows * l.row_len);
    if (progress)
      progress(done_bytes, total_bytes);
  }
  return w.finish();
}

}  // namespace crescent::model
