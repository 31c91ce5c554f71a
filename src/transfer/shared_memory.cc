#include "transfer/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/errno_text.h"

namespace crescent::transfer {

namespace {

struct Registry {
  std::mutex mu;
  // base address -> (size, memfd)
  std::map<uintptr_t, std::pair<size_t, int>> buffers;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

SharedBuffer::SharedBuffer(SharedBuffer&& other) noexcept
    : data_(other.data_), size_bytes_(other.size_bytes_), memfd_(other.memfd_) {
  other.data_ = nullptr;
  other.size_bytes_ = 0;
  other.memfd_ = -1;
}

SharedBuffer& SharedBuffer::operator=(SharedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = other.data_;
    size_bytes_ = other.size_bytes_;
    memfd_ = other.memfd_;
    other.data_ = nullptr;
    other.size_bytes_ = 0;
    other.memfd_ = -1;
  }
  return *this;
}

SharedBuffer::~SharedBuffer() {
  reset();
}

void SharedBuffer::reset() {
  if (data_ == nullptr)
    return;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().buffers.erase(reinterpret_cast<uintptr_t>(data_));
  }
  ::munmap(data_, size_bytes_);
  ::close(memfd_);
  data_ = nullptr;
  size_bytes_ = 0;
  memfd_ = -1;
}

Result<SharedBuffer> allocate_shared(size_t bytes, bool populate) {
  if (bytes == 0)
    return invalid_argument("allocate_shared: zero bytes");
  size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > (size_t{1} << 46))
    return resource_exhausted("allocate_shared: too large");
  size_t size = (bytes + page - 1) / page * page;
  int fd = ::memfd_create("crescent-shared", MFD_CLOEXEC);
  if (fd < 0)
    return resource_exhausted("memfd_create: " + errno_text(errno));
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int err = errno;
    ::close(fd);
    return resource_exhausted("ftruncate: " + errno_text(err));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return resource_exhausted("mmap: " + errno_text(err));
  }
  SharedBuffer b;
  b.data_ = static_cast<uint8_t*>(p);
  b.size_bytes_ = size;
  b.memfd_ = fd;
  std::lock_guard<std::mutex> lock(registry().mu);
  registry().buffers[reinterpret_cast<uintptr_t>(p)] = {size, fd};
  return b;
}

Result<SharedRange> find_shared(const void* addr, uint64_t bytes) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(registry().mu);
  auto it = registry().buffers.upper_bound(a);
  if (it == registry().buffers.begin())
    return not_found("address is not in shared memory");
  --it;
  uintptr_t base = it->first;
  size_t size = it->second.first;
  if (a - base > size || bytes > size - (a - base)) {
    return not_found("range is not inside one allocate_shared() buffer");
  }
  int fd = ::fcntl(it->second.second, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return resource_exhausted("dup: " + errno_text(errno));
  return SharedRange{fd, a - base};
}

}  // namespace crescent::transfer
