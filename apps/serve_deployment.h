#pragma once
// What one `crescent serve` process runs behind its HTTP server: one engine per data-parallel
// rank, and for --role prefill|decode each rank's KV cache in shareable memory, its KV
// connector, and (prefill) the bootstrap server on rank 0 plus every rank's registration.
// EPD (DESIGN.md §2b): --role encode loads only a VL model's vision tower and runs the EC
// producer, no engine; --role prefill|both of a VL model runs an EC consumer; --role decode of
// a VL model does not load the tower. Wiring only: the pieces live in src/engine, src/disagg
// and src/bootstrap.

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "apps/ec_flags.h"
#include "apps/flags.h"
#include "apps/model_flags.h"
#include "bootstrap/bootstrap_client.h"
#include "bootstrap/bootstrap_server.h"
#include "bootstrap/lease_keeper.h"
#include "core/thread_pool.h"
#include "disagg/kv_transfer_connector.h"
#include "server/data_parallel_engine_client.h"
#include "server/engine_loop_client.h"
#include "transfer/shared_memory.h"

namespace crescent::apps {

enum class ServeRole { kBoth, kPrefill, kDecode, kEncode };

struct DisaggFlags {
  std::string role = "both";
  std::string kv_transport = "shm";
  double kv_transfer_timeout_s = 30;
  int bootstrap_port = 8998;
  std::string bootstrap_addr;  // external bootstrap; empty: prefill rank 0 hosts one
  int data_parallel_size = 1;
  std::string kv_listen_host;  // the connector's control listener; empty: --host
  // The lease of every registration (renewed every third of it), and the longest lease a
  // hosted bootstrap grants.
  double bootstrap_lease_ttl_s = 10;
  // --auth-token-file; validate() loads auth_token from it or from $CRESCENT_AUTH_TOKEN.
  std::string auth_token_file;
  std::string auth_token;

  void add_to(FlagParser& flags);
  // Checks values and combinations; fills parsed_role and parsed_transport.
  Status validate();
  ServeRole parsed_role = ServeRole::kBoth;
  transfer::TransportKind parsed_transport = transfer::TransportKind::kShm;
};

class ServeDeployment {
 public:
  // Starts the bootstrap server first (prefill, no --bootstrap-addr) so that a proxy can poll
  // it while the model loads, then loads every rank, creates the connectors and registers the
  // prefill ranks (with retries) before returning.
  static Result<std::unique_ptr<ServeDeployment>> start(const ModelFlags& model_flags,
                                                        const DisaggFlags& disagg,
                                                        const EcFlags& ec, const std::string& host);
  ~ServeDeployment();  // shutdown()

  // Null for --role encode (no engine).
  server::EngineClient* client();
  ServeRole role() const { return role_; }
  // Rank 0's model, tokenizer and (vision-language models) tower; every rank loads the same.
  // --role encode: the tower alone.
  const engine::LoadedEngine& loaded() const {
    return encoder_loaded_ ? *encoder_loaded_ : *ranks_.front().loaded;
  }
  // --role encode: the tower's runner and the pool it publishes into; null otherwise.
  engine::EncoderRunner* encoder() const;
  // --ec-connector transfer (null with disk).
  disagg::EcProducer* ec_producer() const { return ec_producer_.get(); }
  // --role prefill|both of a VL model (unless another --ec-role): pulls of encoder outputs
  // (--ec-connector transfer; null with disk).
  disagg::EcConsumer* ec_consumer() const { return ec_consumer_.get(); }
  // The server's views of whichever connector --ec-connector picked: the publisher of
  // --role encode, the fetcher of an EC consumer; null otherwise. Owned by the deployment.
  server::EcPublisher* ec_publisher() const { return ec_publisher_.get(); }
  server::EcFetcher* ec_fetcher() const { return ec_fetcher_.get(); }
  // The bootstrap this deployment registers with (prefill; an encoder given --bootstrap-addr);
  // empty otherwise.
  const std::string& bootstrap_url() const { return bootstrap_url_; }
  // Appends the connectors' crescent_kv_transfer_* and crescent_ec_* families, and whether
  // this process loaded a vision tower (VL models).
  void render_metrics(const std::string& model_name, std::string* out) const;
  // One line per rank: its engine id and worker address.
  std::string describe() const;
  // Called once (from a lease thread) when the bootstrap refuses a renewal because another
  // engine replaced one of this process's registrations: this process must stop serving. A
  // fence that came before the call runs it at once. Set before the deployment serves.
  void set_on_fenced(std::function<void(const std::string& reason)> on_fenced);
  // Aborts what runs, fails transfers in flight, stops engines, connectors and the bootstrap.
  // Idempotent.
  void shutdown();

 private:
  struct Rank {
    std::unique_ptr<ThreadPool> pool;
    std::unique_ptr<engine::LoadedEngine> loaded;
    std::unique_ptr<disagg::KvTransferConnector> connector;
    std::unique_ptr<server::EngineLoopClient> client;
    std::string engine_id;
  };
  ServeDeployment() = default;
  Status start_rank(int dp_rank, const ModelFlags& model_flags, const DisaggFlags& disagg,
                    const std::string& host, int threads_per_rank);
  Status start_encoder(const ModelFlags& model_flags, const DisaggFlags& disagg, const EcFlags& ec,
                       const std::string& host);
  // Registers (with retries) and keeps the registration's lease (LeaseKeeper).
  Status register_and_keep(const std::string& url, const bootstrap::WorkerRegistration& reg);
  void on_fenced(const std::string& reason);

  ServeRole role_ = ServeRole::kBoth;
  std::string bootstrap_url_;
  std::unique_ptr<bootstrap::BootstrapServer> bootstrap_server_;
  std::shared_ptr<bootstrap::EngineResolver> resolver_;
  std::shared_ptr<disagg::TransferMetrics> transfer_metrics_;
  std::vector<Rank> ranks_;
  std::unique_ptr<server::DataParallelEngineClient> dp_client_;
  std::unique_ptr<engine::LoadedEngine> encoder_loaded_;  // --role encode
  std::unique_ptr<disagg::EcProducer> ec_producer_;
  std::unique_ptr<disagg::EcConsumer> ec_consumer_;
  std::unique_ptr<disagg::EcDiskProducer> ec_disk_producer_;  // --ec-connector disk
  std::unique_ptr<disagg::EcDiskConsumer> ec_disk_consumer_;
  std::unique_ptr<server::EcPublisher> ec_publisher_;
  std::unique_ptr<server::EcFetcher> ec_fetcher_;
  std::vector<std::unique_ptr<bootstrap::LeaseKeeper>> lease_keepers_;
  std::mutex fence_mu_;
  std::string fenced_reason_;                          // GUARDED_BY(fence_mu_)
  std::function<void(const std::string&)> on_fenced_;  // GUARDED_BY(fence_mu_)
  std::atomic<bool> is_fenced_{false};
  bool is_shut_down_ = false;
};

}  // namespace crescent::apps
