#pragma once
// The connector's control protocol between a decode engine (D, the client) and a prefill
// engine (P, the server): one TCP connection per (D, P worker), net/frame.h frames, every
// payload bounded and validated by its decode_*() before use. docs/disagg.md has the message
// flow. Version kProtocolVersion travels in HELLO / HELLO_OK; a mismatch is refused.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "disagg/compat_info.h"

namespace crescent::disagg::protocol {

// 2: KvCompatInfo carries the weights fingerprint.
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr uint64_t kMaxPayloadBytes = 1 << 20;
inline constexpr uint32_t kMaxIdBytes = 256;     // engine ids, transfer ids
inline constexpr uint32_t kMaxTextBytes = 4096;  // messages, compat strings
inline constexpr uint32_t kMaxDescriptorBytes = 64 << 10;
inline constexpr uint32_t kMaxBlocksPerAsk = 200'000;  // 3.2 M tokens at block size 16
inline constexpr uint32_t kMaxPromptTokens = 1 << 24;

enum class MessageType : uint16_t {
  kHello = 1,         // D -> P: who I am, my KV compat info and transfer segment
  kHelloOk = 2,       // P -> D
  kRefused = 3,       // P -> D, then P closes the connection
  kAsk = 4,           // D -> P: write the prompt of transfer_id into these blocks
  kNotNeeded = 5,     // D -> P: D holds the whole prefix; free transfer_id's blocks
  kDone = 6,          // P -> D: the write of transfer_id ended (status, bytes, duration)
  kCancel = 7,        // D -> P: stop; do not write transfer_id
  kCancelAck = 8,     // P -> D: nothing will be written for transfer_id any more
  kHeartbeat = 9,     // D -> P when idle
  kHeartbeatAck = 10  // P -> D
};
std::string message_type_name(uint16_t type);

struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  KvCompatInfo compat;
  uint64_t compat_hash = 0;
  std::string engine_id;
  std::string segment_descriptor;  // transfer::SegmentDescriptor::serialize()
  int64_t region_id = 0;           // D's KV memory in that segment
  uint64_t block_bytes = 0;
  uint32_t num_blocks = 0;
  uint32_t heartbeat_interval_ms = 0;  // D sends heartbeats this often when idle
};

struct HelloOk {
  uint32_t protocol_version = kProtocolVersion;
  std::string engine_id;
};

enum class RefusalKind : uint32_t { kCompatibility = 1, kProtocol = 2, kOther = 3 };
struct Refused {
  RefusalKind kind = RefusalKind::kOther;
  std::string message;
};

struct Ask {
  std::string transfer_id;
  uint32_t num_prompt_tokens = 0;
  uint64_t prompt_hash = 0;
  uint32_t first_block = 0;        // index in the prompt's block table of block_ids[0]
  std::vector<int32_t> block_ids;  // D's blocks for prompt blocks [first_block, +size)
};

// NOT_NEEDED, CANCEL and CANCEL_ACK carry only the transfer id.
struct TransferRef {
  std::string transfer_id;
};

struct Done {
  std::string transfer_id;
  Status status;
  uint64_t num_bytes = 0;
  uint64_t write_ns = 0;  // P's write: submit -> batch complete
};

std::string encode(const Hello& m);
std::string encode(const HelloOk& m);
std::string encode(const Refused& m);
std::string encode(const Ask& m);
std::string encode(const TransferRef& m);
std::string encode(const Done& m);

// Each returns DataLoss or InvalidArgument naming the message and field when the payload is
// truncated, has bytes left over, or a field is out of its bounds.
Result<Hello> decode_hello(std::string_view payload);
Result<HelloOk> decode_hello_ok(std::string_view payload);
// `what` names the message in errors (the EC protocol sends the same payload as EC_REFUSED).
Result<Refused> decode_refused(std::string_view payload, std::string_view what = "REFUSED");
Result<Ask> decode_ask(std::string_view payload);
Result<TransferRef> decode_transfer_ref(std::string_view payload, std::string_view what);
Result<Done> decode_done(std::string_view payload);

// OK when id is 1..kMaxIdBytes printable ASCII characters without spaces.
Status validate_id(std::string_view id, std::string_view what);

// FNV-1a over the little-endian token ids: what D and P compare to agree on the prompt.
uint64_t hash_prompt(std::span<const int32_t> token_ids);

// Number of prompt blocks whose KV the prefill engine sends: ceil((n - 1) / block_size)
// (the last prompt token is recomputed by the decode engine).
uint32_t num_blocks_to_send(uint32_t num_prompt_tokens, int block_size);

}  // namespace crescent::disagg::protocol
