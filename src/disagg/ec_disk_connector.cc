// The ledger is one map of files and one of reservations under one mutex; file writes and
// reads happen outside it. A file is unlinked only under the mutex, so an eviction cannot
// delete a file that a concurrent publish of the same mm_hash has just renamed into place.

#include "disagg/ec_disk_connector.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/errno_text.h"
#include "core/logging.h"
#include "core/prometheus.h"
#include "disagg/protocol.h"
#include "model/safetensors.h"

namespace crescent::disagg {
namespace {

namespace fs = std::filesystem;

// Header bytes a file may take beyond its data (the JSON header's padding and fields): what
// the bound reserves before the file exists; the real size replaces it once written.
uint64_t header_allowance(const EcCompat& compat, const std::string& engine_id) {
  return 512 + compat.vision_model.size() + compat.preprocess_hash.size() + compat.dtype.size() +
         engine_id.size() + ec_protocol::kMaxIdBytes;
}

int64_t unix_ms_after(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             (std::chrono::system_clock::now() + d).time_since_epoch())
      .count();
}

Status check_mm_hash(const std::string& mm_hash) {
  EcTensorRef probe;
  probe.mm_hash = mm_hash;
  probe.engine_id = "x";
  probe.worker_addr = "file:///";
  probe.reservation_id = 1;
  probe.shape = {1, 1};
  probe.num_bytes = 4;
  return validate_ec_tensor_ref(probe, "EC disk publish");
}

}  // namespace

std::string ec_disk_file_path(const std::string& dir, const std::string& mm_hash) {
  std::string path = dir;
  if (path.empty() || path.back() != '/') {
    path += '/';
  }
  return path + mm_hash + ".safetensors";
}

// ---------------------------------------------------------------------------------------------
// Producer

class EcDiskProducer::Impl {
 public:
  explicit Impl(EcDiskProducerOptions options) : options_(std::move(options)) {}
  ~Impl() { stop(); }

  Status start();
  void stop();

  Result<EcTensorRef> publish(const std::string& mm_hash, int64_t num_tokens, int64_t hidden_size,
                              const std::function<Status(float* dst)>& write, Deadline deadline,
                              bool* was_cached);
  bool holds(const std::string& mm_hash) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(mm_hash);
    return it != files_.end() && !it->second.is_writing;
  }
  Status release(uint64_t reservation_id);
  void expire_now() {
    std::lock_guard<std::mutex> lock(mu_);
    expire_locked();
  }
  EcDiskProducerMetrics metrics() const;
  std::string render_metrics(const std::string& model_name) const;

  EcDiskProducerOptions options_;
  std::string worker_addr_;

 private:
  struct File {
    uint64_t num_bytes = 0;  // on disk (an estimate while being written)
    uint64_t last_use = 0;   // LRU tick
    int num_reservations = 0;
    bool is_writing = false;
  };
  struct Reservation {
    std::string mm_hash;
    TimePoint expires_at;
  };

  void expire_locked();  // REQUIRES(mu_)
  // Deletes unreserved files, least recently used first, until num_bytes more fit. False when
  // they cannot (what is left is reserved or being written). REQUIRES(mu_)
  bool make_room_locked(uint64_t num_bytes);
  uint64_t reserve_locked(const std::string& mm_hash);  // REQUIRES(mu_); the new id
  Status write_file(const std::string& mm_hash, const std::vector<float>& data, int64_t num_tokens,
                    int64_t hidden_size, uint64_t* file_bytes);
  void expiry_loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;                    // a write finished, a reservation ended
  std::map<std::string, File> files_;             // GUARDED_BY(mu_)
  std::map<uint64_t, Reservation> reservations_;  // GUARDED_BY(mu_)
  uint64_t bytes_used_ = 0;                       // GUARDED_BY(mu_)
  uint64_t next_tick_ = 1;                        // GUARDED_BY(mu_)
  uint64_t next_reservation_id_ = 1;              // GUARDED_BY(mu_)
  EcDiskProducerMetrics counters_;                // GUARDED_BY(mu_) (the counters only)
  bool is_stopping_ = false;                      // GUARDED_BY(mu_)
  std::atomic<uint64_t> next_temp_{0};
  std::thread expiry_thread_;
};

