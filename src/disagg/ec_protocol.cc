#include "disagg/ec_protocol.h"

#include <nlohmann/json.hpp>

#include "core/json.h"
#include "disagg/protocol.h"
#include "net/frame.h"
#include "net/socket.h"

namespace crescent::disagg {
namespace {

using net::ByteReader;
using net::ByteWriter;

Status bad_field(std::string_view where, std::string_view field, std::string_view why) {
  std::string s(where);
  s += ".";
  s += field;
  s += ": ";
  s += why;
  return invalid_argument(std::move(s));
}

Status check_worker_addr(std::string_view addr) {
  constexpr std::string_view kScheme = "tcp://";
  if (addr.substr(0, kScheme.size()) != kScheme)
    return invalid_argument("must be \"tcp://HOST:PORT\"");
  std::string host;
  int port = 0;
  Status s = net::parse_host_port(std::string(addr.substr(kScheme.size())), &host, &port);
  if (!s.is_ok() || host.empty())
    return invalid_argument("must be \"tcp://HOST:PORT\"");
  return Status::ok();
}

// "file:///abs/dir": what the disk connector puts in worker_addr.
Status check_disk_addr(std::string_view addr) {
  const std::string_view dir = addr.substr(kEcDiskScheme.size());
  if (addr.size() > ec_protocol::kMaxTextBytes || dir.empty() || dir.front() != '/')
    return invalid_argument("must be \"file://\" followed by an absolute directory");
  for (char c : dir) {
    if (static_cast<unsigned char>(c) < ' ' || c == 0x7f)
      return invalid_argument("has a control character");
  }
  return Status::ok();
}

// The disk connector turns mm_hash into a file name: no separators, no dot files.
Status check_file_name_id(std::string_view id) {
  if (id.size() > 200)
    return invalid_argument("longer than 200 bytes (the disk connector's file name)");
  for (char c : id) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '-' || c == '_';
    if (!ok)
      return invalid_argument("must be letters, digits, '-' or '_' for the disk connector");
  }
  return Status::ok();
}

Status check_bootstrap_addr(std::string_view addr) {
  if (addr.empty())
    return Status::ok();
  // An etcd url (docs/bootstrap.md) names the key prefix the encoder registered under.
  std::string_view scheme = addr.substr(0, 7) == "etcd://" ? "etcd://" : "http://";
  if (addr.size() > ec_protocol::kMaxTextBytes || addr.substr(0, scheme.size()) != scheme ||
      addr.size() == scheme.size()) {
    return invalid_argument("must be empty, \"http://HOST:PORT\" or \"etcd://HOST:PORT/PREFIX\"");
  }
  return Status::ok();
}

}  // namespace

