#pragma once
// The transfer engine's control and data protocol (internal). Every message is a net::Frame;
// payload fields are little-endian (net::ByteWriter/ByteReader). Versioned through the HELLO.
//
//   (AUTH_*     net/auth/handshake.h's challenge-response first, only when the engine has a token)
//   HELLO       initiator -> target: protocol version, transport, name, an empty field (once a
//               clear-text token), connection index
//   HELLO_OK    target -> initiator: target name          ERROR: code, message (then close)
//   WRITE_DATA  piece id, region, offset, length, then `length` bytes written straight into
//               the region after the bounds check (tcp)   -> ACK: piece id, code, message
//   READ_REQ    piece id, region, offset, length (tcp)    -> READ_RESP: piece id, code,
//               message, then the bytes when code is OK
//   WRITE_GROUP group id, n, n x (region, offset, length), then the n payloads back to back
//               (tcp, small ops): every op is checked before any byte is stored; a refused
//               op's payload is drained        -> GROUP_ACK: group id, n, status bytes, n statuses
//   READ_GROUP  group id, n, n x (region, offset, length) (tcp, small ops)
//               -> GROUP_ACK as above, then the bytes of the ops whose status is OK, in order
//   LEASE       lease id, ops (kind, region, offset, length) (shm, ucx): checks and pins
//               -> LEASE_RESP: per-op code + message, grants for regions not yet described on
//               this connection (shm: memfds attached with SCM_RIGHTS; ucx: packed rkeys)
//   RELEASE     lease id -> RELEASE_OK: the one-sided copies are complete and unpinned
//   NOTIFY      message bytes, delivered to the target's callback in order

#include <cstdint>

namespace crescent::transfer::wire {

inline constexpr uint32_t kProtocolVersion = 2;  // 2: WRITE_GROUP, READ_GROUP, GROUP_ACK

enum FrameType : uint16_t {
  kHello = 1,
  kHelloOk = 2,
  kError = 3,
  kWriteData = 10,
  kAck = 11,
  kReadReq = 12,
  kReadResp = 13,
  kWriteGroup = 14,
  kReadGroup = 15,
  kGroupAck = 16,
  kLease = 20,
  kLeaseResp = 21,
  kRelease = 22,
  kReleaseOk = 23,
  kNotify = 30,
};

inline constexpr uint64_t kPieceHeaderBytes = 32;          // id, region, offset, length
inline constexpr uint64_t kMaxPieceBytes = 4 << 20;        // tcp ops are split at this size
inline constexpr uint64_t kGroupHeaderBytes = 12;          // group id, op count
inline constexpr uint64_t kGroupOpBytes = 24;              // region, offset, length
inline constexpr uint32_t kMaxOpsPerGroup = 256;           // stays below IOV_MAX with the headers
inline constexpr uint64_t kMaxGroupedOpBytes = 64 << 10;   // larger ops get their own frame
inline constexpr uint64_t kMaxGroupStatusBytes = 1 << 20;  // n x (code, u32 len, <= 1 KiB text)
inline constexpr uint64_t kMaxGroupStatusMessageBytes = 1024;
inline constexpr uint64_t kMaxControlBytes = 4 << 20;  // LEASE / LEASE_RESP frames
inline constexpr uint64_t kMaxHelloBytes = 4096;
inline constexpr uint32_t kMaxOpsPerLease = 16384;
inline constexpr uint32_t kMaxNameBytes = 256;

}  // namespace crescent::transfer::wire