Status EcDiskProducer::Impl::start() {
  if (Status s = protocol::validate_id(options_.engine_id, "engine_id"); !s.is_ok())
    return invalid_argument("EC disk producer: " + s.message());
  if (options_.dir.empty())
    return invalid_argument("EC disk producer: --ec-path (the directory) is required");
  if (options_.max_bytes < 4096)
    return invalid_argument("EC disk producer: max_bytes must be at least 4096");
  if (options_.reservation_timeout.count() <= 0)
    return invalid_argument("EC disk producer: reservation_timeout must be positive");
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec)
    return unavailable("EC disk producer: cannot create " + options_.dir + ": " + ec.message());
  fs::path abs = fs::absolute(options_.dir, ec);
  if (ec)
    return unavailable("EC disk producer: " + options_.dir + ": " + ec.message());
  options_.dir = abs.lexically_normal().string();
  while (options_.dir.size() > 1 && options_.dir.back() == '/') {
    options_.dir.pop_back();
  }
  if (::access(options_.dir.c_str(), W_OK) != 0) {
    return unavailable("EC disk producer: cannot write to " + options_.dir + ": " +
                       errno_text(errno));
  }
  worker_addr_ = std::string(kEcDiskScheme) + options_.dir;
  expiry_thread_ = std::thread([this] { expiry_loop(); });
  return Status::ok();
}

void EcDiskProducer::Impl::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
  }
  cv_.notify_all();
  if (expiry_thread_.joinable())
    expiry_thread_.join();
}

void EcDiskProducer::Impl::expiry_loop() {
  const auto period = std::clamp<std::chrono::milliseconds>(options_.reservation_timeout / 10,
                                                            std::chrono::milliseconds(10),
                                                            std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!is_stopping_) {
    cv_.wait_for(lock, period, [&] { return is_stopping_; });
    if (!is_stopping_)
      expire_locked();
  }
}

void EcDiskProducer::Impl::expire_locked() {
  const TimePoint now = Clock::now();
  bool ended = false;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    if (it->second.expires_at > now) {
      ++it;
      continue;
    }
    auto f = files_.find(it->second.mm_hash);
    if (f != files_.end())
      --f->second.num_reservations;
    ++counters_.num_expired_reservations;
    it = reservations_.erase(it);
    ended = true;
  }
  if (ended)
    cv_.notify_all();
}

bool EcDiskProducer::Impl::make_room_locked(uint64_t num_bytes) {
  while (bytes_used_ + num_bytes > options_.max_bytes) {
    auto victim = files_.end();
    for (auto it = files_.begin(); it != files_.end(); ++it) {
      const File& f = it->second;
      if (f.is_writing || f.num_reservations > 0)
        continue;
      if (victim == files_.end() || f.last_use < victim->second.last_use)
        victim = it;
    }
    if (victim == files_.end())
      return false;
    const std::string path = ec_disk_file_path(options_.dir, victim->first);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      // Still counted as gone: the ledger bounds what this producer keeps, and a file it cannot
      // delete is no longer served from the ledger.
      CRESCENT_LOG(kWarn) << "EC disk producer: cannot delete " << path << ": "
                          << errno_text(errno);
    }
    bytes_used_ -= victim->second.num_bytes;
    files_.erase(victim);
    ++counters_.num_evictions;
  }
  return true;
}

uint64_t EcDiskProducer::Impl::reserve_locked(const std::string& mm_hash) {
  File& f = files_.at(mm_hash);
  f.last_use = next_tick_++;
  ++f.num_reservations;
  const uint64_t id = next_reservation_id_++;
  reservations_[id] = Reservation{mm_hash, Clock::now() + options_.reservation_timeout};
  ++counters_.num_publishes;
  return id;
}

Status EcDiskProducer::Impl::write_file(const std::string& mm_hash, const std::vector<float>& data,
                                        int64_t num_tokens, int64_t hidden_size,
                                        uint64_t* file_bytes) {
  const std::string final_path = ec_disk_file_path(options_.dir, mm_hash);
  const std::string temp_path = options_.dir + "/." + mm_hash + "." + std::to_string(::getpid()) +
                                "." + std::to_string(next_temp_.fetch_add(1)) + ".tmp";
  auto fail = [&](const Status& s) {
    ::unlink(temp_path.c_str());
    return s.with_context("EC disk producer: writing " + final_path);
  };
  model::SafetensorsWriter writer(temp_path);
  writer.set_metadata("format", std::string(kEcDiskFormat));
  writer.set_metadata("mm_hash", mm_hash);
  writer.set_metadata("engine_id", options_.engine_id);
  writer.set_metadata("vision_model", options_.compat.vision_model);
  writer.set_metadata("dtype", options_.compat.dtype);
  writer.set_metadata("hidden_size", std::to_string(options_.compat.hidden_size));
  writer.set_metadata("preprocess_hash", options_.compat.preprocess_hash);
  Status s =
      writer.add_tensor(std::string(kEcDiskTensorName), DType::kF32, {num_tokens, hidden_size});
  if (s.is_ok())
    s = writer.write_header();
  if (s.is_ok())
    s = writer.write_data(data.data(), static_cast<int64_t>(data.size() * sizeof(float)));
  if (s.is_ok())
    s = writer.finish();
  if (!s.is_ok())
    return fail(s);
  std::error_code ec;
  const uintmax_t size = fs::file_size(temp_path, ec);
  if (ec)
    return fail(data_loss(temp_path + ": " + ec.message()));
  // rename() replaces the final name atomically: readers see the old file or the new one.
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0)
    return fail(unavailable("rename from " + temp_path + ": " + errno_text(errno)));
  *file_bytes = size;
  return Status::ok();
}