Status validate_ec_tensor_ref(const EcTensorRef& ref, std::string_view where) {
  if (Status s = protocol::validate_id(ref.mm_hash, "mm_hash"); !s.is_ok())
    return bad_field(where, "mm_hash", s.message());
  if (Status s = protocol::validate_id(ref.engine_id, "engine_id"); !s.is_ok())
    return bad_field(where, "engine_id", s.message());
  if (is_disk_ref(ref)) {
    if (Status s = check_disk_addr(ref.worker_addr); !s.is_ok())
      return bad_field(where, "worker_addr", s.message());
    if (Status s = check_file_name_id(ref.mm_hash); !s.is_ok())
      return bad_field(where, "mm_hash", s.message());
  } else if (Status s = check_worker_addr(ref.worker_addr); !s.is_ok()) {
    return bad_field(where, "worker_addr", "must be \"tcp://HOST:PORT\" or \"file:///DIR\"");
  }
  if (Status s = check_bootstrap_addr(ref.bootstrap_addr); !s.is_ok())
    return bad_field(where, "bootstrap_addr", s.message());
  if (ref.reservation_id == 0)
    return bad_field(where, "reservation_id", "must be a positive integer");
  if (ref.shape.size() != 2 || ref.shape[0] <= 0 || ref.shape[1] <= 0 ||
      ref.shape[0] > kMaxEcTokensPerImage || ref.shape[1] > kMaxEcHiddenSize) {
    return bad_field(where, "shape",
                     "must be [num_tokens, hidden_size] of positive integers (at most " +
                         std::to_string(kMaxEcTokensPerImage) + " tokens, hidden size at most " +
                         std::to_string(kMaxEcHiddenSize) + ")");
  }
  if (ref.dtype != "float32")
    return bad_field(where, "dtype", "\"" + ref.dtype + "\" is not supported (only \"float32\")");
  const auto expected = static_cast<uint64_t>(ref.shape[0] * ref.shape[1]) * 4;
  if (ref.num_bytes != expected) {
    return bad_field(
        where, "num_bytes",
        std::to_string(ref.num_bytes) + " is not product(shape) * 4 = " + std::to_string(expected));
  }
  if (ref.expires_at_unix_ms < 0)
    return bad_field(where, "expires_at_unix_ms", "must not be negative");
  if (ref.has_location) {
    if (is_disk_ref(ref))
      return bad_field(where, "region", "a disk connector's item has no pool location");
    if (ref.region_id < 0)
      return bad_field(where, "region", "must be a non-negative integer");
    if (ref.offset + ref.num_bytes < ref.offset)
      return bad_field(where, "offset", "offset + num_bytes overflows");
    if (ref.instance == 0 || ref.instance > kMaxEcInstance) {
      return bad_field(where, "instance",
                       "must be 1.." + std::to_string(kMaxEcInstance) + " with a location");
    }
    if (ref.stamp > kMaxEcInstance)
      return bad_field(where, "stamp", "must be 1.." + std::to_string(kMaxEcInstance));
    if (ref.stamp != 0 && ref.offset < kEcStampBytes)
      return bad_field(where, "offset", "a stamped tensor starts at least 8 bytes in");
  } else if (ref.stamp != 0) {
    return bad_field(where, "stamp", "only an item with a location has a stamp");
  }
  return Status::ok();
}

bool is_disk_ref(const EcTensorRef& ref) {
  return ref.worker_addr.substr(0, kEcDiskScheme.size()) == kEcDiskScheme;
}

nlohmann::json ec_transfer_params_to_json(std::span<const EcTensorRef> items) {
  nlohmann::json list = nlohmann::json::array();
  for (const EcTensorRef& r : items) {
    list.push_back({{"mm_hash", r.mm_hash},
                    {"engine_id", r.engine_id},
                    {"worker_addr", r.worker_addr},
                    {"bootstrap_addr", r.bootstrap_addr},
                    {"reservation_id", r.reservation_id},
                    {"shape", r.shape},
                    {"dtype", r.dtype},
                    {"num_bytes", r.num_bytes},
                    {"expires_at_unix_ms", r.expires_at_unix_ms}});
    if (r.has_location) {
      list.back()["region"] = r.region_id;
      list.back()["offset"] = r.offset;
      list.back()["instance"] = r.instance;
      if (r.stamp != 0)
        list.back()["stamp"] = r.stamp;
    }
  }
  return nlohmann::json{{"items", std::move(list)}};
}

