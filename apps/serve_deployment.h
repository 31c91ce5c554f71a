#pragma once
// What one `crescent serve` process runs behind its HTTP server: one engine per data-parallel
// rank, and for --role prefill|decode each rank's KV cache in shareable memory, its KV
// connector, and (prefill) the bootstrap server on rank 0 plus every rank's registration.
// Wiring only: the pieces live in src/engine, src/disagg and src/bootstrap.

#include <memory>
#include <string>
#include <vector>

#include "apps/flags.h"
#include "apps/model_flags.h"
#include "bootstrap/bootstrap_client.h"
#include "bootstrap/bootstrap_server.h"
#include "core/thread_pool.h"
#include "disagg/kv_transfer_connector.h"
#include "server/data_parallel_engine_client.h"
#include "server/engine_loop_client.h"
#include "transfer/shared_memory.h"

namespace crescent::apps {

enum class ServeRole { kBoth, kPrefill, kDecode };

struct DisaggFlags {
  std::string role = "both";
  std::string kv_transport = "shm";
  double kv_transfer_timeout_s = 30;
  int bootstrap_port = 8998;
  std::string bootstrap_addr;  // external bootstrap; empty: prefill rank 0 hosts one
  int data_parallel_size = 1;
  std::string kv_listen_host;  // the connector's control listener; empty: --host

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
                                                        const std::string& host);
  ~ServeDeployment();  // shutdown()

  server::EngineClient* client();
  // Rank 0's model, tokenizer and (vision-language models) tower; every rank loads the same.
  const engine::LoadedEngine& loaded() const { return *ranks_.front().loaded; }
  // The bootstrap this deployment registers with (prefill); empty otherwise.
  const std::string& bootstrap_url() const { return bootstrap_url_; }
  // Appends the connectors' crescent_kv_transfer_* families (nothing for --role both).
  void render_metrics(std::string* out) const;
  // One line per rank: its engine id and worker address.
  std::string describe() const;
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

  ServeRole role_ = ServeRole::kBoth;
  std::string bootstrap_url_;
  std::unique_ptr<bootstrap::BootstrapServer> bootstrap_server_;
  std::shared_ptr<bootstrap::EngineResolver> resolver_;
  std::shared_ptr<disagg::TransferMetrics> transfer_metrics_;
  std::vector<Rank> ranks_;
  std::unique_ptr<server::DataParallelEngineClient> dp_client_;
  bool is_shut_down_ = false;
};

}  // namespace crescent::apps
