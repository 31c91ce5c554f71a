#include "disagg/kv_transfer_connector.h"

#include <condition_variable>
#include <cstdio>
#include <thread>

#include "core/logging.h"
#include "disagg/connector_context.h"
#include "disagg/decode_side.h"
#include "disagg/event_queue.h"
#include "disagg/prefill_side.h"
#include "disagg/protocol.h"
#include "disagg/work_queue.h"

namespace crescent::disagg {

std::string seconds_text(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

namespace {

Status validate(const DisaggOptions& o) {
  RETURN_IF_ERROR(protocol::validate_id(o.engine_id, "engine_id"));
  const KvMemory& m = o.memory;
  if (m.base == nullptr || m.block_bytes == 0 || m.num_blocks <= 0)
    return invalid_argument("KV memory: base, block_bytes and num_blocks must be set");
  if (m.num_bytes / m.block_bytes < static_cast<uint64_t>(m.num_blocks)) {
    return invalid_argument("KV memory: " + std::to_string(m.num_blocks) + " blocks of " +
                            std::to_string(m.block_bytes) + " bytes do not fit in " +
                            std::to_string(m.num_bytes) + " bytes");
  }
  const KvCompatInfo& c = o.compat;
  if (c.block_size <= 0 || c.num_layers <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0)
    return invalid_argument("compat: block_size, num_layers, num_kv_heads, head_dim must be > 0");
  if (c.model.size() > protocol::kMaxTextBytes || c.dtype.size() > protocol::kMaxTextBytes ||
      c.layout.size() > protocol::kMaxTextBytes) {
    return invalid_argument("compat: model, dtype and layout must be shorter than " +
                            std::to_string(protocol::kMaxTextBytes) + " bytes");
  }
  if (o.transfer_timeout.count() <= 0)
    return invalid_argument("transfer_timeout must be positive");
  if (o.heartbeat_interval.count() < 10 || o.heartbeat_interval.count() > 600'000)
    return invalid_argument("heartbeat_interval must be 10 ms .. 600 s");
  if (o.cancel_grace.count() <= 0)
    return invalid_argument("cancel_grace must be positive");
  if (o.num_worker_threads < 1 || o.num_worker_threads > 256)
    return invalid_argument("num_worker_threads must be 1..256");
  return Status::ok();
}

}  // namespace

class KvTransferConnector::Impl {
 public:
  explicit Impl(DisaggOptions options)
      : options_(std::move(options)),
        metrics_(options_.metrics ? options_.metrics : std::make_shared<TransferMetrics>()) {}
  ~Impl() { shutdown(); }

  Status start() {
    RETURN_IF_ERROR(validate(options_));
    transfer::EngineOptions eo;
    eo.transport = options_.transport;
    eo.name = options_.engine_id;
    eo.listen_host = options_.listen_host;
    eo.token = options_.auth_token;
    ASSIGN_OR_RETURN(transfer_, transfer::TransferEngine::create(eo));
    ASSIGN_OR_RETURN(region_,
                     transfer_->register_region(options_.memory.base, options_.memory.num_bytes));
    work_ = std::make_unique<WorkQueue>(options_.num_worker_threads);
    ctx_.options = &options_;
    ctx_.transfer = transfer_.get();
    ctx_.region = region_;
    ctx_.metrics = metrics_.get();
    ctx_.events = &events_;
    ctx_.work = work_.get();
    prefill_ = std::make_unique<PrefillSide>(&ctx_);
    decode_ = std::make_unique<DecodeSide>(&ctx_);
    if (options_.accept_asks)
      RETURN_IF_ERROR(prefill_->start_listening());
    housekeeper_ = std::thread([this] { housekeeping_loop(); });
    return Status::ok();
  }

  void shutdown() {
    std::lock_guard<std::mutex> shutdown_lock(shutdown_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (is_shut_down_)
        return;
      is_shut_down_ = true;
      cv_.notify_all();
    }
    if (housekeeper_.joinable())
      housekeeper_.join();
    if (prefill_ != nullptr) {
      // Writes stop before any decode peer sees our EOF; then our own fetches' peers let go.
      prefill_->close_connections();
      decode_->close_connections();
      work_->stop();
      prefill_->release_all();
      decode_->fail_all();
    }
    if (transfer_ != nullptr && region_.is_valid()) {
      Status s = transfer_->unregister_region(region_, Deadline::after_ms(5000));
      if (!s.is_ok()) {
        CRESCENT_LOG(kWarn) << "kv connector: unregistering the KV memory: " << s.to_string();
      }
    }
    transfer_.reset();
  }

  bool is_shut_down() const {
    std::lock_guard<std::mutex> lock(mu_);
    return is_shut_down_;
  }

  void housekeeping_loop() {
    // Deadlines are checked at this granularity; tests use timeouts of ~1 s.
    const auto tick = std::min<std::chrono::milliseconds>(
        std::chrono::milliseconds(20), options_.cancel_grace / 4 + std::chrono::milliseconds(1));
    std::unique_lock<std::mutex> lock(mu_);
    while (!is_shut_down_) {
      cv_.wait_for(lock, tick, [&] { return is_shut_down_; });
      if (is_shut_down_)
        break;
      lock.unlock();
      prefill_->tick();
      decode_->tick();
      lock.lock();
    }
  }

  DisaggOptions options_;
  std::unique_ptr<transfer::TransferEngine> transfer_;
  transfer::RegionId region_;
  std::shared_ptr<TransferMetrics> metrics_;
  EventQueue events_;
  std::unique_ptr<WorkQueue> work_;
  ConnectorContext ctx_;
  std::unique_ptr<PrefillSide> prefill_;
  std::unique_ptr<DecodeSide> decode_;
  std::thread housekeeper_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool is_shut_down_ = false;  // GUARDED_BY(mu_)
  std::mutex shutdown_mu_;
};

Result<std::unique_ptr<KvTransferConnector>> KvTransferConnector::create(DisaggOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status s = impl->start();
  if (!s.is_ok())
    return s.with_context("KV connector");
  return std::unique_ptr<KvTransferConnector>(new KvTransferConnector(std::move(impl)));
}

KvTransferConnector::KvTransferConnector(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvTransferConnector::~KvTransferConnector() {
  shutdown();
}

void KvTransferConnector::start_remote_prefill(const std::string& request_id,
                                               const engine::KvTransferParams& params,
                                               std::span<const int32_t> prompt_token_ids,
                                               std::span<const int32_t> block_ids,
                                               int num_local_tokens) {
  impl_->decode_->start(request_id, params, prompt_token_ids, block_ids, num_local_tokens);
}

bool KvTransferConnector::hold_for_remote_decode(const std::string& request_id,
                                                 const engine::KvTransferParams& params,
                                                 std::span<const int32_t> prompt_token_ids,
                                                 std::span<const int32_t> block_ids) {
  return impl_->prefill_->hold(request_id, params, prompt_token_ids, block_ids);
}

void KvTransferConnector::cancel(const std::string& request_id) {
  if (!impl_->decode_->cancel(request_id))
    (void)impl_->prefill_->cancel(request_id);
}

void KvTransferConnector::release_unpulled(const engine::KvTransferParams& params) {
  impl_->decode_->release_unpulled(params);
}

void KvTransferConnector::fail_remote_decode(const std::string& request_id,
                                             const engine::KvTransferParams& params,
                                             const Status& why) {
  (void)request_id;
  impl_->prefill_->fail(params.transfer_id, why);
}

std::vector<engine::KvConnectorEvent> KvTransferConnector::take_events() {
  return impl_->events_.take();
}

int KvTransferConnector::num_pending() const {
  return impl_->decode_->num_pending() + impl_->prefill_->num_pending();
}

void KvTransferConnector::set_wakeup(std::function<void()> fn) {
  impl_->events_.set_wakeup(std::move(fn));
}

std::string KvTransferConnector::worker_addr() const {
  return impl_->prefill_->worker_addr();
}

KvTransferMetricsSnapshot KvTransferConnector::metrics() const {
  return impl_->metrics_->snapshot();
}

void KvTransferConnector::render_metrics(std::string* out) const {
  impl_->metrics_->render(out);
}

void KvTransferConnector::shutdown() {
  impl_->shutdown();
}

}  // namespace crescent::disagg