Result<EcTensorRef> EcDiskProducer::Impl::publish(const std::string& mm_hash, int64_t num_tokens,
                                                  int64_t hidden_size,
                                                  const std::function<Status(float* dst)>& write,
                                                  Deadline deadline, bool* was_cached) {
  RETURN_IF_ERROR(check_mm_hash(mm_hash));
  if (num_tokens <= 0 || hidden_size <= 0 || num_tokens > kMaxEcTokensPerImage ||
      hidden_size > kMaxEcHiddenSize) {
    return invalid_argument("EC disk publish " + mm_hash + ": bad shape [" +
                            std::to_string(num_tokens) + ", " + std::to_string(hidden_size) + "]");
  }
  if (options_.compat.hidden_size != 0 && hidden_size != options_.compat.hidden_size) {
    return invalid_argument("EC disk publish " + mm_hash + ": hidden_size " +
                            std::to_string(hidden_size) + ", the encoder's is " +
                            std::to_string(options_.compat.hidden_size));
  }
  const uint64_t data_bytes = static_cast<uint64_t>(num_tokens * hidden_size) * sizeof(float);
  const uint64_t estimate = data_bytes + header_allowance(options_.compat, options_.engine_id);
  if (estimate > options_.max_bytes) {
    return invalid_argument("EC disk publish " + mm_hash + ": a file of about " +
                            std::to_string(estimate) + " bytes does not fit in --ec-pool-size " +
                            std::to_string(options_.max_bytes));
  }
  auto fill = [&](uint64_t id) {
    EcTensorRef ref;
    ref.mm_hash = mm_hash;
    ref.engine_id = options_.engine_id;
    ref.worker_addr = worker_addr_;
    ref.bootstrap_addr = options_.bootstrap_addr;
    ref.reservation_id = id;
    ref.shape = {num_tokens, hidden_size};
    ref.dtype = "float32";
    ref.num_bytes = data_bytes;
    ref.expires_at_unix_ms = unix_ms_after(options_.reservation_timeout);
    return ref;
  };
  const Deadline room_deadline = options_.full_pool_wait.count() > 0
                                     ? Deadline::after(std::min<std::chrono::nanoseconds>(
                                           options_.full_pool_wait, deadline.remaining()))
                                     : Deadline::after(std::chrono::nanoseconds(0));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    expire_locked();
    auto it = files_.find(mm_hash);
    if (it != files_.end() && it->second.is_writing) {
      // Another publish is writing it: wait for that one.
      if (!cv_.wait_until(lock, deadline.when(), [&] {
            auto f = files_.find(mm_hash);
            return f == files_.end() || !f->second.is_writing;
          })) {
        return deadline_exceeded("EC disk publish " + mm_hash +
                                 ": another request writing the same image did not finish in "
                                 "time");
      }
      continue;
    }
    if (it != files_.end()) {
      if (::access(ec_disk_file_path(options_.dir, mm_hash).c_str(), R_OK) == 0) {
        const uint64_t id = reserve_locked(mm_hash);
        ++counters_.num_cache_hits;
        if (was_cached != nullptr)
          *was_cached = true;
        return fill(id);
      }
      // Deleted behind the ledger's back: written again into the same entry (its bytes and
      // reservations stay).
      CRESCENT_LOG(kWarn) << "EC disk producer: " << ec_disk_file_path(options_.dir, mm_hash)
                          << " vanished; writing it again";
      it->second.is_writing = true;
      break;
    }
    if (make_room_locked(estimate)) {
      File& entry = files_[mm_hash];
      entry.is_writing = true;
      entry.num_bytes = estimate;
      entry.last_use = next_tick_++;
      bytes_used_ += estimate;
      break;
    }
    if (room_deadline.is_expired()) {
      ++counters_.num_refusals;
      uint64_t reserved = 0;
      for (const auto& [h, f] : files_) {
        if (f.num_reservations > 0 || f.is_writing)
          reserved += f.num_bytes;
      }
      return resource_exhausted(
          "the EC directory " + options_.dir + " is full: --ec-pool-size " +
          std::to_string(options_.max_bytes) + " bytes, " + std::to_string(reserved) +
          " reserved or being written, the image needs about " + std::to_string(estimate));
    }
    // Expiries (the only way reserved files free up) run every few ms on their own thread.
    cv_.wait_until(lock,
                   std::min(room_deadline.when(), Clock::now() + std::chrono::milliseconds(20)));
  }
  lock.unlock();

  std::vector<float> data(static_cast<size_t>(num_tokens * hidden_size));
  Status s = write(data.data());
  if (!s.is_ok())
    s = s.with_context("EC disk publish " + mm_hash);
  uint64_t file_bytes = 0;
  if (s.is_ok())
    s = write_file(mm_hash, data, num_tokens, hidden_size, &file_bytes);

  lock.lock();
  File& f = files_.at(mm_hash);
  f.is_writing = false;
  cv_.notify_all();
  if (!s.is_ok()) {
    ++counters_.num_write_failures;
    if (f.num_reservations == 0) {
      bytes_used_ -= f.num_bytes;
      files_.erase(mm_hash);
    }
    return s;
  }
  bytes_used_ = bytes_used_ - f.num_bytes + file_bytes;
  f.num_bytes = file_bytes;
  const uint64_t id = reserve_locked(mm_hash);
  if (was_cached != nullptr)
    *was_cached = false;
  return fill(id);
}

