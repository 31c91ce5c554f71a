#include "net/frame.h"

#include <cstring>

namespace crescent::net {

namespace {
void put_le(uint8_t* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) {
    out[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}
uint64_t get_le(const uint8_t* in, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(in[i]) << (8 * i);
  }
  return v;
}
}  // namespace

void encode_frame_header(const FrameHeader& header, uint8_t* out) {
  put_le(out, kFrameMagic, 4);
  put_le(out + 4, kFrameVersion, 2);
  put_le(out + 6, header.type, 2);
  put_le(out + 8, header.payload_bytes, 8);
}

Result<FrameHeader> decode_frame_header(const uint8_t* in, uint64_t max_payload_bytes) {
  if (get_le(in, 4) != kFrameMagic)
    return data_loss("bad frame magic");
  uint64_t version = get_le(in + 4, 2);
  if (version != kFrameVersion) {
    return data_loss("unsupported frame version " + std::to_string(version));
  }
  FrameHeader h;
  h.type = static_cast<uint16_t>(get_le(in + 6, 2));
  h.payload_bytes = get_le(in + 8, 8);
  if (h.payload_bytes > max_payload_bytes) {
    return resource_exhausted("frame of " + std::to_string(h.payload_bytes) +
                              " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  }
  return h;
}

Result<FrameHeader> read_frame_header(const Fd& fd, uint64_t max_payload_bytes, Deadline deadline,
                                      std::vector<Fd>* fds) {
  uint8_t buf[kFrameHeaderBytes];
  RETURN_IF_ERROR(read_exact(fd, buf, sizeof(buf), deadline, fds));
  return decode_frame_header(buf, max_payload_bytes);
}

Result<Frame> read_frame(const Fd& fd, uint64_t max_payload_bytes, Deadline deadline,
                         std::vector<Fd>* fds) {
  ASSIGN_OR_RETURN(FrameHeader h, read_frame_header(fd, max_payload_bytes, deadline, fds));
  Frame f;
  f.type = h.type;
  f.payload.resize(h.payload_bytes);
  RETURN_IF_ERROR(read_exact(fd, f.payload.data(), f.payload.size(), deadline));
  return f;
}

Status write_frame(const Fd& fd, uint16_t type, std::string_view payload, Deadline deadline) {
  uint8_t header[kFrameHeaderBytes];
  encode_frame_header({type, payload.size()}, header);
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<char*>(payload.data()), payload.size()}};
  return write_all(fd, iov, deadline);
}

void ByteWriter::put(uint64_t v, int n) {
  for (int i = 0; i < n; ++i) {
    out_.push_back(static_cast<char>(static_cast<uint8_t>(v >> (8 * i))));
  }
}

void ByteWriter::bytes(std::string_view v) {
  u32(static_cast<uint32_t>(v.size()));
  out_.append(v);
}

uint64_t ByteReader::get(int n) {
  if (!ok_ || remaining() < static_cast<size_t>(n)) {
    ok_ = false;
    return 0;
  }
  uint64_t v = get_le(reinterpret_cast<const uint8_t*>(in_.data() + pos_), n);
  pos_ += static_cast<size_t>(n);
  return v;
}

std::string ByteReader::bytes(uint32_t max_bytes) {
  uint32_t n = u32();
  if (!ok_ || n > max_bytes || remaining() < n) {
    ok_ = false;
    return {};
  }
  std::string s(in_.substr(pos_, n));
  pos_ += n;
  return s;
}

Status ByteReader::finish(std::string_view what) const {
  if (!ok_)
    return data_loss(std::string(what) + ": truncated or malformed message");
  if (remaining() != 0)
    return data_loss(std::string(what) + ": trailing bytes in message");
  return Status::ok();
}

}  // namespace crescent::net
