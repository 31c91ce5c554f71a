#include "apps/serve_deployment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bootstrap/etcd_registry.h"
#include "core/ids.h"
#include "core/logging.h"
#include "core/prometheus.h"
#include "net/auth/auth_token.h"
#include "net/auth/handshake.h"

namespace crescent::apps {

void DisaggFlags::add_to(FlagParser& flags) {
  flags.add("role", &role,
            "both: prefill and decode in this process; prefill: compute prompts' KV and send it "
            "to decode engines (hosts the bootstrap server); decode: fetch KV from a prefill "
            "engine named by each request's kv_transfer_params, then decode (a VL model's "
            "vision tower is not loaded); encode: only a VL model's vision tower, answering "
            "chat requests with ec_transfer_params (EPD)");
  flags.add("kv-transport", &kv_transport,
            "how KV moves between engines: shm (same host, one copy), tcp (any host), ucx");
  flags.add("kv-transfer-timeout", &kv_transfer_timeout_s,
            "seconds any KV transfer state may last (a prefill holding blocks for a decode "
            "engine, a decode request waiting for its KV) before it fails and frees its blocks");
  flags.add("bootstrap-port", &bootstrap_port,
            "prefill: port of the bootstrap server that rank 0 hosts (0: any free port)");
  flags.add("bootstrap-addr", &bootstrap_addr,
            "prefill: register with this external bootstrap server (http://HOST:PORT, e.g. "
            "`crescent bootstrap`) instead of hosting one, or in etcd "
            "(etcd://HOST:2379[/PREFIX], default prefix /crescent; one prefix per prefill "
            "instance: keys under a lease, docs/bootstrap.md); encode: register the EC listener "
            "there (role encode) and name it in ec_transfer_params, so that prefill workers "
            "resolve this encoder through it");
  flags.add("data-parallel-size", &data_parallel_size,
            "engine ranks in this process, each with its own model copy, KV cache and engine "
            "id; requests pick one with the X-data-parallel-rank header");
  flags.add("bootstrap-lease-ttl", &bootstrap_lease_ttl_s,
            "prefill, encode: seconds each registration with the bootstrap server lives unless "
            "renewed (renewed every third of it), so that a crashed worker's entry lapses and "
            "a restarted one can take its place; the worker whose place was taken stops "
            "serving (/health 503). A hosted bootstrap grants at most this (0 < S <= 3600)");
  flags.add("auth-token-file", &auth_token_file,
            "file holding the deployment's shared secret (default: $CRESCENT_AUTH_TOKEN, else "
            "none). With it, the KV and EC control and transfer connections authenticate each "
            "other by challenge-response and registrations with the bootstrap server (hosted or "
            "--bootstrap-addr) are signed; peers without the same token are refused. The token "
            "never crosses the wire. Keep the file mode 600");
  flags.add("kv-listen-host", &kv_listen_host,
            "prefill: address the KV control listener binds to and registers (default: --host)");
}

Status DisaggFlags::validate() {
  if (role == "both") {
    parsed_role = ServeRole::kBoth;
  } else if (role == "prefill") {
    parsed_role = ServeRole::kPrefill;
  } else if (role == "decode") {
    parsed_role = ServeRole::kDecode;
  } else if (role == "encode") {
    parsed_role = ServeRole::kEncode;
  } else {
    return invalid_argument("--role must be both, prefill, decode or encode, got '" + role + "'");
  }
  auto transport = transfer::parse_transport(kv_transport);
  if (!transport.is_ok()) {
    return invalid_argument("--kv-transport: " + transport.status().message());
  }
  if (!transfer::is_transport_available(*transport)) {
    return invalid_argument("--kv-transport " + kv_transport + " is not available in this build");
  }
  parsed_transport = *transport;
  if (!(kv_transfer_timeout_s > 0) || kv_transfer_timeout_s > 24 * 3600) {
    return invalid_argument("--kv-transfer-timeout must be between 0 and 86400 seconds");
  }
  if (bootstrap_port < 0 || bootstrap_port > 65535) {
    return invalid_argument("--bootstrap-port must be 0..65535");
  }
  if (!(bootstrap_lease_ttl_s > 0) || bootstrap_lease_ttl_s > 3600) {
    return invalid_argument("--bootstrap-lease-ttl must be in (0, 3600] seconds");
  }
  ASSIGN_OR_RETURN(auth_token, net::auth::load_auth_token(auth_token_file));
  if (data_parallel_size < 1 || data_parallel_size > 64) {
    return invalid_argument("--data-parallel-size must be 1..64");
  }
  if (parsed_role == ServeRole::kEncode && data_parallel_size != 1) {
    return invalid_argument(
        "--role encode runs one vision tower: start more encoders instead of "
        "--data-parallel-size");
  }
  if (!bootstrap_addr.empty()) {
    if (Status s = bootstrap::check_bootstrap_url(bootstrap_addr); !s.is_ok()) {
      return invalid_argument("--bootstrap-addr: " + s.message());
    }
    while (!bootstrap_addr.empty() && bootstrap_addr.back() == '/') {
      bootstrap_addr.pop_back();
    }
  }
  return Status::ok();
}

namespace {

// What a peer engine must share with this one before KV moves between them.
disagg::KvCompatInfo compat_info(const engine::LoadedEngine& loaded) {
  const model::ModelConfig& c = loaded.model->config();
  const kernels::KvCacheLayout& layout = loaded.runner->kv_layout();
  disagg::KvCompatInfo info;
  info.model = c.architecture_name + " vocab=" + std::to_string(c.vocab_size) +
               " hidden=" + std::to_string(c.hidden_size);
  info.dtype = std::string(kernels::kv_dtype_name(layout.dtype));
  info.num_layers = layout.num_layers;
  info.num_kv_heads = layout.num_kv_heads;
  info.head_dim = layout.head_dim;
  info.block_size = layout.block_size;
  info.layout = "block:layer:kv:token:head:dim";
  char fingerprint[17];
  std::snprintf(fingerprint, sizeof(fingerprint), "%016llx",
                static_cast<unsigned long long>(loaded.model->weights_fingerprint()));
  info.weights = std::string(fingerprint) + " " + loaded.model->weight_format_name();
  return info;
}

}  // namespace

Result<std::unique_ptr<ServeDeployment>> ServeDeployment::start(const ModelFlags& model_flags,
                                                                const DisaggFlags& disagg,
                                                                const EcFlags& ec,
                                                                const std::string& host) {
  std::unique_ptr<ServeDeployment> d(new ServeDeployment());
  d->role_ = disagg.parsed_role;
  if (d->role_ == ServeRole::kEncode) {
    ThreadPool::set_default_threads(model_flags.num_threads());
    RETURN_IF_ERROR(d->start_encoder(model_flags, disagg, ec, host));
    return d;
  }
  if (d->role_ == ServeRole::kPrefill) {
    if (disagg.bootstrap_addr.empty()) {
      bootstrap::BootstrapServerOptions options;
      options.host = host;
      options.port = disagg.bootstrap_port;
      options.expected_dp_ranks = disagg.data_parallel_size;
      options.max_lease_ttl_s = disagg.bootstrap_lease_ttl_s;
      options.auth_token = disagg.auth_token;
      auto server = bootstrap::BootstrapServer::start(options);
      if (!server.is_ok()) {
        return Status(server.status().code(),
                      "cannot host the bootstrap server on " + host + ":" +
                          std::to_string(disagg.bootstrap_port) + ": " + server.status().message() +
                          " (pick another --bootstrap-port, or --bootstrap-addr to use a running "
                          "one)");
      }
      d->bootstrap_server_ = std::move(server).value();
      d->bootstrap_url_ = d->bootstrap_server_->url();
    } else {
      d->bootstrap_url_ = disagg.bootstrap_addr;
    }
  }
  if (d->role_ != ServeRole::kBoth) {
    d->resolver_ = std::make_shared<bootstrap::EngineResolver>();
    // One set of crescent_kv_transfer_* families for all ranks of this process.
    d->transfer_metrics_ = std::make_shared<disagg::TransferMetrics>();
  }
  // The ranks share the cores; each gets its own pool (a pool runs one loop at a time).
  int threads_per_rank = std::max(1, model_flags.num_threads() / disagg.data_parallel_size);
  if (disagg.data_parallel_size == 1) {
    ThreadPool::set_default_threads(model_flags.num_threads());
  }
  d->ranks_.resize(static_cast<size_t>(disagg.data_parallel_size));
  for (int r = 0; r < disagg.data_parallel_size; ++r) {
    RETURN_IF_ERROR(d->start_rank(r, model_flags, disagg, host, threads_per_rank));
  }
  std::vector<server::EngineClient*> clients;
  for (auto& rank : d->ranks_) {
    clients.push_back(rank.client.get());
  }
  d->dp_client_ = std::make_unique<server::DataParallelEngineClient>(std::move(clients));

  const engine::LoadedEngine& loaded = *d->ranks_.front().loaded;
  const bool wants_consumer =
      ec.parsed_role == EcRole::kConsumer ||
      (ec.parsed_role == EcRole::kNone && d->role_ != ServeRole::kDecode && loaded.takes_images());
  if (wants_consumer) {
    if (!loaded.takes_images()) {
      return invalid_argument("--ec-role consumer needs a vision-language model");
    }
    if (ec.parsed_connector == EcConnectorKind::kDisk) {
      disagg::EcDiskConsumerOptions options;
      options.dir = ec.ec_path;
      options.compat = ec_compat(loaded);
      ASSIGN_OR_RETURN(d->ec_disk_consumer_, disagg::EcDiskConsumer::create(std::move(options)));
      d->ec_fetcher_ = make_ec_fetcher(d->ec_disk_consumer_.get(), ec.transfer_timeout());
    } else {
      disagg::EcConsumerOptions options;
      options.transport = ec.parsed_transport;
      options.timeout = ec.transfer_timeout();
      options.compat = ec_compat(loaded);
      options.listen_host = disagg.kv_listen_host.empty() ? host : disagg.kv_listen_host;
      options.auth_token = disagg.auth_token;
      if (!d->resolver_) {
        d->resolver_ = std::make_shared<bootstrap::EngineResolver>();
      }
      // Items that name a bootstrap server find their encoder through it (cached per engine).
      options.resolve = [resolver = d->resolver_](const std::string& url,
                                                  const std::string& engine_id, Deadline deadline) {
        return resolver->resolve_encoder(url, engine_id, deadline);
      };
      ASSIGN_OR_RETURN(d->ec_consumer_, disagg::EcConsumer::create(std::move(options)));
      d->ec_fetcher_ = make_ec_fetcher(d->ec_consumer_.get(), ec.transfer_timeout());
    }
  }

  if (d->role_ == ServeRole::kPrefill) {
    for (int r = 0; r < disagg.data_parallel_size; ++r) {
      bootstrap::WorkerRegistration reg;
      reg.engine_id = d->ranks_[r].engine_id;
      reg.dp_rank = r;
      reg.addr = d->ranks_[r].connector->worker_addr();
      reg.lease_ttl_s = disagg.bootstrap_lease_ttl_s;
      reg.auth_token = disagg.auth_token;
      Status s = d->register_and_keep(d->bootstrap_url_, reg);
      if (!s.is_ok()) {
        return Status(s.code(), "dp rank " + std::to_string(r) + " cannot register with the " +
                                    "bootstrap server " + d->bootstrap_url_ + ": " + s.message());
      }
    }
  }
  return d;
}

Status ServeDeployment::start_rank(int dp_rank, const ModelFlags& model_flags,
                                   const DisaggFlags& disagg, const std::string& host,
                                   int threads_per_rank) {
  Rank& rank = ranks_[static_cast<size_t>(dp_rank)];
  bool single = ranks_.size() == 1;
  ThreadPool* pool = &ThreadPool::default_pool();
  if (!single) {
    rank.pool = std::make_unique<ThreadPool>(threads_per_rank);
    pool = rank.pool.get();
  }
  std::function<Result<engine::KvCacheMemory>(int64_t)> allocate;
  if (role_ != ServeRole::kBoth) {
    // Shareable memory: the shm transport hands it to peers, the others register it.
    allocate = [](int64_t num_bytes) -> Result<engine::KvCacheMemory> {
      // Populated: transfers into fresh KV blocks would otherwise fault page by page.
      ASSIGN_OR_RETURN(
          transfer::SharedBuffer buffer,
          transfer::allocate_shared(static_cast<size_t>(num_bytes), /*populate=*/true));
      auto owned = std::make_shared<transfer::SharedBuffer>(std::move(buffer));
      engine::KvCacheMemory memory;
      memory.base = owned->data();
      memory.num_bytes = static_cast<int64_t>(owned->size());
      memory.release = [owned]() mutable { owned.reset(); };
      return memory;
    };
  }
  ASSIGN_OR_RETURN(rank.loaded, model_flags.load(*pool, std::move(allocate),
                                                 role_ == ServeRole::kDecode
                                                     ? engine::ModelParts::kWithoutVisionTower
                                                     : engine::ModelParts::kAll));
  if (role_ == ServeRole::kBoth) {
    ASSIGN_OR_RETURN(rank.client, server::EngineLoopClient::create(rank.loaded.get()));
    return Status::ok();
  }

  rank.engine_id = std::string(role_ == ServeRole::kPrefill ? "prefill-" : "decode-") +
                   random_uuid() + "-dp" + std::to_string(dp_rank);
  const engine::TransformerRunner& runner = *rank.loaded->runner;
  disagg::DisaggOptions options;
  options.engine_id = rank.engine_id;
  options.transport = disagg.parsed_transport;
  options.listen_host = disagg.kv_listen_host.empty() ? host : disagg.kv_listen_host;
  options.accept_asks = role_ == ServeRole::kPrefill;
  options.auth_token = disagg.auth_token;
  options.transfer_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::llround(disagg.kv_transfer_timeout_s * 1000)));
  options.compat = compat_info(*rank.loaded);
  options.memory.base = static_cast<uint8_t*>(runner.kv_base());
  options.memory.num_bytes = static_cast<uint64_t>(runner.kv_num_bytes());
  options.memory.block_bytes = static_cast<uint64_t>(runner.kv_layout().block_num_bytes());
  options.memory.num_blocks = runner.num_kv_blocks();
  options.metrics = transfer_metrics_;
  options.resolve = [resolver = resolver_](const std::string& url, const std::string& engine_id,
                                           Deadline deadline) {
    return resolver->resolve(url, engine_id, deadline);
  };
  options.forget = [resolver = resolver_](const std::string& url, const std::string& engine_id) {
    resolver->invalidate(url, engine_id);
  };
  ASSIGN_OR_RETURN(rank.connector, disagg::KvTransferConnector::create(std::move(options)));
  ASSIGN_OR_RETURN(rank.client,
                   server::EngineLoopClient::create(rank.loaded.get(), rank.connector.get()));
  return Status::ok();
}