Result<std::vector<EcTensorRef>> parse_ec_transfer_params(const nlohmann::json& j) {
  // Every access is type-checked first, so nothing here throws.
  if (!j.is_object())
    return invalid_argument("ec_transfer_params: must be an object {\"items\": [...]}");
  auto items = j.find("items");
  if (items == j.end() || !items->is_array())
    return invalid_argument("ec_transfer_params.items: must be an array");
  if (items->size() > kMaxEcItems) {
    return invalid_argument("ec_transfer_params.items: more than " + std::to_string(kMaxEcItems) +
                            " items");
  }
  std::vector<EcTensorRef> refs;
  refs.reserve(items->size());
  for (size_t i = 0; i < items->size(); ++i) {
    const nlohmann::json& item = (*items)[i];
    const std::string where = "ec_transfer_params.items[" + std::to_string(i) + "]";
    if (!item.is_object())
      return invalid_argument(where + ": must be an object");
    EcTensorRef ref;
    ASSIGN_OR_RETURN(ref.mm_hash, json_string_field(item, "mm_hash", where));
    ASSIGN_OR_RETURN(ref.engine_id, json_string_field(item, "engine_id", where));
    ASSIGN_OR_RETURN(ref.worker_addr, json_string_field(item, "worker_addr", where));
    ASSIGN_OR_RETURN(ref.bootstrap_addr, json_string_field(item, "bootstrap_addr", where));
    ASSIGN_OR_RETURN(ref.reservation_id, json_unsigned_field(item, "reservation_id", where));
    auto shape = item.find("shape");
    if (shape == item.end())
      return bad_field(where, "shape", "missing");
    if (!shape->is_array())
      return bad_field(where, "shape", "must be an array [num_tokens, hidden_size]");
    for (const auto& d : *shape) {
      if (!d.is_number_integer())
        return bad_field(where, "shape", "must be an array of integers");
      ref.shape.push_back(d.get<int64_t>());
    }
    ASSIGN_OR_RETURN(ref.dtype, json_string_field(item, "dtype", where));
    ASSIGN_OR_RETURN(ref.num_bytes, json_unsigned_field(item, "num_bytes", where));
    ASSIGN_OR_RETURN(uint64_t expires, json_unsigned_field(item, "expires_at_unix_ms", where,
                                                           static_cast<uint64_t>(INT64_MAX)));
    ref.expires_at_unix_ms = static_cast<int64_t>(expires);
    // The location is optional (older encoders omit it), but all or nothing.
    const bool has_region = item.contains("region");
    const bool has_offset = item.contains("offset");
    const bool has_instance = item.contains("instance");
    if (has_region || has_offset || has_instance) {
      if (!has_region)
        return bad_field(where, "region", "missing (offset or instance is present)");
      if (!has_offset)
        return bad_field(where, "offset", "missing (region or instance is present)");
      if (!has_instance)
        return bad_field(where, "instance", "missing (region or offset is present)");
      ASSIGN_OR_RETURN(uint64_t region, json_unsigned_field(item, "region", where,
                                                            static_cast<uint64_t>(INT64_MAX)));
      ref.has_location = true;
      ref.region_id = static_cast<int64_t>(region);
      ASSIGN_OR_RETURN(ref.offset, json_unsigned_field(item, "offset", where));
      ASSIGN_OR_RETURN(ref.instance, json_unsigned_field(item, "instance", where));
      if (item.contains("stamp")) {
        ASSIGN_OR_RETURN(ref.stamp, json_unsigned_field(item, "stamp", where));
        if (ref.stamp == 0)
          return bad_field(where, "stamp", "must be 1.." + std::to_string(kMaxEcInstance));
      }
    } else if (item.contains("stamp")) {
      return bad_field(where, "stamp", "only an item with a location has a stamp");
    }
    RETURN_IF_ERROR(validate_ec_tensor_ref(ref, where));
    refs.push_back(std::move(ref));
  }
  return refs;
}

std::string describe_ec_compat_difference(const EcCompat& here, std::string_view here_name,
                                          const EcCompat& peer, std::string_view peer_name) {
  auto sides = [&](const char* field, const std::string& a, const std::string& b) {
    std::string s(field);
    s += ": " + a + " at " + std::string(here_name) + ", " + b + " at " + std::string(peer_name);
    return s;
  };
  auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  if (here.vision_model != peer.vision_model)
    return sides("vision_model", quoted(here.vision_model), quoted(peer.vision_model));
  if (here.dtype != peer.dtype)
    return sides("dtype", quoted(here.dtype), quoted(peer.dtype));
  if (here.hidden_size != peer.hidden_size) {
    return sides("hidden_size", std::to_string(here.hidden_size), std::to_string(peer.hidden_size));
  }
  if (here.preprocess_hash != peer.preprocess_hash)
    return sides("preprocess_hash", quoted(here.preprocess_hash), quoted(peer.preprocess_hash));
  return "";
}

