#pragma once
// Framed messages over a byte stream: a fixed 16-byte header (magic, version, type, payload
// length) followed by the payload. The header is validated before any payload is read, so a
// garbage or oversized frame is refused without allocating for it. Thread-safety: as socket.h.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "net/socket.h"

namespace crescent::net {

inline constexpr uint32_t kFrameMagic = 0x43524631;  // "CRF1"
inline constexpr uint16_t kFrameVersion = 1;

struct FrameHeader {
  uint16_t type = 0;
  uint64_t payload_bytes = 0;
};
inline constexpr size_t kFrameHeaderBytes = 16;

// Encodes a header into out[kFrameHeaderBytes].
void encode_frame_header(const FrameHeader& header, uint8_t* out);
// Decodes and validates magic, version and payload_bytes <= max_payload_bytes.
Result<FrameHeader> decode_frame_header(const uint8_t* in, uint64_t max_payload_bytes);

// Reads one header (DataLoss on a bad magic or version, ResourceExhausted when too large).
Result<FrameHeader> read_frame_header(const Fd& fd, uint64_t max_payload_bytes, Deadline deadline,
                                      std::vector<Fd>* fds = nullptr);

struct Frame {
  uint16_t type = 0;
  std::string payload;
};
// Reads a whole frame whose payload must fit in max_payload_bytes.
Result<Frame> read_frame(const Fd& fd, uint64_t max_payload_bytes, Deadline deadline,
                         std::vector<Fd>* fds = nullptr);
// Writes header + payload with one scatter-gather write.
Status write_frame(const Fd& fd, uint16_t type, std::string_view payload, Deadline deadline);

// Little-endian encoding of fixed-width fields into a growing string, and the checked reader.
class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void i64(int64_t v) { put(static_cast<uint64_t>(v), 8); }
  // A u32 length followed by the bytes.
  void bytes(std::string_view v);
  std::string& str() { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void put(uint64_t v, int n);
  std::string out_;
};

// Reads fields in order; any read past the end sets a sticky failure that status() reports.
class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int64_t i64() { return static_cast<int64_t>(get(8)); }
  std::string bytes(uint32_t max_bytes);
  size_t remaining() const { return in_.size() - pos_; }
  bool ok() const { return ok_; }
  // DataLoss naming `what` if any read failed or bytes are left over.
  Status finish(std::string_view what) const;

 private:
  uint64_t get(int n);
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace crescent::net