Status ServeDeployment::start_encoder(const ModelFlags& model_flags, const DisaggFlags& disagg,
                                      const EcFlags& ec, const std::string& host) {
  ASSIGN_OR_RETURN(encoder_loaded_, model_flags.load(ThreadPool::default_pool(), {},
                                                     engine::ModelParts::kVisionTowerOnly));
  const std::string engine_id = "encode-" + random_uuid();
  // Publishing waits for pool space up to --ec-full-pool-wait-s, and for another request
  // encoding the same image.
  const std::chrono::milliseconds publish_deadline = ec.full_pool_wait() + std::chrono::seconds(60);
  if (ec.parsed_connector == EcConnectorKind::kDisk) {
    disagg::EcDiskProducerOptions options;
    options.engine_id = engine_id;
    options.dir = ec.ec_path;
    options.max_bytes = ec.parsed_pool_bytes;
    options.reservation_timeout = ec.reservation_timeout();
    options.full_pool_wait = ec.full_pool_wait();
    options.compat = ec_compat(*encoder_loaded_);
    options.bootstrap_addr = disagg.bootstrap_addr;
    ASSIGN_OR_RETURN(ec_disk_producer_, disagg::EcDiskProducer::create(std::move(options)));
    ec_publisher_ = make_ec_publisher(ec_disk_producer_.get(), publish_deadline);
    // No registration: a disk encoder has no listener, its items name the directory.
    return Status::ok();
  }
  disagg::EcProducerOptions options;
  options.engine_id = engine_id;
  options.transport = ec.parsed_transport;
  options.listen_host = disagg.kv_listen_host.empty() ? host : disagg.kv_listen_host;
  options.listen_port = ec.ec_port;
  options.auth_token = disagg.auth_token;
  options.pool_bytes = ec.parsed_pool_bytes;
  options.reservation_timeout = ec.reservation_timeout();
  options.full_pool_wait = ec.full_pool_wait();
  options.compat = ec_compat(*encoder_loaded_);
  options.bootstrap_addr = disagg.bootstrap_addr;
  ASSIGN_OR_RETURN(ec_producer_, disagg::EcProducer::create(std::move(options)));
  ec_publisher_ = make_ec_publisher(ec_producer_.get(), publish_deadline);
  if (!disagg.bootstrap_addr.empty()) {
    // Registered apart from the dp ranks (role "encode"): prefill workers resolve the
    // engine_id of an item that names this bootstrap server to this listener.
    bootstrap::WorkerRegistration reg;
    reg.engine_id = engine_id;
    reg.addr = ec_producer_->worker_addr();
    reg.role = std::string(bootstrap::kEncodeRole);
    reg.lease_ttl_s = disagg.bootstrap_lease_ttl_s;
    reg.auth_token = disagg.auth_token;
    Status s = register_and_keep(disagg.bootstrap_addr, reg);
    if (!s.is_ok()) {
      return Status(s.code(), "the encoder cannot register with the bootstrap server " +
                                  disagg.bootstrap_addr + ": " + s.message());
    }
    bootstrap_url_ = disagg.bootstrap_addr;
  }
  return Status::ok();
}