Status EcDiskProducer::Impl::release(uint64_t reservation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end()) {
    return not_found("EC disk producer: reservation " + std::to_string(reservation_id) +
                     " is not held (released, expired or never made)");
  }
  auto f = files_.find(it->second.mm_hash);
  if (f != files_.end())
    --f->second.num_reservations;
  reservations_.erase(it);
  ++counters_.num_releases;
  cv_.notify_all();
  return Status::ok();
}

EcDiskProducerMetrics EcDiskProducer::Impl::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EcDiskProducerMetrics m = counters_;
  m.max_bytes = options_.max_bytes;
  m.bytes_used = bytes_used_;
  m.num_files = static_cast<int>(files_.size());
  m.num_reservations = static_cast<int>(reservations_.size());
  for (const auto& [h, f] : files_) {
    if (f.num_reservations > 0)
      m.bytes_reserved += f.num_bytes;
  }
  return m;
}

std::string EcDiskProducer::Impl::render_metrics(const std::string& model_name) const {
  const EcDiskProducerMetrics m = metrics();
  const std::string label = "{model_name=\"" + model_name + "\",connector=\"disk\"}";
  const std::string p = "crescent_ec_producer_";
  std::string out;
  prometheus::SampleWriter w(&out, p, label);
  auto gauge = [&](const char* name, const char* help, double v) { w.gauge(name, help, v); };
  auto counter = [&](const char* name, const char* help, double v) { w.counter(name, help, v); };
  gauge("pool_bytes", "Bytes the encoder's EC directory may hold (--ec-pool-size).",
        static_cast<double>(m.max_bytes));
  gauge("pool_used_bytes", "Bytes of the files this encoder keeps in its EC directory.",
        static_cast<double>(m.bytes_used));
  gauge("pool_reserved_bytes", "Bytes of files with consumer reservations.",
        static_cast<double>(m.bytes_reserved));
  gauge("entries", "Files in the EC directory's ledger.", m.num_files);
  gauge("reservations", "Live reservations (they end by expiry).", m.num_reservations);
  counter("publishes_total", "Tensors published (each one reservation).",
          static_cast<double>(m.num_publishes));
  counter("cache_hits_total", "Publishes answered from an existing file without encoding.",
          static_cast<double>(m.num_cache_hits));
  counter("evictions_total", "Unreserved files deleted to make room.",
          static_cast<double>(m.num_evictions));
  counter("expired_reservations_total", "Reservations that expired.",
          static_cast<double>(m.num_expired_reservations));
  counter("releases_total", "Reservations released by the encoder (failed requests).",
          static_cast<double>(m.num_releases));
  counter("refusals_total", "Publishes refused because the directory was full of reserved files.",
          static_cast<double>(m.num_refusals));
  counter("write_failures_total", "Publishes whose encode or file write failed.",
          static_cast<double>(m.num_write_failures));
  return out;
}

