#include "disagg/protocol.h"

#include "core/fnv.h"
#include "net/frame.h"

namespace crescent::disagg::protocol {
namespace {

using net::ByteReader;
using net::ByteWriter;

void put_compat(ByteWriter& w, const KvCompatInfo& c) {
  w.bytes(c.model);
  w.bytes(c.dtype);
  w.u32(static_cast<uint32_t>(c.num_layers));
  w.u32(static_cast<uint32_t>(c.num_kv_heads));
  w.u32(static_cast<uint32_t>(c.head_dim));
  w.u32(static_cast<uint32_t>(c.block_size));
  w.bytes(c.layout);
  w.bytes(c.weights);
}

KvCompatInfo get_compat(ByteReader& r) {
  KvCompatInfo c;
  c.model = r.bytes(kMaxTextBytes);
  c.dtype = r.bytes(kMaxTextBytes);
  c.num_layers = static_cast<int>(r.u32());
  c.num_kv_heads = static_cast<int>(r.u32());
  c.head_dim = static_cast<int>(r.u32());
  c.block_size = static_cast<int>(r.u32());
  c.layout = r.bytes(kMaxTextBytes);
  c.weights = r.bytes(kMaxTextBytes);
  return c;
}

Status bad(std::string_view what, std::string_view why) {
  return invalid_argument(std::string(what) + ": " + std::string(why));
}

}  // namespace

std::string message_type_name(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "HELLO";
    case MessageType::kHelloOk:
      return "HELLO_OK";
    case MessageType::kRefused:
      return "REFUSED";
    case MessageType::kAsk:
      return "ASK";
    case MessageType::kNotNeeded:
      return "NOT_NEEDED";
    case MessageType::kDone:
      return "DONE";
    case MessageType::kCancel:
      return "CANCEL";
    case MessageType::kCancelAck:
      return "CANCEL_ACK";
    case MessageType::kHeartbeat:
      return "HEARTBEAT";
    case MessageType::kHeartbeatAck:
      return "HEARTBEAT_ACK";
  }
  return "message type " + std::to_string(type);
}

Status validate_id(std::string_view id, std::string_view what) {
  if (id.empty())
    return invalid_argument(std::string(what) + " is empty");
  if (id.size() > kMaxIdBytes) {
    return invalid_argument(std::string(what) + " is longer than " + std::to_string(kMaxIdBytes) +
                            " bytes");
  }
  for (char c : id) {
    if (c <= ' ' || c > '~')
      return invalid_argument(std::string(what) + " has a character that is not printable ASCII");
  }
  return Status::ok();
}

std::string encode(const Hello& m) {
  ByteWriter w;
  w.u32(m.protocol_version);
  put_compat(w, m.compat);
  w.u64(m.compat_hash);
  w.bytes(m.engine_id);
  w.bytes(m.segment_descriptor);
  w.i64(m.region_id);
  w.u64(m.block_bytes);
  w.u32(m.num_blocks);
  w.u32(m.heartbeat_interval_ms);
  return w.take();
}

