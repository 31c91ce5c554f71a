#pragma once
// The EC (encoder cache) connector's data types and wire protocol (EPD, DESIGN.md §2b).
//
// ec_transfer_params: what an encoder worker answers the proxy for each image, and what the
// proxy forwards to the prefill worker: {"items": [EcTensorRef...]} (JSON, below). Each item
// names one tensor in one encoder's pool and the reservation that keeps it there for one
// consumer.
//
// Control protocol between an EC consumer (a prefill worker, the client) and an EC producer
// (an encoder worker, the server): TCP to the ref's worker_addr, net/frame.h frames carried by
// ControlChannel, every payload bounded and validated by its decode_*() before use.
//   C -> P  EC_HELLO       {version, EcCompat, consumer name, heartbeat interval}
//   P -> C  EC_HELLO_OK    {version, engine_id, transfer segment descriptor}
//        or EC_REFUSED     {kind, reason naming both sides}, then P closes
// Normal path, a ref with a location (region, offset, instance; every ref this version
// publishes): no ACQUIRE round trip.
//   C: READ [offset, +num_bytes) of the region through the transfer engine, for every ref of
//      the group in one batch
//   C -> P  EC_RELEASE     {reservation_id, mm_hash, instance, region id, offset}, for every
//                          ref at once (pipelined)
//   P -> C  EC_RELEASED    {reservation_id, was_held}: was_held = the reservation was live, at
//                          that location of this producer instance, and this release ended it
// Why the bytes are then sound: a reserved entry is never evicted or rewritten while any
// reservation on it is live (EcTensorPool), a ref is published only after its entry was
// written, and a reservation id is never reissued by one producer instance (the instance id,
// random per EcProducer, tells a restarted encoder on the same address apart). So a
// reservation still live at RELEASE, sent after the READ completed, was live during the whole
// READ, and the bytes read were the entry's. was_held false (expired, released, unknown,
// another instance) fails that ref with NotFound, and the caller falls back; the bytes already
// in its destination are not used.
// shm fast path, a ref with a location and a stamp, to an encoder this consumer already met:
//   C: copies the tensor out of the encoder's pool mapped into its own address space and
//      checks it against the stamp before the tensor (EcTensorPool's seqlock contract), then
//   C -> P  EC_RELEASE (located) asynchronously; its EC_RELEASED is not waited for.
// Old path, a ref without a location (older encoders): pin first, then read.
//   C -> P  EC_ACQUIRE     {reservation_id, mm_hash, num_bytes}
//   P -> C  EC_ACQUIRED    {reservation_id, region id, offset, num_bytes}: the reservation is
//                          pinned ("pulling") for this connection: it does not expire while the
//                          connection lives
//        or EC_ACQUIRE_FAILED {reservation_id, reason (not found / expired / mismatch /
//                          busy), message}
//   C: READ, then EC_RELEASE {reservation_id, mm_hash} -> EC_RELEASED {reservation_id,
//      was_held}, which must be true (the pin held for the whole READ).
// EC_RELEASE without a location is also how a consumer gives up reservations it never read.
//   C -> P  HEARTBEAT / P -> C HEARTBEAT_ACK: the KV protocol's frames (types 9, 10), which
//           ControlChannel sends; either side drops the connection after 3 silent intervals.
// A connection that closes releases every reservation it acquired (not those it only read:
// they expire, or the consumer's EC_RELEASE queued before closing ends them). The consumer
// trusts the bytes it READ only after EC_RELEASED (was_held) arrived on the same connection.
// Message type numbers (101..108) differ from the KV protocol's, so a peer speaking the other
// protocol is refused with a clear "unexpected message".
//
// The disk connector (ec_disk_connector.h, --ec-connector disk) uses the same items with
// worker_addr "file://DIR" (an absolute directory): the tensor is DIR/<mm_hash>.safetensors,
// no control protocol is spoken, and the consumer reads it from its own --ec-path.

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "disagg/ec_tensor_pool.h"
#include "disagg/protocol.h"