namespace ec_protocol {
namespace {

Status bad(std::string_view what, std::string_view why) {
  return invalid_argument(std::string(what) + ": " + std::string(why));
}

Status check_version(std::string_view what, uint32_t version) {
  if (version == kProtocolVersion)
    return Status::ok();
  return failed_precondition(std::string(what) + ": EC protocol version " +
                             std::to_string(version) + ", this side speaks " +
                             std::to_string(kProtocolVersion));
}

}  // namespace

std::string message_type_name(uint16_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "EC_HELLO";
    case MessageType::kHelloOk:
      return "EC_HELLO_OK";
    case MessageType::kRefused:
      return "EC_REFUSED";
    case MessageType::kAcquire:
      return "EC_ACQUIRE";
    case MessageType::kAcquired:
      return "EC_ACQUIRED";
    case MessageType::kAcquireFailed:
      return "EC_ACQUIRE_FAILED";
    case MessageType::kRelease:
      return "EC_RELEASE";
    case MessageType::kReleased:
      return "EC_RELEASED";
    case MessageType::kHeartbeat:
      return "HEARTBEAT";
    case MessageType::kHeartbeatAck:
      return "HEARTBEAT_ACK";
  }
  return "message type " + std::to_string(type);
}

std::string encode(const Hello& m) {
  ByteWriter w;
  w.u32(m.protocol_version);
  w.bytes(m.compat.vision_model);
  w.bytes(m.compat.dtype);
  w.i64(m.compat.hidden_size);
  w.bytes(m.compat.preprocess_hash);
  w.bytes(m.consumer_name);
  w.u32(m.heartbeat_interval_ms);
  return w.take();
}

