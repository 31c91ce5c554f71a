#pragma once
// The disk EC connector (EPD, DESIGN.md §2b; `--ec-connector disk --ec-path DIR`): the seed's
// comparison baseline for the transfer connector (ec_producer.h / ec_consumer.h). The encoder
// writes each image's embeddings to a directory that its prefill workers also see, and a
// prefill worker reads them from there; no connection between them.
//
// Files: DIR/<mm_hash>.safetensors holds one F32 tensor "embeddings" [num_tokens, hidden_size]
// and metadata {"format": "crescent-ec/1", "mm_hash", "engine_id", "vision_model", "dtype",
// "hidden_size", "preprocess_hash"}. A file is written as DIR/.<mm_hash>.<pid>.<n>.tmp and
// renamed into place, so a reader sees a whole file or none; a rewrite replaces it atomically,
// and a reader that opened the old one keeps reading it (the mapping holds the inode).
// ec_transfer_params items are the transfer connector's (ec_protocol.h) with worker_addr
// "file://DIR"; mm_hash must then be a safe file name (letters, digits, '-', '_').
//
// Reservations (EcDiskProducer): a small ledger in the encoder process, of the files it wrote
// in this run. publish() reserves the file for one consumer until now + reservation_timeout;
// a reserved (or being written) file is never deleted. The consumer cannot tell the encoder
// that it has read the file (there is no connection), so expiry is the only end of a
// reservation besides the encoder's own release() (the request failed before answering).
// The directory's bytes are bounded by max_bytes (--ec-pool-size): to make room a publish
// deletes the least recently published files that no reservation holds; when that is not
// enough it is ResourceExhausted at once, or after waiting up to full_pool_wait for expiries.
// Files that were in DIR before the producer started are not in its ledger: it neither counts,
// serves nor deletes them (a file of the same name is overwritten). Give each encoder its own
// directory: two producers sharing one would each evict files the other reserved.
//
// EcDiskConsumer reads <its own dir>/<mm_hash>.safetensors (the item's directory only names
// the encoder's view of it in errors: a shared directory may be mounted elsewhere), checks the
// metadata against its compat, the tensor's dtype and shape against the item, and copies it
// out. release() deletes nothing: files are a cache, and the reservation expires on its own.
//
// Thread-safety: every method of both classes may be called from any thread, concurrently.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "disagg/ec_protocol.h"

namespace crescent::disagg {

inline constexpr std::string_view kEcDiskFormat = "crescent-ec/1";
inline constexpr std::string_view kEcDiskTensorName = "embeddings";

// DIR/<mm_hash>.safetensors
std::string ec_disk_file_path(const std::string& dir, const std::string& mm_hash);

struct EcDiskProducerOptions {
  std::string engine_id;              // required; printable ASCII, no spaces
  std::string dir;                    // --ec-path: created when absent; made absolute
  uint64_t max_bytes = 256ull << 20;  // --ec-pool-size
  std::chrono::milliseconds reservation_timeout{30'000};  // the only end of a consumer's hold
  // 0: a full directory is ResourceExhausted at once; > 0: wait up to this for expiries.
  std::chrono::milliseconds full_pool_wait{0};
  EcCompat compat;
  std::string bootstrap_addr;  // copied into refs
};

struct EcDiskProducerMetrics {
  uint64_t max_bytes = 0;
  uint64_t bytes_used = 0;      // files in the ledger (whole files, header included)
  uint64_t bytes_reserved = 0;  // files with a reservation
  int num_files = 0;
  int num_reservations = 0;
  uint64_t num_publishes = 0;
  uint64_t num_cache_hits = 0;  // publishes that found the file already written
  uint64_t num_evictions = 0;   // files deleted to make room
  uint64_t num_expired_reservations = 0;
  uint64_t num_releases = 0;  // reservations ended by release()
  uint64_t num_refusals = 0;  // publishes refused for space
  uint64_t num_write_failures = 0;
};

class EcDiskProducer {
 public:
  // Creates dir; starts the expiry thread. InvalidArgument names the bad option; an unusable
  // directory is the file system's error naming it.
  static Result<std::unique_ptr<EcDiskProducer>> create(EcDiskProducerOptions options);
  ~EcDiskProducer();
  EcDiskProducer(const EcDiskProducer&) = delete;
  EcDiskProducer& operator=(const EcDiskProducer&) = delete;

  const std::string& worker_addr() const;  // "file://DIR" (absolute)
  const std::string& engine_id() const;
  const std::string& dir() const;

  // As EcProducer::publish: finds mm_hash's file in the ledger or writes it (write(dst) fills
  // num_tokens * hidden_size floats, then the file is written and renamed into place), once
  // per mm_hash under concurrency, then reserves it for one consumer. InvalidArgument: bad
  // sizes or mm_hash, hidden_size differs from compat.hidden_size (when set), or the file
  // alone exceeds max_bytes. ResourceExhausted: no room without deleting a reserved file.
  // DeadlineExceeded: waiting for another writer or for room ran past deadline.
  Result<EcTensorRef> publish(const std::string& mm_hash, int64_t num_tokens, int64_t hidden_size,
                              const std::function<Status(float* dst)>& write, Deadline deadline,
                              bool* was_cached = nullptr);
  bool holds(const std::string& mm_hash) const;
  // Ends a reservation. NotFound for an unknown, released or expired id.
  Status release(uint64_t reservation_id);
  void expire_now();

  EcDiskProducerMetrics metrics() const;
  // crescent_ec_producer_* families (as the transfer producer's, connector="disk").
  std::string render_metrics(const std::string& model_name) const;

  class Impl;

 private:
  explicit EcDiskProducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct EcDiskConsumerOptions {
  std::string dir;  // --ec-path: where this worker sees the encoders' files
  EcCompat compat;
};

struct EcDiskConsumerMetrics {
  uint64_t num_fetches = 0;
  uint64_t num_failures = 0;
  uint64_t num_tensors = 0;
  uint64_t num_bytes = 0;
  double fetch_seconds_total = 0;
};

class EcDiskConsumer {
 public:
  // InvalidArgument when dir is empty. The directory need not exist yet.
  static Result<std::unique_ptr<EcDiskConsumer>> create(EcDiskConsumerOptions options);

  // Reads refs[i]'s file into dsts[i] (dsts[i].size() * 4 == refs[i].num_bytes). Every error
  // names the file: NotFound (absent: evicted after its reservation expired, or another
  // directory), DataLoss (not a whole safetensors file), FailedPrecondition (compat or
  // mm_hash differs, naming both sides), InvalidArgument (shape/dtype differ from the item,
  // a transfer connector's item, bad arguments); DeadlineExceeded past the deadline.
  Status fetch(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
               Deadline deadline);
  // Nothing to do: the files stay as a cache, reservations expire in the encoder.
  void release(std::span<const EcTensorRef> refs);

  EcDiskConsumerMetrics metrics() const;
  // crescent_ec_consumer_* families (as the transfer consumer's, connector="disk").
  std::string render_metrics(const std::string& model_name) const;

  class Impl;
  ~EcDiskConsumer();

 private:
  explicit EcDiskConsumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::disagg