namespace crescent::disagg {

// One image's entry of "ec_transfer_params": {"items": [EcTensorRef...]}.
struct EcTensorRef {
  std::string mm_hash;          // content hash (hex) of the image, as the server computes it
  std::string engine_id;        // the encoder's engine id
  std::string worker_addr;      // the encoder's EC control listener, "tcp://HOST:PORT"; or
                                // "file:///ABSOLUTE/DIR" for the disk connector
  std::string bootstrap_addr;   // optional "http://HOST:PORT" where engine_id is registered
  uint64_t reservation_id = 0;  // the pool reservation held for this consumer (never 0)
  std::vector<int64_t> shape;   // {num_tokens, hidden_size}
  std::string dtype = "float32";
  uint64_t num_bytes = 0;          // product(shape) * 4
  int64_t expires_at_unix_ms = 0;  // the reservation's deadline (wall clock, for humans/proxy)
  // Where the tensor lies in the encoder's pool, valid only at the producer instance that
  // published it. Absent (false) in refs of older encoders: the consumer sends EC_ACQUIRE.
  bool has_location = false;
  int64_t region_id = 0;  // "region": the pool's transfer region id at the encoder
  uint64_t offset = 0;    // "offset": bytes into that region
  uint64_t instance = 0;  // "instance": the publishing EcProducer's random id, 1..kMaxEcInstance
  // "stamp" (optional, with a location): the entry's stamp in the kEcStampBytes just before
  // offset (EcTensorPool), 1..kMaxEcInstance; 0 = none. On shm it lets a consumer that mapped
  // the pool check its copy without a round trip (ec_consumer.h).
  uint64_t stamp = 0;
};

inline constexpr size_t kMaxEcItems = 1024;               // images per request
inline constexpr int64_t kMaxEcTokensPerImage = 1 << 20;  // shape[0]
inline constexpr int64_t kMaxEcHiddenSize = 1 << 16;      // shape[1]
// Instance ids stay exact in a JSON double.
inline constexpr uint64_t kMaxEcInstance = (uint64_t{1} << 53) - 1;

// {"items":[{"mm_hash":..., "engine_id":..., "worker_addr":..., "bootstrap_addr":...,
// "reservation_id":..., "shape":[t,h], "dtype":"float32", "num_bytes":...,
// "expires_at_unix_ms":..., "region":..., "offset":..., "instance":..., "stamp":...}]}
// (region, offset and instance only when the ref has a location; stamp only with them)
nlohmann::json ec_transfer_params_to_json(std::span<const EcTensorRef> items);
// Strict: every field above must be present with the right type and range (bootstrap_addr may
// be empty; region, offset and instance are all present or all absent, and then region is a
// non-negative integer, offset + num_bytes does not overflow, instance is 1..kMaxEcInstance,
// and the ref is not a disk connector's; unknown keys are ignored; worker_addr is "tcp://HOST:PORT"
// or, for the disk connector, "file://" + an absolute directory, and then mm_hash must be a safe
// file name: letters, digits, '-' and '_' only). InvalidArgument naming the bad field, e.g.
// "ec_transfer_params.items[1].shape: must be [num_tokens, hidden_size] of positive integers".
Result<std::vector<EcTensorRef>> parse_ec_transfer_params(const nlohmann::json& j);
// The checks of one item (what parse applies), for refs built in code. `where` prefixes the
// message ("ec_transfer_params.items[0]").
Status validate_ec_tensor_ref(const EcTensorRef& ref, std::string_view where);

inline constexpr std::string_view kEcDiskScheme = "file://";
// The ref names a file of the disk connector (worker_addr "file://DIR"), not a pool.
bool is_disk_ref(const EcTensorRef& ref);

// What an encoder and a prefill worker must agree on before embeddings move between them.
// hidden_size 0 and empty strings are values like any other (both sides must match).
struct EcCompat {
  std::string vision_model;
  std::string dtype = "float32";
  int64_t hidden_size = 0;
  std::string preprocess_hash;
  friend bool operator==(const EcCompat&, const EcCompat&) = default;
};

// The first field that differs, naming both sides: "hidden_size: 1024 at the prefill worker,
// 2048 at the encoder". Empty when equal.
std::string describe_ec_compat_difference(const EcCompat& here, std::string_view here_name,
                                          const EcCompat& peer, std::string_view peer_name);

namespace ec_protocol {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kMaxIdBytes = 256;  // engine ids, mm_hash, consumer names
inline constexpr uint32_t kMaxTextBytes = 4096;
inline constexpr uint32_t kMaxDescriptorBytes = 64 << 10;

enum class MessageType : uint16_t {
  kHello = 101,
  kHelloOk = 102,
  kRefused = 103,
  kAcquire = 104,
  kAcquired = 105,
  kAcquireFailed = 106,
  kRelease = 107,
  kReleased = 108,
  kHeartbeat = 9,      // = protocol::MessageType::kHeartbeat (ControlChannel sends it)
  kHeartbeatAck = 10,  // = protocol::MessageType::kHeartbeatAck
};
std::string message_type_name(uint16_t type);

struct Hello {
  uint32_t protocol_version = kProtocolVersion;
  EcCompat compat;
  std::string consumer_name;           // for the producer's logs
  uint32_t heartbeat_interval_ms = 0;  // the consumer's; 10..600000
};

struct HelloOk {
  uint32_t protocol_version = kProtocolVersion;
  std::string engine_id;
  std::string segment_descriptor;  // transfer::SegmentDescriptor::serialize()
};

// EC_REFUSED carries the KV protocol's REFUSED payload.
using protocol::RefusalKind;
using protocol::Refused;

struct Acquire {
  uint64_t reservation_id = 0;
  std::string mm_hash;
  uint64_t num_bytes = 0;
};

struct Acquired {
  uint64_t reservation_id = 0;
  int64_t region_id = 0;
  uint64_t offset = 0;
  uint64_t num_bytes = 0;
};

enum class AcquireFailure : uint32_t {
  kNotFound = 1,  // unknown reservation (never made here, or released)
  kExpired = 2,   // the reservation expired before the consumer came
  kMismatch = 3,  // mm_hash or num_bytes differ from the reservation's
  kBusy = 4,      // another connection is pulling it
};
struct AcquireFailed {
  uint64_t reservation_id = 0;
  AcquireFailure reason = AcquireFailure::kNotFound;
  std::string message;
};

struct Release {
  uint64_t reservation_id = 0;
  std::string mm_hash;
  // The consumer READ the ref's location without EC_ACQUIRE: the producer answers was_held
  // only if the reservation is this instance's and lies there. Encoded only when set.
  bool has_location = false;
  uint64_t instance = 0;
  int64_t region_id = 0;
  uint64_t offset = 0;
};

struct Released {
  uint64_t reservation_id = 0;
  // true: the reservation was live (and, for a located release, at that location of this
  // instance) and this release ended it; false: it had already ended (expired, released) or
  // never was.
  bool was_held = false;
};

std::string encode(const Hello& m);
std::string encode(const HelloOk& m);
inline std::string encode(const Refused& m) {
  return protocol::encode(m);
}
std::string encode(const Acquire& m);
std::string encode(const Acquired& m);
std::string encode(const AcquireFailed& m);
std::string encode(const Release& m);
std::string encode(const Released& m);

// Each returns DataLoss (truncated, bytes left over) or InvalidArgument / FailedPrecondition
// (a field out of its bounds, another protocol version) naming the message and field.
Result<Hello> decode_hello(std::string_view payload);
Result<HelloOk> decode_hello_ok(std::string_view payload);
inline Result<Refused> decode_refused(std::string_view payload) {
  return protocol::decode_refused(payload, "EC_REFUSED");
}
Result<Acquire> decode_acquire(std::string_view payload);
Result<Acquired> decode_acquired(std::string_view payload);
Result<AcquireFailed> decode_acquire_failed(std::string_view payload);
Result<Release> decode_release(std::string_view payload);
Result<Released> decode_released(std::string_view payload);

}  // namespace ec_protocol
}  // namespace crescent::disagg
