#pragma once
// DecodeSide: the decode half of the connector. Per request: resolve the prefill engine
// (cached), open or reuse the control connection to its worker (HELLO once, cached), ASK, wait
// for DONE, report kRemoteKvReady. Failure is reported only once no prefill engine can still
// write into the request's blocks: after CANCEL_ACK or DONE, after the connection is known
// closed, or when no ASK was sent. State machine and deadlines: docs/disagg.md.
// Thread-safety: every method may be called from any thread; start() and cancel() never block.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "disagg/connector_context.h"
#include "disagg/control_channel.h"
#include "disagg/protocol.h"

namespace crescent::disagg {

class DecodeSide {
 public:
  explicit DecodeSide(const ConnectorContext* ctx);
  ~DecodeSide();
  DecodeSide(const DecodeSide&) = delete;
  DecodeSide& operator=(const DecodeSide&) = delete;

  void start(const std::string& request_id, const engine::KvTransferParams& params,
             std::span<const int32_t> prompt_token_ids, std::span<const int32_t> block_ids,
             int num_local_tokens);
  // True when request_id is one of this side's fetches.
  bool cancel(const std::string& request_id);
  // A request refused before it reached the engine: NOT_NEEDED to its prefill engine (best
  // effort, on the work queue), which frees the blocks it holds or will hold for it.
  void release_unpulled(const engine::KvTransferParams& params);
  // Housekeeping: fetch deadlines, CANCEL grace; joins dead channels.
  void tick();
  int num_pending() const;

  // Refuses new fetches and closes every control connection gracefully (each waits at most
  // cancel_grace for the prefill engine's EOF), failing the fetches on them; joins them.
  void close_connections();
  // After the work queue stopped: fails every fetch still unreported.
  void fail_all();

 private:
  enum class Phase {
    kPreparing,   // queued or running: resolve, connect, HELLO (no ASK sent yet)
    kAsked,       // ASK sent, waiting for DONE
    kCancelling,  // CANCEL sent (abort or timeout), waiting for CANCEL_ACK / DONE / close
  };
  struct Fetch {
    Phase phase = Phase::kPreparing;
    std::string transfer_id;
    std::string engine_id;
    std::string bootstrap_url;
    protocol::Ask ask;
    uint64_t expected_bytes = 0;
    TimePoint start;
    TimePoint ask_sent;
    Deadline deadline = Deadline::never();
    TimePoint grace_until;
    bool is_close_requested = false;
    std::shared_ptr<ControlChannel> channel;
    Status pending;  // kCancelling: what to report once the peer let go
    TransferResult pending_result = TransferResult::kCancelled;
    double bootstrap_s = 0;
  };
  using FetchMap = std::map<std::string, Fetch>;

  void run_fetch(const std::string& request_id);
  void run_not_needed(const std::string& bootstrap_url, const std::string& engine_id,
                      const std::string& transfer_id);
  // Under mu_: queues run_not_needed for params' transfer (nothing once stopping).
  void post_not_needed_locked(const engine::KvTransferParams& params);
  Result<std::string> resolve(const std::string& bootstrap_url, const std::string& engine_id,
                              Deadline deadline);
  Result<std::shared_ptr<ControlChannel>> channel_to(const std::string& addr,
                                                     const std::string& engine_id,
                                                     Deadline deadline);
  Result<net::Fd> handshake(const std::string& addr, const std::string& engine_id,
                            Deadline deadline);
  void on_frame(ControlChannel& channel, net::Frame frame);
  void on_closed(ControlChannel& channel, const Status& reason);
  void forget_worker_locked(const std::string& addr);

  // Under mu_: a failure before the ASK was sent (nobody can write into the blocks).
  void fail_unasked(const std::string& request_id, const Status& status);
  // Under mu_: reports the fetch (event, metrics, timings) and erases it.
  void finish_locked(Outbox& out, FetchMap::iterator it, Status status, TransferResult result,
                     double transfer_s = 0);
  // Under mu_: sends CANCEL and waits (cancel_grace) for the peer to let go.
  void begin_cancel_locked(Fetch& f, Status pending, TransferResult result);
  Status timed_out(const Fetch& f, const std::string& where) const;

  const ConnectorContext* ctx_;

  mutable std::mutex mu_;
  bool is_stopping_ = false;                                // GUARDED_BY(mu_)
  FetchMap fetches_;                                        // GUARDED_BY(mu_)
  std::map<std::string, std::string> request_of_transfer_;  // GUARDED_BY(mu_)
  std::map<std::string, std::string> resolved_;             // url\nengine -> addr; GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<ControlChannel>> channels_;  // by addr; GUARDED_BY(mu_)
  // Every channel not yet closed, by id, with its worker address: the owner of last resort, so
  // that a channel is never destroyed on its own thread (closed ones move to closed_channels_).
  struct LiveChannel {
    std::string addr;
    std::shared_ptr<ControlChannel> channel;
  };
  std::map<uint64_t, LiveChannel> live_channels_;  // GUARDED_BY(mu_)
  std::set<std::string> connecting_;               // addrs being connected; GUARDED_BY(mu_)
  std::set<std::string> resolving_;                // url\nengine being looked up; GUARDED_BY(mu_)
  std::condition_variable connected_cv_;           // a connect attempt or a lookup ended
  std::vector<std::shared_ptr<ControlChannel>> closed_channels_;  // GUARDED_BY(mu_)
};

}  // namespace crescent::disagg
