#pragma once
// The server's view of the EC connector (EPD, DESIGN.md §2b): an encoder worker publishes each
// image's embeddings into its tensor pool, and a prefill worker pulls them instead of encoding.
// Interfaces, so that src/server never includes src/disagg; apps/ wires disagg's EcProducer and
// EcConsumer in. Implementations are thread-safe.

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::server {

// One image's encoder output as ec_transfer_params names it: what the server matches
// (mm_hash) and sizes by, plus the connector's own item, kept as sent.
struct EcItem {
  std::string mm_hash;
  int64_t num_tokens = 0;
  int64_t hidden_size = 0;
  nlohmann::json wire;  // one element of ec_transfer_params.items
};

// The encoder side (`crescent serve --role encode`).
class EcPublisher {
 public:
  virtual ~EcPublisher() = default;
  // Reserves num_tokens x hidden_size floats for mm_hash in the pool, calls write(dst) to fill
  // them (not called when the pool already holds mm_hash: *was_cached is then true), and
  // returns the item a consumer pulls. ResourceExhausted when the pool stays full.
  virtual Result<EcItem> publish(const std::string& mm_hash, int64_t num_tokens,
                                 int64_t hidden_size,
                                 const std::function<Status(float* dst)>& write,
                                 bool* was_cached) = 0;
  // Gives up reservations that will never be pulled (the rest of the request failed).
  virtual void release(std::span<const EcItem> items) = 0;
};

// The prefill side (--role prefill|both of a vision-language model).
class EcFetcher {
 public:
  virtual ~EcFetcher() = default;
  // A request's ec_transfer_params. InvalidArgument naming the bad field.
  virtual Result<std::vector<EcItem>> parse(const nlohmann::json& ec_transfer_params) const = 0;
  // Pulls each item into its dst (num_tokens x hidden_size floats), waiting for all of them
  // within the connector's timeout, and tells the producers to release them (also on failure).
  virtual Status fetch(std::span<const EcItem> items, std::span<const std::span<float>> dsts) = 0;
  // Tells the producers that these items are not needed after all.
  virtual void release(std::span<const EcItem> items) = 0;
};

}  // namespace crescent::server
