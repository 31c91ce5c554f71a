#pragma once
// GGUF v3 (llama.cpp's single-file format): a header, typed metadata key/values, tensor infos,
// then the aligned tensor data. GgufFile maps a file read-only, validates every length and
// offset against the file before use, and serves tensors under their Hugging Face names
// (token_embd.weight -> model.embed_tokens.weight, blk.3.attn_q.weight ->
// model.layers.3.self_attn.q_proj.weight, ...) in HF shape order (GGUF lists dims fastest
// first; we present them reversed).
//
// Q/K permutation: llama.cpp's converter permutes the rows of LLaMA's q_proj/k_proj (weights
// and biases) from HF's "rotate half" RoPE layout to its interleaved layout; Qwen2/Qwen3 are
// stored unpermuted. We do the same on write, and undo it on read for general.architecture
// "llama", so real llama.cpp files and ours both load with HF semantics.
//
// Code: the reader and names here (gguf.cc), the writer (gguf_writer.cc), the ggml type table
// and the per-tensor type choices of quantised files (gguf_types.h).
//
// Thread-safety: GgufFile is safe to share (un-permuted copies are built under a mutex);
// GgufWriter is single-threaded.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/config.h"
#include "model/gguf_types.h"
#include "model/tensor_source.h"

namespace crescent::model {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr int64_t kGgufMaxDims = 4;          // dimensions of a GGUF tensor

// ggml tensor type ids as stored in GGUF.
inline constexpr uint32_t kGgmlTypeF32 = 0;
inline constexpr uint32_t kGgmlTypeF16 = 1;
inline constexpr uint32_t kGgmlTypeQ4_0 = 2;
inline constexpr uint32_t kGgmlTypeQ8_0 = 8;
inline constexpr uint32_t kGgmlTypeBF16 = 30;

// "Q4_K", or "type 77" for an unknown id.
std::string ggml_type_name(uint32_t ggml_type);

// GGUF metadata value types.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// general.architecture of a model's LLM GGUF: "llama", "qwen2", "qwen3"; "qwen2vl" for both
// Qwen2-VL and Qwen2.5-VL (llama.cpp's converter writes the same text model for both; the vision
// tower lives in a separate mmproj file, see gguf_mmproj.h).
std::string_view gguf_architecture_name(Architecture arch);

// HF <-> GGUF tensor names; nullopt for names outside the decoder-only model.
std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name);
std::optional<std::string> hf_to_gguf_name(std::string_view hf_name);

// LLaMA Q/K permutation (see the header comment): GGUF row `gguf_row` of a tensor with
// num_rows rows (num_heads * head_dim) holds HF row llama_qk_hf_row(...).
int64_t llama_qk_hf_row(int64_t gguf_row, int64_t num_rows, int64_t num_heads);
// The number of heads whose rows of `hf_name` are permuted in GGUF, or 0 if it is not.
int64_t gguf_qk_permute_heads(const ModelConfig& config, std::string_view hf_name);

// ggml's reference Q8_0 quantisation: per 32 values scale = amax/127 (F16), q = round(x/scale).
void quantize_q8_0(const float* x, int64_t num_values, Q8Block* out);
// Stores num_values floats as `dtype` at out (dtype_num_bytes(dtype, num_values) bytes; a
// multiple of the block size for the quantised types, which use ggml's reference quantisers).
void float_to_dtype(const float* values, int64_t num_values, DType dtype, void* out);

// llama.cpp's rope_freqs.weight for llama3 RoPE scaling: one factor per rotary pair.
std::vector<float> llama3_rope_freq_factors(const ModelConfig& config);

struct GgufTensorInfo {
  std::string name;  // GGUF name
  uint32_t ggml_type = 0;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the contiguous one
  int64_t offset = 0;         // absolute file offset
  int64_t num_bytes = -1;     // -1 when the type's size is unknown to us
};

class GgufFile : public TensorSource {
 public:
  using Scalar = std::variant<uint64_t, int64_t, double, bool, std::string>;

  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  ~GgufFile() override;

  // Tensors by HF name. Types other than F32/F16/BF16/Q8_0 -> Unimplemented naming both.
  Result<TensorView> get(const std::string& hf_name) const override;
  std::vector<std::string> names() const override;
  // A tensor by its GGUF name (e.g. "v.blk.0.attn_q.weight" of an mmproj file), dims reversed
  // to row-major order, never permuted; the view's name is the GGUF name.
  Result<TensorView> get_by_gguf_name(const std::string& gguf_name) const;

  // Metadata. Integers of any width read as int64; floats as double.
  bool has_key(const std::string& key) const;
  Result<int64_t> get_int(const std::string& key) const;
  Result<double> get_float(const std::string& key) const;
  Result<std::string> get_string(const std::string& key) const;
  Result<bool> get_bool(const std::string& key) const;
  // Arrays: element count, strings, and integers.
  Result<int64_t> get_array_size(const std::string& key) const;
  Result<std::vector<std::string>> get_string_array(const std::string& key) const;
  Result<std::vector<int64_t>> get_int_array(const std::string& key) const;
  // Arrays of F32 or F64 (read as the shortest decimal that gives the same float, as scalars).
  Result<std::vector<double>> get_float_array(const std::string& key) const;

  // Every metadata entry in file order with its encoded bytes (the u32 value type, then the
  // value), for copying into another file with GgufWriter::set_raw. Views into the mapping.
  struct RawMetadata {
    std::string key;
    std::string_view type_and_value;
  };
  std::vector<RawMetadata> raw_metadata() const;

