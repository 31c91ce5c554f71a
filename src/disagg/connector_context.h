#pragma once
// What the two halves of the connector (prefill_side.h, decode_side.h) share. Owned by
// KvTransferConnector::Impl, which outlives both sides.

#include "disagg/event_queue.h"
#include "disagg/kv_transfer_connector.h"
#include "disagg/transfer_metrics.h"
#include "disagg/work_queue.h"
#include "transfer/transfer_engine.h"

namespace crescent::disagg {

struct ConnectorContext {
  const DisaggOptions* options = nullptr;
  transfer::TransferEngine* transfer = nullptr;
  transfer::RegionId region;  // this engine's KV memory
  TransferMetrics* metrics = nullptr;
  EventQueue* events = nullptr;
  WorkQueue* work = nullptr;

  int block_size() const { return options->compat.block_size; }
  uint64_t block_bytes() const { return options->memory.block_bytes; }
};

// "1.5 s" for messages about timeouts.
std::string seconds_text(std::chrono::milliseconds d);

}  // namespace crescent::disagg