Result<Hello> decode_hello(std::string_view payload) {
  ByteReader r(payload);
  Hello m;
  m.protocol_version = r.u32();
  // Another version may lay the rest out differently: report the version first.
  if (r.ok())
    RETURN_IF_ERROR(check_version("EC_HELLO", m.protocol_version));
  m.compat.vision_model = r.bytes(kMaxTextBytes);
  m.compat.dtype = r.bytes(kMaxTextBytes);
  m.compat.hidden_size = r.i64();
  m.compat.preprocess_hash = r.bytes(kMaxTextBytes);
  m.consumer_name = r.bytes(kMaxIdBytes);
  m.heartbeat_interval_ms = r.u32();
  RETURN_IF_ERROR(r.finish("EC_HELLO"));
  if (m.compat.hidden_size < 0 || m.compat.hidden_size > kMaxEcHiddenSize)
    return bad("EC_HELLO", "hidden_size out of range");
  if (m.heartbeat_interval_ms < 10 || m.heartbeat_interval_ms > 600'000)
    return bad("EC_HELLO", "heartbeat_interval_ms must be 10..600000");
  return m;
}

std::string encode(const HelloOk& m) {
  ByteWriter w;
  w.u32(m.protocol_version);
  w.bytes(m.engine_id);
  w.bytes(m.segment_descriptor);
  return w.take();
}

Result<HelloOk> decode_hello_ok(std::string_view payload) {
  ByteReader r(payload);
  HelloOk m;
  m.protocol_version = r.u32();
  if (r.ok())
    RETURN_IF_ERROR(check_version("EC_HELLO_OK", m.protocol_version));
  m.engine_id = r.bytes(kMaxIdBytes);
  m.segment_descriptor = r.bytes(kMaxDescriptorBytes);
  RETURN_IF_ERROR(r.finish("EC_HELLO_OK"));
  RETURN_IF_ERROR(protocol::validate_id(m.engine_id, "EC_HELLO_OK engine_id"));
  if (m.segment_descriptor.empty())
    return bad("EC_HELLO_OK", "empty segment descriptor");
  return m;
}

std::string encode(const Acquire& m) {
  ByteWriter w;
  w.u64(m.reservation_id);
  w.bytes(m.mm_hash);
  w.u64(m.num_bytes);
  return w.take();
}

Result<Acquire> decode_acquire(std::string_view payload) {
  ByteReader r(payload);
  Acquire m;
  m.reservation_id = r.u64();
  m.mm_hash = r.bytes(kMaxIdBytes);
  m.num_bytes = r.u64();
  RETURN_IF_ERROR(r.finish("EC_ACQUIRE"));
  if (m.reservation_id == 0)
    return bad("EC_ACQUIRE", "reservation_id 0");
  RETURN_IF_ERROR(protocol::validate_id(m.mm_hash, "EC_ACQUIRE mm_hash"));
  if (m.num_bytes == 0)
    return bad("EC_ACQUIRE", "num_bytes 0");
  return m;
}

std::string encode(const Acquired& m) {
  ByteWriter w;
  w.u64(m.reservation_id);
  w.i64(m.region_id);
  w.u64(m.offset);
  w.u64(m.num_bytes);
  return w.take();
}

Result<Acquired> decode_acquired(std::string_view payload) {
  ByteReader r(payload);
  Acquired m;
  m.reservation_id = r.u64();
  m.region_id = r.i64();
  m.offset = r.u64();
  m.num_bytes = r.u64();
  RETURN_IF_ERROR(r.finish("EC_ACQUIRED"));
  if (m.reservation_id == 0)
    return bad("EC_ACQUIRED", "reservation_id 0");
  if (m.region_id < 0)
    return bad("EC_ACQUIRED", "negative region id");
  if (m.num_bytes == 0 || m.offset + m.num_bytes < m.offset)
    return bad("EC_ACQUIRED", "empty or overflowing range");
  return m;
}

std::string encode(const AcquireFailed& m) {
  ByteWriter w;
  w.u64(m.reservation_id);
  w.u32(static_cast<uint32_t>(m.reason));
  w.bytes(m.message.substr(0, kMaxTextBytes));
  return w.take();
}

Result<AcquireFailed> decode_acquire_failed(std::string_view payload) {
  ByteReader r(payload);
  AcquireFailed m;
  m.reservation_id = r.u64();
  uint32_t reason = r.u32();
  m.message = r.bytes(kMaxTextBytes);
  RETURN_IF_ERROR(r.finish("EC_ACQUIRE_FAILED"));
  if (reason < 1 || reason > 4)
    return bad("EC_ACQUIRE_FAILED", "unknown reason " + std::to_string(reason));
  if (m.message.empty())
    return bad("EC_ACQUIRE_FAILED", "no message");
  m.reason = static_cast<AcquireFailure>(reason);
  return m;
}

std::string encode(const Release& m) {
  ByteWriter w;
  w.u64(m.reservation_id);
  w.bytes(m.mm_hash);
  if (m.has_location) {
    w.u64(m.instance);
    w.i64(m.region_id);
    w.u64(m.offset);
  }
  return w.take();
}

Result<Release> decode_release(std::string_view payload) {
  ByteReader r(payload);
  Release m;
  m.reservation_id = r.u64();
  m.mm_hash = r.bytes(kMaxIdBytes);
  // Without a location it ends here (what older consumers send).
  if (r.ok() && r.remaining() > 0) {
    m.has_location = true;
    m.instance = r.u64();
    m.region_id = r.i64();
    m.offset = r.u64();
  }
  RETURN_IF_ERROR(r.finish("EC_RELEASE"));
  if (m.reservation_id == 0)
    return bad("EC_RELEASE", "reservation_id 0");
  RETURN_IF_ERROR(protocol::validate_id(m.mm_hash, "EC_RELEASE mm_hash"));
  if (m.has_location && (m.instance == 0 || m.instance > kMaxEcInstance))
    return bad("EC_RELEASE", "instance out of range");
  if (m.has_location && m.region_id < 0)
    return bad("EC_RELEASE", "negative region id");
  return m;
}

std::string encode(const Released& m) {
  ByteWriter w;
  w.u64(m.reservation_id);
  w.u8(m.was_held ? 1 : 0);
  return w.take();
}

Result<Released> decode_released(std::string_view payload) {
  ByteReader r(payload);
  Released m;
  m.reservation_id = r.u64();
  uint8_t held = r.u8();
  RETURN_IF_ERROR(r.finish("EC_RELEASED"));
  if (m.reservation_id == 0)
    return bad("EC_RELEASED", "reservation_id 0");
  if (held > 1)
    return bad("EC_RELEASED", "was_held must be 0 or 1");
  m.was_held = held == 1;
  return m;
}

}  // namespace ec_protocol
}  // namespace crescent::disagg
