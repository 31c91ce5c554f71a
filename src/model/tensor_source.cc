#include "model/tensor_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/errno_text.h"

namespace crescent::model {

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Result<TensorView> require_tensor(const TensorSource& source, const std::string& name,
                                  std::vector<int64_t> expected_shape) {
  Result<TensorView> view = source.get(name);
  if (!view.is_ok()) {
    if (view.status().code() == StatusCode::kNotFound) {
      return not_found("tensor " + name + " is missing from the model files");
    }
    return view.status();
  }
  if (view->shape != expected_shape) {
    return invalid_argument(name + " has shape " + shape_to_string(view->shape) + ", expected " +
                            shape_to_string(expected_shape));
  }
  return view;
}

void tensor_to_float(const TensorView& view, float* out) {
  dtype_to_float(view.dtype, view.data, view.num_elements(), out);
}

std::vector<float> tensor_to_float(const TensorView& view) {
  std::vector<float> out(static_cast<size_t>(view.num_elements()));
  tensor_to_float(view, out.data());
  return out;
}

Result<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return not_found(path + ": no such file");
    return invalid_argument(path + ": cannot open: " + errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = internal_error(path + ": fstat failed: " + errno_text(errno));
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = st.st_size;
  if (st.st_size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      Status s = resource_exhausted(path + ": mmap failed: " + errno_text(errno));
      ::close(fd);
      return s;
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr)
    ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

constexpr size_t kWriteBufferBytes = 8 << 20;

FileWriter::FileWriter(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
  buffer_.resize(kWriteBufferBytes);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0)
    ::close(fd_);
}

Result<std::unique_ptr<FileWriter>> FileWriter::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return invalid_argument(path + ": cannot create: " + errno_text(errno));
  return std::unique_ptr<FileWriter>(new FileWriter(path, fd));
}

Status FileWriter::flush() {
  size_t done = 0;
  while (done < buffered_) {
    ssize_t n = ::write(fd_, buffer_.data() + done, buffered_ - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return internal_error(path_ + ": write failed: " + errno_text(errno));
    }
    done += static_cast<size_t>(n);
  }
  buffered_ = 0;
  return Status::ok();
}

Status FileWriter::write(const void* data, int64_t num_bytes) {
  if (fd_ < 0)
    return failed_precondition(path_ + ": write after close");
  const auto* p = static_cast<const uint8_t*>(data);
  auto left = static_cast<size_t>(num_bytes);
  while (left > 0) {
    size_t n = std::min(left, buffer_.size() - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, n);
    buffered_ += n;
    p += n;
    left -= n;
    if (buffered_ == buffer_.size())
      RETURN_IF_ERROR(flush());
  }
  num_bytes_written_ += num_bytes;
  return Status::ok();
}

Status FileWriter::write_zeros(int64_t num_bytes) {
  static const uint8_t kZeros[64] = {};
  while (num_bytes > 0) {
    int64_t n = std::min<int64_t>(num_bytes, sizeof(kZeros));
    RETURN_IF_ERROR(write(kZeros, n));
    num_bytes -= n;
  }
  return Status::ok();
}

Status FileWriter::close() {
  if (fd_ < 0)
    return Status::ok();
  Status s = flush();
  if (::close(fd_) != 0 && s.is_ok())
    s = internal_error(path_ + ": close failed: " + errno_text(errno));
  fd_ = -1;
  return s;
}

}  // namespace crescent::model
