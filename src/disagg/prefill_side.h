#pragma once
// PrefillSide: the prefill half of the connector. Listens for decode engines' control
// connections; pairs each decode engine's ASK with the engine's hold_for_remote_decode() by
// transfer_id (whichever comes first waits, with a deadline); writes the blocks into the decode
// engine's memory on a WorkQueue thread and answers DONE. State machine: docs/disagg.md.
// Thread-safety: every method may be called from any thread; hold() and cancel() never block.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "disagg/connector_context.h"
#include "disagg/control_channel.h"
#include "disagg/protocol.h"
#include "net/socket.h"

namespace crescent::disagg {

class PrefillSide {
 public:
  explicit PrefillSide(const ConnectorContext* ctx);
  ~PrefillSide();
  PrefillSide(const PrefillSide&) = delete;
  PrefillSide& operator=(const PrefillSide&) = delete;

  // Binds the control listener and starts accepting.
  Status start_listening();
  std::string worker_addr() const;

  bool hold(const std::string& request_id, const engine::KvTransferParams& params,
            std::span<const int32_t> prompt_token_ids, std::span<const int32_t> block_ids);
  // True when request_id was one of this side's held requests.
  bool cancel(const std::string& request_id);
  // The engine's request carrying transfer_id failed before hold(): a waiting or later ASK is
  // answered with DONE `why` at once instead of at the deadline.
  void fail(const std::string& transfer_id, const Status& why);
  // Housekeeping: deadlines of placeholders, held blocks and tombstones; joins dead channels.
  void tick();
  int num_pending() const;

  // Stops accepting, stops every write (closes the decode engines' segments), closes every
  // connection and joins their threads. Write jobs still queued fail fast afterwards.
  void close_connections();
  // After the work queue stopped: releases whatever is still held (kBlocksReleased).
  void release_all();

 private:
  // One decode engine's control connection.
  struct DecodePeer {
    std::shared_ptr<ControlChannel> channel;
    bool has_hello = false;   // GUARDED_BY(PrefillSide::mu_)
    std::string engine_id;    // GUARDED_BY(PrefillSide::mu_)
    uint32_t num_blocks = 0;  // GUARDED_BY(PrefillSide::mu_)

    std::mutex segment_mu;                 // the decode engine's transfer segment, opened on HELLO
    transfer::SegmentDescriptor segment;   // GUARDED_BY(segment_mu)
    transfer::RegionId region;             // GUARDED_BY(segment_mu)
    std::optional<transfer::PeerId> peer;  // GUARDED_BY(segment_mu)
    bool is_closed = false;                // GUARDED_BY(segment_mu): no more writes
    bool needs_reopen = false;             // GUARDED_BY(segment_mu): the link broke
  };

  enum class Phase {
    kAsked,      // ASK arrived, the engine has not held the request yet (placeholder)
    kHeld,       // the engine holds the blocks, no ASK yet
    kWriting,    // both: a write job owns it
    kNotNeeded,  // NOT_NEEDED arrived first (tombstone): hold() will return false
    kFailed,     // the engine's request failed before hold (tombstone): an ASK gets `failure`
  };
  struct Outgoing {
    Phase phase = Phase::kAsked;
    Deadline deadline = Deadline::never();
    TimePoint start;
    // From hold():
    std::string request_id;
    uint32_t num_prompt_tokens = 0;
    uint64_t prompt_hash = 0;
    std::vector<int32_t> block_ids;
    // From ASK (or NOT_NEEDED):
    uint64_t channel_id = 0;
    protocol::Ask ask;
    bool is_cancel_requested = false;  // CANCEL during the write: ack after it
    Status failure;                    // kFailed
  };
  using OutgoingMap = std::map<std::string, Outgoing>;

  void accept_loop();
  void on_frame(ControlChannel& channel, net::Frame frame);
  void on_closed(ControlChannel& channel, const Status& reason);
  void handle_hello(const std::shared_ptr<DecodePeer>& peer, const std::string& payload);
  void handle_ask(const std::shared_ptr<DecodePeer>& peer, const std::string& payload);
  void handle_not_needed(const std::shared_ptr<DecodePeer>& peer, const std::string& payload);
  void handle_cancel(const std::shared_ptr<DecodePeer>& peer, const std::string& payload);
  // Stops writes into the peer's memory, then aborts its connection. Never under mu_.
  void drop(const std::shared_ptr<DecodePeer>& peer, const Status& reason);
  void close_segment(DecodePeer& peer);
  Result<transfer::PeerId> open_segment(DecodePeer& peer, Deadline deadline);

  // Under mu_: both halves are present; verify the prompt, then queue the write. False when
  // the prompt differs (the entry is erased and the asker told).
  bool start_write_locked(Outbox& out, OutgoingMap::iterator it);
  // Under mu_: a new HELD entry. Returns true.
  bool hold_locked(const std::string& request_id, const std::string& transfer_id,
                   std::span<const int32_t> prompt_token_ids, std::span<const int32_t> block_ids);
  void run_write(const std::string& transfer_id);
  Status write_blocks(DecodePeer& peer, const std::string& transfer_id, const Outgoing& t,
                      uint64_t* num_bytes);
  // Under mu_: a NOT_NEEDED tombstone for transfer_id (no entry may exist): a later hold() of
  // it returns false, until the deadline.
  void add_not_needed_locked(const std::string& transfer_id, uint64_t channel_id);
  // Under mu_: erases a transfer; releases its blocks if the engine held them.
  void finish_locked(Outbox& out, OutgoingMap::iterator it, TransferResult result);
  // Under mu_, after `peer` (which had sent HELLO) left peers_: frees at once what was kept for
  // it (kPeerLost) instead of at the deadline: its ASKs still waiting for the engine's hold
  // (tombstoned, so the hold is refused), and every HELD entry when no decode engine is left.
  void release_for_lost_peer_locked(Outbox& out, const DecodePeer& peer, const Status& reason);
  void send_done_locked(uint64_t channel_id, const std::string& transfer_id, const Status& s,
                        uint64_t num_bytes, uint64_t write_ns);
  std::shared_ptr<DecodePeer> find_peer_locked(uint64_t channel_id) const;

  const ConnectorContext* ctx_;
  net::Fd listener_;
  net::Fd wake_fd_;
  std::string worker_addr_;
  std::thread accept_thread_;

  mutable std::mutex mu_;
  bool is_stopping_ = false;                                      // GUARDED_BY(mu_)
  std::map<uint64_t, std::shared_ptr<DecodePeer>> peers_;         // GUARDED_BY(mu_)
  OutgoingMap transfers_;                                         // GUARDED_BY(mu_)
  std::map<std::string, std::string> transfer_of_request_;        // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<ControlChannel>> closed_channels_;  // GUARDED_BY(mu_)
};

}  // namespace crescent::disagg