Result<Hello> decode_hello(std::string_view payload) {
  ByteReader r(payload);
  Hello m;
  m.protocol_version = r.u32();
  // A peer speaking another version may lay the rest out differently: report that first.
  if (r.ok() && m.protocol_version != kProtocolVersion) {
    return failed_precondition("HELLO: protocol version " + std::to_string(m.protocol_version) +
                               ", this engine speaks " + std::to_string(kProtocolVersion));
  }
  m.compat = get_compat(r);
  m.compat_hash = r.u64();
  m.engine_id = r.bytes(kMaxIdBytes);
  m.segment_descriptor = r.bytes(kMaxDescriptorBytes);
  m.region_id = r.i64();
  m.block_bytes = r.u64();
  m.num_blocks = r.u32();
  m.heartbeat_interval_ms = r.u32();
  RETURN_IF_ERROR(r.finish("HELLO"));
  RETURN_IF_ERROR(validate_id(m.engine_id, "HELLO engine_id"));
  if (m.compat_hash != m.compat.hash())
    return bad("HELLO", "compat_hash does not match the compat info");
  if (m.segment_descriptor.empty())
    return bad("HELLO", "empty segment descriptor");
  if (m.region_id < 0)
    return bad("HELLO", "negative region id");
  if (m.block_bytes == 0 || m.num_blocks == 0)
    return bad("HELLO", "block_bytes and num_blocks must be positive");
  if (m.heartbeat_interval_ms < 10 || m.heartbeat_interval_ms > 600'000)
    return bad("HELLO", "heartbeat_interval_ms must be 10..600000");
  return m;
}

std::string encode(const HelloOk& m) {
  ByteWriter w;
  w.u32(m.protocol_version);
  w.bytes(m.engine_id);
  return w.take();
}

Result<HelloOk> decode_hello_ok(std::string_view payload) {
  ByteReader r(payload);
  HelloOk m;
  m.protocol_version = r.u32();
  m.engine_id = r.bytes(kMaxIdBytes);
  RETURN_IF_ERROR(r.finish("HELLO_OK"));
  if (m.protocol_version != kProtocolVersion) {
    return failed_precondition("HELLO_OK: protocol version " + std::to_string(m.protocol_version) +
                               ", this engine speaks " + std::to_string(kProtocolVersion));
  }
  RETURN_IF_ERROR(validate_id(m.engine_id, "HELLO_OK engine_id"));
  return m;
}

std::string encode(const Refused& m) {
  ByteWriter w;
  w.u32(static_cast<uint32_t>(m.kind));
  w.bytes(m.message.substr(0, kMaxTextBytes));
  return w.take();
}

Result<Refused> decode_refused(std::string_view payload, std::string_view what) {
  ByteReader r(payload);
  Refused m;
  uint32_t kind = r.u32();
  m.message = r.bytes(kMaxTextBytes);
  RETURN_IF_ERROR(r.finish(what));
  if (kind < 1 || kind > 3)
    return bad(what, "unknown refusal kind " + std::to_string(kind));
  m.kind = static_cast<RefusalKind>(kind);
  return m;
}

std::string encode(const Ask& m) {
  ByteWriter w;
  w.bytes(m.transfer_id);
  w.u32(m.num_prompt_tokens);
  w.u64(m.prompt_hash);
  w.u32(m.first_block);
  w.u32(static_cast<uint32_t>(m.block_ids.size()));
  for (int32_t id : m.block_ids) {
    w.u32(static_cast<uint32_t>(id));
  }
  return w.take();
}

Result<Ask> decode_ask(std::string_view payload) {
  ByteReader r(payload);
  Ask m;
  m.transfer_id = r.bytes(kMaxIdBytes);
  m.num_prompt_tokens = r.u32();
  m.prompt_hash = r.u64();
  m.first_block = r.u32();
  uint32_t n = r.u32();
  if (!r.ok())
    return data_loss("ASK: truncated");
  if (n == 0 || n > kMaxBlocksPerAsk) {
    return bad("ASK", "block count " + std::to_string(n) + " is not in 1.." +
                          std::to_string(kMaxBlocksPerAsk));
  }
  if (r.remaining() != uint64_t{n} * 4)
    return data_loss("ASK: block count does not match the payload size");
  m.block_ids.resize(n);
  for (auto& id : m.block_ids) {
    id = static_cast<int32_t>(r.u32());
    if (id < 0)
      return bad("ASK", "negative block id");
  }
  RETURN_IF_ERROR(r.finish("ASK"));
  RETURN_IF_ERROR(validate_id(m.transfer_id, "ASK transfer_id"));
  if (m.num_prompt_tokens < 2 || m.num_prompt_tokens > kMaxPromptTokens)
    return bad("ASK", "num_prompt_tokens " + std::to_string(m.num_prompt_tokens) +
                          " is not in 2.." + std::to_string(kMaxPromptTokens));
  return m;
}

std::string encode(const TransferRef& m) {
  ByteWriter w;
  w.bytes(m.transfer_id);
  return w.take();
}

Result<TransferRef> decode_transfer_ref(std::string_view payload, std::string_view what) {
  ByteReader r(payload);
  TransferRef m;
  m.transfer_id = r.bytes(kMaxIdBytes);
  RETURN_IF_ERROR(r.finish(what));
  RETURN_IF_ERROR(validate_id(m.transfer_id, std::string(what) + " transfer_id"));
  return m;
}

std::string encode(const Done& m) {
  ByteWriter w;
  w.bytes(m.transfer_id);
  w.u32(static_cast<uint32_t>(m.status.code()));
  w.bytes(m.status.message().substr(0, kMaxTextBytes));
  w.u64(m.num_bytes);
  w.u64(m.write_ns);
  return w.take();
}

Result<Done> decode_done(std::string_view payload) {
  ByteReader r(payload);
  Done m;
  m.transfer_id = r.bytes(kMaxIdBytes);
  uint32_t code = r.u32();
  std::string message = r.bytes(kMaxTextBytes);
  m.num_bytes = r.u64();
  m.write_ns = r.u64();
  RETURN_IF_ERROR(r.finish("DONE"));
  RETURN_IF_ERROR(validate_id(m.transfer_id, "DONE transfer_id"));
  if (code > static_cast<uint32_t>(StatusCode::kInternal))
    return bad("DONE", "unknown status code " + std::to_string(code));
  if (code == 0 && !message.empty())
    return bad("DONE", "an OK status with a message");
  if (code != 0 && message.empty())
    return bad("DONE", "a failure without a message");
  if (code != 0)
    m.status = Status(static_cast<StatusCode>(code), std::move(message));
  return m;
}

uint64_t hash_prompt(std::span<const int32_t> token_ids) {
  Fnv1a64 h;
  for (int32_t t : token_ids) {
    auto v = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i)
      h.byte(static_cast<uint8_t>(v >> (8 * i)));  // little-endian
  }
  return h.value();
}

uint32_t num_blocks_to_send(uint32_t num_prompt_tokens, int block_size) {
  if (num_prompt_tokens < 2 || block_size <= 0)
    return 0;
  auto b = static_cast<uint32_t>(block_size);
  return (num_prompt_tokens - 1 + b - 1) / b;
}

}  // namespace crescent::disagg::protocol
