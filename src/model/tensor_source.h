#pragma once
// Named weight tensors of a model, independent of the file format they live in. A TensorSource
// (safetensors, sharded safetensors, GGUF) hands out TensorViews by Hugging Face name
// ("model.layers.3.self_attn.q_proj.weight"); the view's data stays valid for the life of the
// source (usually a read-only memory mapping). Sources are immutable after opening and safe
// to use from several threads.
//
// Also here: MappedFile (read-only mmap) and FileWriter (large buffered sequential writes),
// shared by the readers and writers of every format.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace crescent::model {

struct TensorView {
  std::string name;  // Hugging Face name
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major, HF order (last dimension is contiguous)
  const void* data = nullptr;
  int64_t num_bytes = 0;

  int64_t num_elements() const;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // NotFound if absent; Unimplemented if present in a dtype crescent cannot compute with.
  virtual Result<TensorView> get(const std::string& hf_name) const = 0;
  // Every tensor name the source holds (HF names), sorted.
  virtual std::vector<std::string> names() const = 0;
};

// get() plus a shape check; every error names the tensor, e.g.
// "model.layers.3.self_attn.q_proj.weight has shape [64, 32], expected [64, 64]".
Result<TensorView> require_tensor(const TensorSource& source, const std::string& name,
                                  std::vector<int64_t> expected_shape);

// "[64, 32]"
std::string shape_to_string(const std::vector<int64_t>& shape);

// Converts any supported view (F32/F16/BF16/Q8_0) to floats; out holds num_elements() values.
void tensor_to_float(const TensorView& view, float* out);
std::vector<float> tensor_to_float(const TensorView& view);

// A whole file mapped read-only. Immutable; shareable between threads.
class MappedFile {
 public:
  static Result<std::shared_ptr<const MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Sequential writer with a large buffer. Errors are sticky and reported by write()/close().
// Not thread-safe.
class FileWriter {
 public:
  static Result<std::unique_ptr<FileWriter>> create(const std::string& path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  Status write(const void* data, int64_t num_bytes);
  Status write_zeros(int64_t num_bytes);
  int64_t num_bytes_written() const { return num_bytes_written_; }
  Status close();
  const std::string& path() const { return path_; }

 private:
  FileWriter(std::string path, int fd);
  Status flush();

  std::string path_;
  int fd_ = -1;
  std::vector<uint8_t> buffer_;
  size_t buffered_ = 0;
  int64_t num_bytes_written_ = 0;
};

}  // namespace crescent::model