EcDiskProducer::EcDiskProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EcDiskProducer::~EcDiskProducer() = default;

Result<std::unique_ptr<EcDiskProducer>> EcDiskProducer::create(EcDiskProducerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<EcDiskProducer>(new EcDiskProducer(std::move(impl)));
}

const std::string& EcDiskProducer::worker_addr() const {
  return impl_->worker_addr_;
}
const std::string& EcDiskProducer::engine_id() const {
  return impl_->options_.engine_id;
}
const std::string& EcDiskProducer::dir() const {
  return impl_->options_.dir;
}
Result<EcTensorRef> EcDiskProducer::publish(const std::string& mm_hash, int64_t num_tokens,
                                            int64_t hidden_size,
                                            const std::function<Status(float* dst)>& write,
                                            Deadline deadline, bool* was_cached) {
  return impl_->publish(mm_hash, num_tokens, hidden_size, write, deadline, was_cached);
}
bool EcDiskProducer::holds(const std::string& mm_hash) const {
  return impl_->holds(mm_hash);
}
Status EcDiskProducer::release(uint64_t reservation_id) {
  return impl_->release(reservation_id);
}
void EcDiskProducer::expire_now() {
  impl_->expire_now();
}
EcDiskProducerMetrics EcDiskProducer::metrics() const {
  return impl_->metrics();
}
std::string EcDiskProducer::render_metrics(const std::string& model_name) const {
  return impl_->render_metrics(model_name);
}

// ---------------------------------------------------------------------------------------------
// Consumer

class EcDiskConsumer::Impl {
 public:
  explicit Impl(EcDiskConsumerOptions options) : options_(std::move(options)) {}

  Status fetch(std::span<const EcTensorRef> refs, std::span<const std::span<float>> dsts,
               Deadline deadline);
  Status read_one(const EcTensorRef& ref, std::span<float> dst) const;
  EcDiskConsumerMetrics metrics() const {
    std::lock_guard<std::mutex> lock(mu_);
    return metrics_;
  }

  EcDiskConsumerOptions options_;

 private:
  mutable std::mutex mu_;
  EcDiskConsumerMetrics metrics_;  // GUARDED_BY(mu_)
};

Status EcDiskConsumer::Impl::read_one(const EcTensorRef& ref, std::span<float> dst) const {
  const std::string path = ec_disk_file_path(options_.dir, ref.mm_hash);
  auto file_or = model::SafetensorsFile::open(path);
  if (!file_or.is_ok()) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      return not_found("EC disk: " + path + " does not exist (the encoder " + ref.engine_id +
                       " wrote it to " + ref.worker_addr +
                       "; it was deleted after its reservation expired, or the two directories "
                       "differ)");
    }
    return file_or.status().with_context("EC disk: " + path);
  }
  const model::SafetensorsFile& file = **file_or;
  const auto& meta = file.metadata();
  auto field = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (field("format") != kEcDiskFormat) {
    return data_loss("EC disk: " + path + " is not an EC embeddings file (metadata format \"" +
                     field("format") + "\", expected \"" + std::string(kEcDiskFormat) + "\")");
  }
  if (field("mm_hash") != ref.mm_hash) {
    return failed_precondition("EC disk: " + path + " holds mm_hash " + field("mm_hash") +
                               ", not " + ref.mm_hash);
  }
  EcCompat in_file;
  in_file.vision_model = field("vision_model");
  in_file.dtype = field("dtype");
  in_file.preprocess_hash = field("preprocess_hash");
  const std::string hidden = field("hidden_size");
  auto [end, err] =
      std::from_chars(hidden.data(), hidden.data() + hidden.size(), in_file.hidden_size);
  if (err != std::errc() || end != hidden.data() + hidden.size()) {
    return data_loss("EC disk: " + path + ": metadata hidden_size \"" + hidden +
                     "\" is not a number");
  }
  if (std::string diff =
          describe_ec_compat_difference(options_.compat, "the prefill worker", in_file, path);
      !diff.empty()) {
    return failed_precondition("EC disk: compatibility mismatch: " + diff);
  }
  auto view = file.get(std::string(kEcDiskTensorName));
  if (!view.is_ok())
    return view.status().with_context("EC disk: " + path);
  if (view->dtype != DType::kF32) {
    return invalid_argument("EC disk: " + path + ": tensor \"embeddings\" is not F32");
  }
  if (view->shape != ref.shape) {
    return invalid_argument("EC disk: " + path + ": tensor \"embeddings\" has shape " +
                            model::shape_to_string(view->shape) + ", the item says " +
                            model::shape_to_string(ref.shape));
  }
  if (static_cast<uint64_t>(view->num_bytes) != ref.num_bytes ||
      dst.size() * sizeof(float) != ref.num_bytes) {
    return invalid_argument("EC disk: " + path + ": " + std::to_string(view->num_bytes) +
                            " bytes, the item says " + std::to_string(ref.num_bytes));
  }
  std::memcpy(dst.data(), view->data, ref.num_bytes);
  return Status::ok();
}

