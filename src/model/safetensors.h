#pragma once
// Hugging Face safetensors: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then the
// tensor bytes. The reader memory-maps the file and validates the whole header before use;
// the writer streams tensors to disk in the order they were declared.
//
// Thread-safety: SafetensorsFile and the sharded source are immutable after open() and may be
// shared; SafetensorsWriter is single-threaded.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/tensor_source.h"

namespace crescent::model {

class SafetensorsFile : public TensorSource {
 public:
  // Corrupt or truncated files -> DataLoss naming the file (and the tensor, if one is at fault).
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);

  Result<TensorView> get(const std::string& hf_name) const override;
  std::vector<std::string> names() const override;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  struct Entry {
    std::string dtype_name;      // as written in the file ("BF16", "I64", ...)
    std::optional<DType> dtype;  // empty when crescent cannot compute with it
    std::vector<int64_t> shape;
    int64_t begin = 0;  // absolute file offsets
    int64_t end = 0;
  };
  std::shared_ptr<const MappedFile> file_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint split over several files by model.safetensors.index.json ("weight_map").
// Every listed tensor must exist in the file the index names.
Result<std::unique_ptr<TensorSource>> open_sharded_safetensors(const std::string& index_path);

// Streams a safetensors file: declare every tensor (add_tensor), then write_header(), then
// the bytes of each tensor in declaration order (write_data may be called many times per
// tensor), then finish(). The header is padded with spaces so the data starts 8-byte aligned.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(std::string path);
  ~SafetensorsWriter();

  void set_metadata(const std::string& key, const std::string& value);
  // F32, F16 or BF16; InvalidArgument for Q8_0, a duplicate name, or after write_header().
  Status add_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape);
  Status write_header();
  Status write_data(const void* data, int64_t num_bytes);
  // Fails if any declared tensor was not written in full.
  Status finish();

 private:
  struct Declared {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t num_bytes;
  };
  std::string path_;
  std::map<std::string, std::string> metadata_;
  std::vector<Declared> tensors_;
  std::unique_ptr<FileWriter> out_;
  size_t current_ = 0;           // tensor being written
  int64_t current_written_ = 0;  // bytes of it written so far
};

// Writes whole in-memory tensors (tests, small files).
Status write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace crescent::model