  const std::vector<GgufTensorInfo>& tensor_infos() const { return tensors_; }
  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }

  // Hyper-parameters from general.architecture and <arch>.* keys (see docs/models.md). For
  // "qwen2vl" also mrope_section (<arch>.rope.dimension_sections) and the image token ids (from
  // the vocabulary when it holds them, else Qwen's); `vision` stays empty (it is in the
  // mmproj) and the architecture is kQwen2Vl unless crescent.architecture names Qwen2.5-VL.
  Result<ModelConfig> model_config() const;

 private:
  struct ArrayRef {
    GgufValueType element_type;
    int64_t count;
    int64_t offset;  // of the first element
  };
  GgufFile() = default;
  Status parse();
  Result<const Scalar*> scalar(const std::string& key) const;
  Result<const ArrayRef*> array(const std::string& key) const;

  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, Scalar> scalars_;
  std::map<std::string, ArrayRef> arrays_;
  struct RawEntry {
    std::string key;
    int64_t begin;  // file offsets of the type and value bytes
    int64_t end;
  };
  std::vector<RawEntry> raw_entries_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_hf_name_;
  std::string architecture_;
  int64_t num_heads_ = 0;
  int64_t num_kv_heads_ = 0;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<std::vector<uint8_t>>>
      unpermuted_;  // GUARDED_BY(mu_)
};

// Streams a GGUF v3 file: set metadata and declare tensors, write_header(), then the bytes of
// each tensor in declaration order, then finish(). Alignment 32 unless changed.
class GgufWriter {
 public:
  explicit GgufWriter(std::string path, int64_t alignment = 32);
  ~GgufWriter();

  void set_u32(const std::string& key, uint32_t value);
  void set_i32(const std::string& key, int32_t value);
  void set_u64(const std::string& key, uint64_t value);
  void set_f32(const std::string& key, float value);
  void set_bool(const std::string& key, bool value);
  void set_string(const std::string& key, std::string_view value);
  void set_string_array(const std::string& key, const std::vector<std::string>& values);
  void set_i32_array(const std::string& key, const std::vector<int32_t>& values);
  void set_f32_array(const std::string& key, const std::vector<float>& values);
  // A value copied as encoded (GgufFile::raw_metadata): the u32 type, then the value bytes.
  void set_raw(const std::string& key, std::string_view type_and_value);

  // Declares a tensor by GGUF name with its HF (row-major) shape.
  Status add_tensor(const std::string& gguf_name, DType dtype, std::vector<int64_t> hf_shape);
  // Any ggml type with an explicit byte size (tests write unsupported types this way).
  Status add_tensor_raw(const std::string& gguf_name, uint32_t ggml_type,
                        std::vector<int64_t> hf_shape, int64_t num_bytes);
  Status write_header();
  Status write_data(const void* data, int64_t num_bytes);
  Status finish();

 private:
  void put_key(const std::string& key, GgufValueType type);
  struct Declared {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> hf_shape;
    int64_t num_bytes;
  };
  std::string path_;
  int64_t alignment_;
  std::vector<uint8_t> kv_bytes_;
  uint64_t num_kv_ = 0;
  std::vector<Declared> tensors_;
  std::unique_ptr<FileWriter> out_;
  size_t current_ = 0;
  int64_t current_written_ = 0;
};

// general.*, <arch>.* and crescent.* keys for `config` (call before write_header()); for
// Qwen2-VL / Qwen2.5-VL also qwen2vl.rope.dimension_sections (mrope_section padded to 4 with 0)
// and crescent.architecture (the HF architecture name).
void add_gguf_model_metadata(GgufWriter& writer, const ModelConfig& config,
                             const std::string& model_name);
// tokenizer.ggml.* keys from a Hugging Face tokenizer.json (byte-level BPE): model "gpt2", pre
// (the split regex's llama.cpp name), tokens padded to vocab_size with unused "[PADn]",
// token_type (added tokens: special -> control, others user-defined), merges, bos/eos ids,
// add_bos/add_eos_token as its post-processor does; tokenizer.chat_template when not empty.
// Reading them back (tokenizer_gguf.h) gives the same ids as the tokenizer.json.
Status add_gguf_tokenizer_metadata(GgufWriter& writer, std::string_view tokenizer_json,
                                   const ModelConfig& config, std::string_view chat_template = {});

// Converts every tensor of `source` to a GGUF file with the model and tokenizer metadata; a
// vision-language source's "visual.*" tensors are left out (they go to the mmproj file).
// 2-D tensors are stored as gguf_tensor_dtype(type, ...) picks (gguf_types.h), 1-D ones (norms,
// biases) as F32;
// LLaMA Q/K rows are permuted. Reads rows on demand, so a memory-mapped source is streamed;
// rows are converted on ThreadPool::default_pool() (call from one thread at a time).
// progress (optional) is called with (bytes written, bytes total) as tensors are written.
Status write_gguf(const std::string& path, const ModelConfig& config, const TensorSource& source,
                  const GgufWeightType& type, std::string_view tokenizer_json,
                  const std::string& model_name, std::string_view chat_template = {},
                  const std::function<void(int64_t, int64_t)>& progress = {});
// write_gguf's second half: declares and writes the tensors into `writer`, whose metadata is
// set (crescent quantize copies it from the input GGUF), then finishes the file.
Status write_gguf_tensors(GgufWriter& writer, const ModelConfig& config, const TensorSource& source,
                          const GgufWeightType& type,
                          const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace crescent::model