Status EcDiskConsumer::Impl::fetch(std::span<const EcTensorRef> refs,
                                   std::span<const std::span<float>> dsts, Deadline deadline) {
  const TimePoint start = Clock::now();
  Status s;
  if (refs.size() != dsts.size()) {
    s = invalid_argument("EC disk fetch: " + std::to_string(refs.size()) + " refs but " +
                         std::to_string(dsts.size()) + " destinations");
  }
  for (size_t i = 0; s.is_ok() && i < refs.size(); ++i) {
    const std::string where = "EC disk fetch: refs[" + std::to_string(i) + "]";
    if (Status v = validate_ec_tensor_ref(refs[i], where); !v.is_ok()) {
      s = v;
    } else if (!is_disk_ref(refs[i])) {
      s = invalid_argument(where + ": names the transfer connector's encoder at " +
                           refs[i].worker_addr +
                           ", and this prefill worker reads files (--ec-connector disk)");
    } else if (deadline.is_expired()) {
      s = deadline_exceeded("EC disk fetch: the deadline passed after " + std::to_string(i) +
                            " of " + std::to_string(refs.size()) + " files");
    } else {
      s = read_one(refs[i], dsts[i]);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++metrics_.num_fetches;
  metrics_.fetch_seconds_total += std::chrono::duration<double>(Clock::now() - start).count();
  if (s.is_ok()) {
    metrics_.num_tensors += refs.size();
    for (const EcTensorRef& r : refs) {
      metrics_.num_bytes += r.num_bytes;
    }
  } else {
    ++metrics_.num_failures;
  }
  return s;
}

EcDiskConsumer::EcDiskConsumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EcDiskConsumer::~EcDiskConsumer() = default;

Result<std::unique_ptr<EcDiskConsumer>> EcDiskConsumer::create(EcDiskConsumerOptions options) {
  if (options.dir.empty())
    return invalid_argument("EC disk consumer: --ec-path (the directory) is required");
  std::error_code ec;
  fs::path abs = fs::absolute(options.dir, ec);
  if (!ec)
    options.dir = abs.lexically_normal().string();
  return std::unique_ptr<EcDiskConsumer>(
      new EcDiskConsumer(std::make_unique<Impl>(std::move(options))));
}

Status EcDiskConsumer::fetch(std::span<const EcTensorRef> refs,
                             std::span<const std::span<float>> dsts, Deadline deadline) {
  return impl_->fetch(refs, dsts, deadline);
}
void EcDiskConsumer::release(std::span<const EcTensorRef> /*refs*/) {}
EcDiskConsumerMetrics EcDiskConsumer::metrics() const {
  return impl_->metrics();
}
std::string EcDiskConsumer::render_metrics(const std::string& model_name) const {
  const EcDiskConsumerMetrics m = metrics();
  const std::string label = "{model_name=\"" + model_name + "\",connector=\"disk\"}";
  const std::string p = "crescent_ec_consumer_";
  std::string out;
  prometheus::SampleWriter w(&out, p, label);
  auto counter = [&](const char* name, const char* help, double v) { w.counter(name, help, v); };
  counter("fetches_total", "EC fetch calls (each reads a request's image files).",
          static_cast<double>(m.num_fetches));
  counter("failures_total", "EC fetch calls that failed.", static_cast<double>(m.num_failures));
  counter("tensors_total", "Tensors read by successful fetches.",
          static_cast<double>(m.num_tensors));
  counter("bytes_total", "Bytes read by successful fetches.", static_cast<double>(m.num_bytes));
  counter("fetch_seconds_total", "Time spent in EC fetch calls, successful or not.",
          m.fetch_seconds_total);
  return out;
}

}  // namespace crescent::disagg
