#pragma once
// The `crescent serve` flags of the EC connector (EPD: encoder outputs moved from encoder
// workers to prefill workers, DESIGN.md §2b), in the style of vLLM's names, and the adapters
// that put disagg's EcProducer / EcConsumer behind the server's EcPublisher / EcFetcher.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "apps/flags.h"
#include "disagg/ec_consumer.h"
#include "disagg/ec_disk_connector.h"
#include "disagg/ec_producer.h"
#include "engine/loader.h"
#include "server/ec_link.h"

namespace crescent::apps {

enum class EcRole { kNone, kProducer, kConsumer };
// transfer: the encoder's registered tensor pool, pulled through the transfer engine;
// disk: safetensors files in --ec-path, a directory both sides see (the seed's baseline).
enum class EcConnectorKind { kTransfer, kDisk };

struct EcFlags {
  std::string ec_role;  // empty: producer for --role encode, consumer for prefill|both of a VL
  std::string ec_transport = "shm";
  std::string ec_pool_size = "256MiB";
  double ec_reservation_timeout_s = 30;
  double ec_full_pool_wait_s = 0;
  double ec_transfer_timeout_s = 30;
  int ec_port = 0;
  bool ec_fallback_local = true;
  std::string ec_connector = "transfer";
  std::string ec_path;  // --ec-connector disk: the shared directory

  void add_to(FlagParser& flags);
  // Checks values against the serve role ("both", "prefill", "decode", "encode"); fills the
  // parsed_* fields. The role a VL model's process then takes is decided by role_for().
  Status validate(const std::string& serve_role);
  EcRole parsed_role = EcRole::kNone;  // kNone: by the serve role and the model
  transfer::TransportKind parsed_transport = transfer::TransportKind::kShm;
  uint64_t parsed_pool_bytes = 256ull << 20;
  EcConnectorKind parsed_connector = EcConnectorKind::kTransfer;

  std::chrono::milliseconds reservation_timeout() const;
  std::chrono::milliseconds full_pool_wait() const;
  std::chrono::milliseconds transfer_timeout() const;
};

// "268435456", "256MiB", "256M", "1GiB", "512KiB" -> bytes (K/M/G and KiB/MiB/GiB are powers
// of 1024, KB/MB/GB of 1000). InvalidArgument naming the text otherwise.
Result<uint64_t> parse_byte_size(const std::string& text);

// What an encoder and a prefill worker must agree on: the tower (architecture and shape), the
// embedding dtype and width, and a hash of the image processor settings.
disagg::EcCompat ec_compat(const engine::LoadedEngine& loaded);

// The adapters. Each fetcher's parse() refuses, with 400's InvalidArgument naming
// --ec-connector, an item of the other connector (a file:// item at a transfer consumer, a
// tcp:// one at a disk consumer).
std::unique_ptr<server::EcPublisher> make_ec_publisher(disagg::EcProducer* producer,
                                                       std::chrono::milliseconds deadline);
std::unique_ptr<server::EcFetcher> make_ec_fetcher(disagg::EcConsumer* consumer,
                                                   std::chrono::milliseconds deadline);
std::unique_ptr<server::EcPublisher> make_ec_publisher(disagg::EcDiskProducer* producer,
                                                       std::chrono::milliseconds deadline);
std::unique_ptr<server::EcFetcher> make_ec_fetcher(disagg::EcDiskConsumer* consumer,
                                                   std::chrono::milliseconds deadline);

}  // namespace crescent::apps