Status ServeDeployment::register_and_keep(const std::string& url,
                                          const bootstrap::WorkerRegistration& reg) {
  RETURN_IF_ERROR(bootstrap::register_with_retry(url, reg, Deadline::after_ms(60'000)));
  lease_keepers_.push_back(std::make_unique<bootstrap::LeaseKeeper>(
      url, reg, [this](const std::string& reason) { on_fenced(reason); }));
  return Status::ok();
}

void ServeDeployment::on_fenced(const std::string& reason) {
  std::function<void(const std::string&)> call;
  {
    std::lock_guard<std::mutex> lock(fence_mu_);
    if (!fenced_reason_.empty()) {
      return;  // another rank's keeper said it first
    }
    fenced_reason_ = reason;
    call = on_fenced_;
  }
  is_fenced_ = true;
  if (call) {
    call(reason);
  }
}

void ServeDeployment::set_on_fenced(std::function<void(const std::string& reason)> on_fenced) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(fence_mu_);
    on_fenced_ = on_fenced;
    reason = fenced_reason_;
  }
  if (!reason.empty() && on_fenced) {
    on_fenced(reason);
  }
}

engine::EncoderRunner* ServeDeployment::encoder() const {
  return encoder_loaded_ ? encoder_loaded_->encoder_runner.get() : nullptr;
}

ServeDeployment::~ServeDeployment() {
  shutdown();
}

server::EngineClient* ServeDeployment::client() {
  if (ranks_.empty()) {
    return nullptr;
  }
  if (ranks_.size() == 1) {
    return ranks_[0].client.get();
  }
  return dp_client_.get();
}

void ServeDeployment::render_metrics(const std::string& model_name, std::string* out) const {
  if (!ranks_.empty() && ranks_[0].connector) {
    ranks_[0].connector->render_metrics(
        out);  // FIXME(lead): all ranks via a shared TransferMetrics
  }
  if (ec_producer_) {
    *out += ec_producer_->render_metrics(model_name);
  }
  if (ec_consumer_) {
    *out += ec_consumer_->render_metrics(model_name);
  }
  if (ec_disk_producer_) {
    *out += ec_disk_producer_->render_metrics(model_name);
  }
  if (ec_disk_consumer_) {
    *out += ec_disk_consumer_->render_metrics(model_name);
  }
  if (!lease_keepers_.empty()) {
    prometheus::append_header(out, "crescent_bootstrap_fenced", "gauge",
                              "1 once another engine replaced this process's registration with "
                              "the bootstrap server (it no longer serves), else 0.");
    prometheus::append_sample(out, "crescent_bootstrap_fenced{model_name=\"" + model_name + "\"}",
                              is_fenced_.load() ? 1 : 0);
  }
  if (role_ != ServeRole::kBoth || ec_consumer_) {
    prometheus::append_header(out, "crescent_auth_refused_connections_total", "counter",
                              "Control and transfer connections refused because the peer failed "
                              "the --auth-token-file handshake (wrong token, none, or silence).");
    prometheus::append_sample(
        out, "crescent_auth_refused_connections_total{model_name=\"" + model_name + "\"}",
        static_cast<double>(net::auth::num_refused_connections()));
  }
  if (loaded().takes_images()) {
    prometheus::append_header(out, "crescent_vision_tower_loaded", "gauge",
                              "1 when this process loaded the vision tower (it can encode "
                              "images); 0 for a decode server of a vision-language model.");
    prometheus::append_sample(out,
                              "crescent_vision_tower_loaded{model_name=\"" + model_name + "\"}",
                              loaded().is_multimodal() ? 1 : 0);
  }
}

std::string ServeDeployment::describe() const {
  std::string out;
  if (ec_producer_) {
    out += "  encoder: engine_id " + ec_producer_->engine_id() + ", ec worker " +
           ec_producer_->worker_addr() + "\n";
  }
  if (!ranks_.empty() && ranks_.front().loaded->takes_images()) {
    out += ranks_.front().loaded->is_multimodal()
               ? "  vision tower loaded\n"
               : "  vision tower not loaded (--role decode: images' KV comes from prefill)\n";
  }
  if (ec_disk_producer_) {
    out += "  encoder: engine_id " + ec_disk_producer_->engine_id() + ", ec directory " +
           ec_disk_producer_->dir() + " (--ec-connector disk)\n";
  }
  if (ec_consumer_) {
    out += "  ec consumer: pulls image embeddings named by ec_transfer_params\n";
  }
  if (ec_disk_consumer_) {
    out +=
        "  ec consumer: reads image embeddings named by ec_transfer_params from the ec "
        "directory (--ec-connector disk)\n";
  }
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].connector) {
      out += "  dp rank " + std::to_string(r) + ": engine_id " + ranks_[r].engine_id;
      std::string addr = ranks_[r].connector->worker_addr();
      if (!addr.empty()) {
        out += ", kv worker " + addr;
      }
      out += "\n";
    }
  }
  return out;
}

void ServeDeployment::shutdown() {
  if (is_shut_down_) {
    return;
  }
  is_shut_down_ = true;
  // Renewals end first: a worker that is shutting down lets its leases lapse.
  for (auto& keeper : lease_keepers_) {
    keeper->stop();
  }
  // Connectors first: transfers in flight fail and held blocks are reported released, so the
  // engines' own shutdown does not wait on a peer.
  for (Rank& rank : ranks_) {
    if (rank.connector) {
      rank.connector->shutdown();
    }
  }
  for (Rank& rank : ranks_) {
    if (rank.client) {
      rank.client->shutdown();
    }
  }
  if (bootstrap_server_) {
    bootstrap_server_->stop();
  }
}

}  // namespace crescent::apps
