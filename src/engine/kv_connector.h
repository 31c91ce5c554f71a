#pragma once
// KvConnector: how the engine hands KV blocks to, and receives them from, another engine
// (prefill/decode disaggregation) without knowing how bytes move. The engine calls it from its
// own thread at fixed points of a request's life; the connector works asynchronously (its own
// threads, sockets, transfer engine) and reports back through take_events(), which the engine
// polls once per step. src/disagg implements it; the engine never sees a socket.
//
// Decode side (params.do_remote_prefill):
//   1. When the scheduler admits the request it allocates blocks for the whole prompt, reusing
//      its own prefix-cache hits, and calls start_remote_prefill() with the block table and the
//      number of leading prompt tokens already held locally. The request then waits in
//      SequenceStatus::kWaitingForRemoteKv and is never scheduled for compute.
//   2. If the local prefix already covers every token the remote would send (num_local_tokens
//      >= num_prompt_tokens - 1), the engine does not wait: it calls start_remote_prefill()
//      anyway with nothing to fetch (the connector tells the peer it is not needed and reports
//      nothing back) and schedules the request at once.
//   3. A kRemoteKvReady event with OK status: tokens [0, num_prompt_tokens - 1) are in the
//      blocks; the engine registers the full blocks with its prefix cache and computes only the
//      last prompt token, then decodes as usual. A non-OK status fails the request (kError,
//      that message) and frees its blocks: the connector reports failure only once no peer can
//      still write into them.
//   4. Abort of a waiting request: the engine delivers kAbort to the client at once, calls
//      cancel(), and keeps the blocks referenced until the connector reports kRemoteKvReady
//      (any status) for that request id; only then are they freed.
//   5. A request that ends (abort, shutdown) before it was ever admitted: the engine calls
//      start_remote_prefill() with no blocks and num_local_tokens covering the whole prompt,
//      i.e. the "nothing to fetch" form of step 2, so the peer frees what it holds for the
//      transfer at once. No event follows.
//
// Prefill side (params.do_remote_decode):
//   1. The request runs as usual (the proxy sends max_tokens = 1). When it finishes normally
//      (stop or length) the engine calls hold_for_remote_decode() with its block table; when
//      that returns true the engine keeps the blocks referenced (they no longer count as a
//      running request) until a kBlocksReleased event for that request id, then frees them
//      (full blocks stay in the prefix cache).
//   2. When the request fails or is aborted before that, the engine calls
//      fail_remote_decode() so the connector can answer the peer's ask with an error at once.
//
// Thread-safety: every method except set_wakeup() and the event queue is called on the
// engine's thread only; implementations must not block in them. take_events() is also called
// on the engine's thread. The connector calls the wakeup function (from any thread) after it
// queued an event, so an idle engine loop wakes up to take it.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::engine {

// The "kv_transfer_params" of an OpenAI request, as DESIGN.md §2 fixes them.
struct KvTransferParams {
  bool do_remote_prefill = false;     // decode side: fetch the prompt's KV from remote_engine_id
  bool do_remote_decode = false;      // prefill side: keep the KV for a decode engine to fetch
  std::string transfer_id;            // pairs the two halves of one request
  std::string remote_engine_id;       // decode side: the prefill engine to ask
  std::string remote_bootstrap_addr;  // decode side: "http://HOST:PORT" of the bootstrap server

  bool is_remote() const { return do_remote_prefill || do_remote_decode; }
};

struct KvConnectorEvent {
  enum class Kind {
    kRemoteKvReady,   // decode side: the fetch ended (status OK: the KV is in the blocks)
    kBlocksReleased,  // prefill side: the held blocks may be freed
  };
  Kind kind = Kind::kRemoteKvReady;
  std::string request_id;
  Status status;  // kRemoteKvReady: why it failed, when it did
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // Decode side. block_ids covers the whole prompt (block i holds tokens [i*B, (i+1)*B)).
  // The remote must write blocks [num_local_tokens / B, ceil((num_prompt_tokens - 1) / B)).
  // num_local_tokens is a multiple of the block size.
  virtual void start_remote_prefill(const std::string& request_id, const KvTransferParams& params,
                                    std::span<const int32_t> prompt_token_ids,
                                    std::span<const int32_t> block_ids, int num_local_tokens) = 0;

  // Prefill side: the request's prefill is done and block_ids hold the K/V of every prompt
  // token. True: the connector now owns the blocks until kBlocksReleased. False: free them.
  virtual bool hold_for_remote_decode(const std::string& request_id, const KvTransferParams& params,
                                      std::span<const int32_t> prompt_token_ids,
                                      std::span<const int32_t> block_ids) = 0;

  // Either side: the engine no longer needs this request's transfer (abort, error).
  virtual void cancel(const std::string& request_id) = 0;

  // Prefill side: a do_remote_decode request failed or was aborted before
  // hold_for_remote_decode(); the connector answers the decode engine's ask (waiting or still
  // to come) with `why` at once instead of at its deadline. The engine calls it instead of
  // cancel() for such requests.
  virtual void fail_remote_decode(const std::string& request_id, const KvTransferParams& params,
                                  const Status& why) = 0;

  // Decode side: a do_remote_prefill request that this engine will never run (its server
  // refused it before submitting it). The connector tells the prefill engine, best effort, that
  // nobody will pull the KV, so it frees the blocks at once instead of at its deadline.
  // Thread-safe; never blocks.
  virtual void release_unpulled(const KvTransferParams& params) {}

  // Events queued since the previous call. Thread-safe.
  virtual std::vector<KvConnectorEvent> take_events() = 0;

  // Requests the connector still owns blocks for or still reports on (for has_work decisions).
  virtual int num_pending() const = 0;

  // Called once before the engine starts; fn may be called from any thread.
  virtual void set_wakeup(std::function<void()> fn) = 0;
};

}  // namespace crescent::engine
