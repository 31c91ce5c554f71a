#include "disagg/prefill_side.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "core/logging.h"
#include "disagg/block_copies.h"

namespace crescent::disagg {
namespace {

using protocol::MessageType;

constexpr size_t kMaxConnections = 1024;
// How long HELLO may take to open the decode engine's transfer segment.
constexpr std::chrono::milliseconds kMaxOpenSegment{10'000};

engine::KvConnectorEvent released(const std::string& request_id) {
  engine::KvConnectorEvent e;
  e.kind = engine::KvConnectorEvent::Kind::kBlocksReleased;
  e.request_id = request_id;
  return e;
}

}  // namespace

PrefillSide::PrefillSide(const ConnectorContext* ctx)
    : ctx_(ctx), wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  CRESCENT_CHECK(wake_fd_.is_valid()) << "eventfd failed";
}

PrefillSide::~PrefillSide() {
  close_connections();
  release_all();
}

Status PrefillSide::start_listening() {
  const DisaggOptions& o = *ctx_->options;
  ASSIGN_OR_RETURN(listener_, net::listen_tcp(o.listen_host, o.listen_port));
  ASSIGN_OR_RETURN(int port, net::local_port(listener_));
  worker_addr_ = "tcp://" + o.listen_host + ":" + std::to_string(port);
  accept_thread_ = std::thread([this] { accept_loop(); });
  return Status::ok();
}

std::string PrefillSide::worker_addr() const {
  return worker_addr_;
}

void PrefillSide::accept_loop() {
  for (;;) {
    auto fd = net::accept_with_deadline(listener_, Deadline::after_ms(1000), wake_fd_.get());
    if (!fd.is_ok()) {
      if (fd.status().code() == StatusCode::kDeadlineExceeded)
        continue;
      if (fd.status().code() != StatusCode::kCancelled) {
        CRESCENT_LOG(kWarn) << "kv connector: accept failed: " << fd.status().to_string();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (is_stopping_)
        return;
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (is_stopping_)
      return;
    if (peers_.size() >= kMaxConnections) {
      CRESCENT_LOG(kWarn) << "kv connector: refusing a control connection: " << kMaxConnections
                          << " already open";
      continue;
    }
    ControlChannel::Options co;
    co.peer_name = "decode engine (control connection)";
    co.heartbeat_interval = ctx_->options->heartbeat_interval;
    co.sends_heartbeats = false;
    co.close_grace = ctx_->options->cancel_grace;
    co.io_timeout = 3 * ctx_->options->heartbeat_interval;
    co.auth_token = ctx_->options->auth_token;
    auto peer = std::make_shared<DecodePeer>();
    // Built under mu_, so the handlers (which take mu_) find the peer registered.
    peer->channel = std::make_shared<ControlChannel>(
        std::move(*fd), co,
        [this](ControlChannel& ch, net::Frame f) { on_frame(ch, std::move(f)); },
        [this](ControlChannel& ch, const Status& why) { on_closed(ch, why); });
    peers_[peer->channel->id()] = peer;
  }
}

std::shared_ptr<PrefillSide::DecodePeer> PrefillSide::find_peer_locked(uint64_t channel_id) const {
  auto it = peers_.find(channel_id);
  return it == peers_.end() ? nullptr : it->second;
}

void PrefillSide::on_frame(ControlChannel& channel, net::Frame frame) {
  std::shared_ptr<DecodePeer> peer;
  bool has_hello = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer = find_peer_locked(channel.id());
    if (peer)
      has_hello = peer->has_hello;
  }
  if (!peer)
    return;
  auto type = static_cast<MessageType>(frame.type);
  if (type == MessageType::kHello) {
    if (has_hello) {
      drop(peer, failed_precondition("second HELLO on one control connection"));
      return;
    }
    handle_hello(peer, frame.payload);
    return;
  }
  if (!has_hello) {
    drop(peer, failed_precondition(protocol::message_type_name(frame.type) +
                                   " before HELLO on a control connection"));
    return;
  }
  switch (type) {
    case MessageType::kAsk:
      handle_ask(peer, frame.payload);
      return;
    case MessageType::kNotNeeded:
      handle_not_needed(peer, frame.payload);
      return;
    case MessageType::kCancel:
      handle_cancel(peer, frame.payload);
      return;
    case MessageType::kHeartbeat:
      if (!frame.payload.empty()) {
        drop(peer, data_loss("HEARTBEAT with a payload"));
        return;
      }
      channel.send(MessageType::kHeartbeatAck, "");
      return;
    default:
      drop(peer, data_loss("unexpected " + protocol::message_type_name(frame.type) +
                           " from a decode engine"));
      return;
  }
}

void PrefillSide::handle_hello(const std::shared_ptr<DecodePeer>& peer,
                               const std::string& payload) {
  ControlChannel& ch = *peer->channel;
  auto refuse = [&](protocol::RefusalKind kind, const std::string& message) {
    CRESCENT_LOG(kWarn) << "kv connector: refused a decode engine: " << message;
    ch.send(MessageType::kRefused, protocol::encode(protocol::Refused{kind, message}));
    ch.close(failed_precondition("refused: " + message));
  };
  auto hello = protocol::decode_hello(payload);
  if (!hello.is_ok()) {
    refuse(protocol::RefusalKind::kProtocol, hello.status().message());
    return;
  }
  const DisaggOptions& o = *ctx_->options;
  // Phrased from the decode engine's side ("here" = the decode engine), which reports it.
  std::string diff = describe_first_difference(hello->compat, o.compat);
  if (!diff.empty()) {
    refuse(protocol::RefusalKind::kCompatibility, diff);
    return;
  }
  if (hello->block_bytes != ctx_->block_bytes()) {
    refuse(protocol::RefusalKind::kCompatibility,
           "block_bytes: " + std::to_string(hello->block_bytes) + " here, " +
               std::to_string(ctx_->block_bytes()) + " at the peer");
    return;
  }
  auto segment = transfer::SegmentDescriptor::parse(hello->segment_descriptor);
  if (!segment.is_ok()) {
    refuse(protocol::RefusalKind::kProtocol,
           "bad transfer segment descriptor: " + segment.status().message());
    return;
  }
  if (segment->transport != ctx_->transfer->transport()) {
    refuse(protocol::RefusalKind::kCompatibility,
           "transport: " + std::string(transfer::transport_name(segment->transport)) + " here, " +
               std::string(transfer::transport_name(ctx_->transfer->transport())) + " at the peer");
    return;
  }
  const transfer::RegionInfo* region = nullptr;
  for (const auto& r : segment->regions) {
    if (r.id.value() == hello->region_id)
      region = &r;
  }
  uint64_t needed = hello->block_bytes * hello->num_blocks;
  if (region == nullptr || needed / hello->num_blocks != hello->block_bytes ||
      region->length < needed) {
    refuse(protocol::RefusalKind::kProtocol, "the transfer segment lacks a region of " +
                                                 std::to_string(hello->num_blocks) + " blocks of " +
                                                 std::to_string(hello->block_bytes) + " bytes");
    return;
  }
  {
    std::lock_guard<std::mutex> lock(peer->segment_mu);
    peer->segment = *segment;
    peer->region = region->id;
  }
  auto opened = open_segment(*peer, Deadline::after(std::min(o.transfer_timeout, kMaxOpenSegment)));
  if (!opened.is_ok()) {
    refuse(protocol::RefusalKind::kOther,
           "cannot open the decode engine's transfer segment: " + opened.status().message());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    peer->has_hello = true;
    peer->engine_id = hello->engine_id;
    peer->num_blocks = hello->num_blocks;
  }
  ch.set_heartbeat_interval(std::chrono::milliseconds(hello->heartbeat_interval_ms));
  ch.send(MessageType::kHelloOk,
          protocol::encode(protocol::HelloOk{protocol::kProtocolVersion, o.engine_id}));
  CRESCENT_LOG(kInfo) << "kv connector: decode engine " << hello->engine_id << " connected";
}

Result<transfer::PeerId> PrefillSide::open_segment(DecodePeer& peer, Deadline deadline) {
  std::lock_guard<std::mutex> lock(peer.segment_mu);
  if (peer.is_closed)
    return cancelled("the decode engine's control connection is closed");
  if (peer.peer.has_value() && !peer.needs_reopen)
    return *peer.peer;
  if (peer.peer.has_value()) {
    (void)ctx_->transfer->close_segment(*peer.peer);
    peer.peer.reset();
  }
  ASSIGN_OR_RETURN(transfer::PeerId id, ctx_->transfer->open_segment(peer.segment, deadline));
  peer.peer = id;
  peer.needs_reopen = false;
  return id;
}

void PrefillSide::close_segment(DecodePeer& peer) {
  std::lock_guard<std::mutex> lock(peer.segment_mu);
  peer.is_closed = true;
  if (peer.peer.has_value()) {
    // Fails the peer's unfinished batches and joins the link's threads: no byte moves into the
    // decode engine's memory afterwards.
    (void)ctx_->transfer->close_segment(*peer.peer);
    peer.peer.reset();
  }
}

void PrefillSide::drop(const std::shared_ptr<DecodePeer>& peer, const Status& reason) {
  CRESCENT_LOG(kWarn) << "kv connector: closing a decode engine's control connection: "
                      << reason.to_string();
  close_segment(*peer);
  peer->channel->abort(reason);
}

void PrefillSide::send_done_locked(uint64_t channel_id, const std::string& transfer_id,
                                   const Status& s, uint64_t num_bytes, uint64_t write_ns) {
  auto peer = find_peer_locked(channel_id);
  if (!peer)
    return;
  peer->channel->send(MessageType::kDone,
                      protocol::encode(protocol::Done{transfer_id, s, num_bytes, write_ns}));
}

void PrefillSide::handle_ask(const std::shared_ptr<DecodePeer>& peer, const std::string& payload) {
  auto ask = protocol::decode_ask(payload);
  if (!ask.is_ok()) {
    drop(peer, ask.status());
    return;
  }
  uint32_t n = protocol::num_blocks_to_send(ask->num_prompt_tokens, ctx_->block_size());
  if (uint64_t{ask->first_block} + ask->block_ids.size() != n) {
    drop(peer, invalid_argument("ASK " + ask->transfer_id + ": blocks [" +
                                std::to_string(ask->first_block) + ", +" +
                                std::to_string(ask->block_ids.size()) + ") do not end at block " +
                                std::to_string(n) + " of a " +
                                std::to_string(ask->num_prompt_tokens) + "-token prompt"));
    return;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t id : ask->block_ids) {
    if (static_cast<uint32_t>(id) >= peer->num_blocks) {
      send_done_locked(
          peer->channel->id(), ask->transfer_id,
          out_of_range("ASK: block " + std::to_string(id) + " is outside the decode engine's " +
                       std::to_string(peer->num_blocks) + " blocks"),
          0, 0);
      return;
    }
  }
  if (is_stopping_) {
    send_done_locked(peer->channel->id(), ask->transfer_id,
                     unavailable("the prefill engine's KV connector is shutting down"), 0, 0);
    return;
  }
  std::string transfer_id = ask->transfer_id;
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) {
    Outgoing t;
    t.phase = Phase::kAsked;
    t.deadline = Deadline::after(ctx_->options->transfer_timeout);
    t.start = Clock::now();
    t.channel_id = peer->channel->id();
    t.ask = std::move(*ask);
    transfers_.emplace(transfer_id, std::move(t));
    ctx_->metrics->add_in_flight(TransferRole::kPrefill, 1);
    return;
  }
  Outgoing& t = it->second;
  switch (t.phase) {
    case Phase::kHeld:
      t.channel_id = peer->channel->id();
      t.ask = std::move(*ask);
      start_write_locked(out, it);
      return;
    case Phase::kNotNeeded:
      send_done_locked(
          peer->channel->id(), transfer_id,
          failed_precondition("transfer_id " + transfer_id + " was already declared not needed"), 0,
          0);
      return;
    case Phase::kFailed:
      send_done_locked(peer->channel->id(), transfer_id, t.failure, 0, 0);
      transfers_.erase(it);
      return;
    case Phase::kAsked:
    case Phase::kWriting:
      send_done_locked(peer->channel->id(), transfer_id,
                       already_exists("duplicate transfer_id " + transfer_id), 0, 0);
      return;
  }
}

bool PrefillSide::start_write_locked(Outbox& out, OutgoingMap::iterator it) {
  const std::string& transfer_id = it->first;
  Outgoing& t = it->second;
  Status mismatch;
  if (t.ask.num_prompt_tokens != t.num_prompt_tokens || t.ask.prompt_hash != t.prompt_hash) {
    mismatch = failed_precondition(
        "prompt differs for transfer_id " + transfer_id + ": the decode engine has " +
        std::to_string(t.ask.num_prompt_tokens) + " tokens, the prefill engine " +
        std::to_string(t.num_prompt_tokens) +
        (t.ask.num_prompt_tokens == t.num_prompt_tokens ? " (different token ids)" : ""));
  } else if (t.block_ids.size() < t.ask.first_block + t.ask.block_ids.size()) {
    mismatch =
        internal_error("the prefill engine holds " + std::to_string(t.block_ids.size()) +
                       " blocks for a " + std::to_string(t.num_prompt_tokens) + "-token prompt");
  }
  if (!mismatch.is_ok()) {
    CRESCENT_LOG(kWarn) << "kv connector: " << mismatch.message();
    send_done_locked(t.channel_id, transfer_id, mismatch, 0, 0);
    finish_locked(out, it, TransferResult::kError);
    return false;
  }
  t.phase = Phase::kWriting;
  if (!ctx_->work->post([this, transfer_id] { run_write(transfer_id); })) {
    send_done_locked(t.channel_id, transfer_id,
                     unavailable("the prefill engine's KV connector is shutting down"), 0, 0);
    finish_locked(out, it, TransferResult::kCancelled);
    return false;
  }
  return true;
}

void PrefillSide::add_not_needed_locked(const std::string& transfer_id, uint64_t channel_id) {
  Outgoing t;
  t.phase = Phase::kNotNeeded;
  t.deadline = Deadline::after(ctx_->options->transfer_timeout);
  t.start = Clock::now();
  t.channel_id = channel_id;
  transfers_.emplace(transfer_id, std::move(t));
}

void PrefillSide::finish_locked(Outbox& out, OutgoingMap::iterator it, TransferResult result) {
  Outgoing& t = it->second;
  if (t.phase != Phase::kNotNeeded && t.phase != Phase::kFailed) {
    ctx_->metrics->add_in_flight(TransferRole::kPrefill, -1);
    ctx_->metrics->count_result(TransferRole::kPrefill, result);
  }
  if (!t.request_id.empty()) {
    out.add(released(t.request_id));
    transfer_of_request_.erase(t.request_id);
  }
  transfers_.erase(it);
}

void PrefillSide::run_write(const std::string& transfer_id) {
  std::shared_ptr<DecodePeer> peer;
  Outgoing snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(transfer_id);
    if (it == transfers_.end() || it->second.phase != Phase::kWriting)
      return;
    snapshot = it->second;
    peer = find_peer_locked(snapshot.channel_id);
  }
  TimePoint t0 = Clock::now();
  uint64_t num_bytes = 0;
  Status s = peer ? write_blocks(*peer, transfer_id, snapshot, &num_bytes)
                  : cancelled("the decode engine's control connection closed");
  auto write_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(transfer_id);
  CRESCENT_CHECK(it != transfers_.end()) << "a writing transfer vanished: " << transfer_id;
  Outgoing& t = it->second;
  bool is_connected = find_peer_locked(t.channel_id) != nullptr;
  TransferResult result;
  if (t.is_cancel_requested) {
    // The write is over (or failed and stopped): now the decode engine may reuse its blocks.
    if (is_connected) {
      find_peer_locked(t.channel_id)
          ->channel->send(MessageType::kCancelAck,
                          protocol::encode(protocol::TransferRef{transfer_id}));
    }
    result = TransferResult::kCancelled;
  } else if (!is_connected) {
    result = TransferResult::kPeerLost;
  } else {
    send_done_locked(t.channel_id, transfer_id, s, s.is_ok() ? num_bytes : 0, write_ns);
    result = s.is_ok() ? TransferResult::kOk : TransferResult::kError;
  }
  if (s.is_ok()) {
    ctx_->metrics->observe_write(TransferRole::kPrefill, static_cast<double>(write_ns) * 1e-9);
    ctx_->metrics->add_bytes(TransferRole::kPrefill, num_bytes);
  } else if (is_connected) {
    CRESCENT_LOG(kWarn) << "kv connector: write of transfer_id " << transfer_id
                        << " failed: " << s.to_string();
  }
  finish_locked(out, it, result);
}

Status PrefillSide::write_blocks(DecodePeer& peer, const std::string& transfer_id,
                                 const Outgoing& t, uint64_t* num_bytes) {
  Deadline deadline = Deadline::after(ctx_->options->transfer_timeout);
  const KvMemory& mem = ctx_->options->memory;
  std::span<const int32_t> src(t.block_ids.data() + t.ask.first_block, t.ask.block_ids.size());
  for (int32_t b : src) {
    if (b < 0 || b >= mem.num_blocks) {
      return internal_error("prefill block id " + std::to_string(b) + " is outside this engine's " +
                            std::to_string(mem.num_blocks) + " blocks");
    }
  }
  ASSIGN_OR_RETURN(transfer::PeerId peer_id, open_segment(peer, deadline));
  transfer::RegionId region;
  {
    std::lock_guard<std::mutex> lock(peer.segment_mu);
    region = peer.region;
  }
  std::vector<transfer::TransferOp> ops;
  uint64_t total = 0;
  for (const BlockCopy& c : coalesce_block_copies(src, t.ask.block_ids)) {
    transfer::TransferOp op;
    op.kind = transfer::OpKind::kWrite;
    op.local_addr = mem.base + static_cast<uint64_t>(c.src_block) * mem.block_bytes;
    op.remote_region = region;
    op.remote_offset = static_cast<uint64_t>(c.dst_block) * mem.block_bytes;
    op.length = static_cast<uint64_t>(c.num_blocks) * mem.block_bytes;
    total += op.length;
    ops.push_back(op);
  }
  auto batch = ctx_->transfer->submit(peer_id, ops, deadline);
  if (!batch.is_ok()) {
    std::lock_guard<std::mutex> lock(peer.segment_mu);
    peer.needs_reopen = true;
    return batch.status();
  }
  if (ctx_->options->on_write_submitted)
    ctx_->options->on_write_submitted(transfer_id);
  Status s = ctx_->transfer->wait(*batch, deadline);
  ctx_->transfer->release(*batch);
  if (!s.is_ok()) {
    // A failed or expired batch breaks its link; the next write reopens the segment.
    std::lock_guard<std::mutex> lock(peer.segment_mu);
    peer.needs_reopen = true;
    return s;
  }
  *num_bytes = total;
  return Status::ok();
}

void PrefillSide::handle_not_needed(const std::shared_ptr<DecodePeer>& peer,
                                    const std::string& payload) {
  auto ref = protocol::decode_transfer_ref(payload, "NOT_NEEDED");
  if (!ref.is_ok()) {
    drop(peer, ref.status());
    return;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(ref->transfer_id);
  if (it == transfers_.end()) {
    ctx_->metrics->count_result(TransferRole::kPrefill, TransferResult::kNotNeeded);
    add_not_needed_locked(ref->transfer_id, peer->channel->id());
    return;
  }
  if (it->second.phase == Phase::kHeld)
    finish_locked(out, it, TransferResult::kNotNeeded);
  else if (it->second.phase == Phase::kFailed)
    transfers_.erase(it);
  // ASKed or writing: the decode engine uses CANCEL for those; NOT_NEEDED changes nothing.
}

void PrefillSide::handle_cancel(const std::shared_ptr<DecodePeer>& peer,
                                const std::string& payload) {
  auto ref = protocol::decode_transfer_ref(payload, "CANCEL");
  if (!ref.is_ok()) {
    drop(peer, ref.status());
    return;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(ref->transfer_id);
  if (it != transfers_.end() && it->second.channel_id == peer->channel->id()) {
    if (it->second.phase == Phase::kWriting) {
      it->second.is_cancel_requested = true;  // run_write acks once the write is over
      return;
    }
    if (it->second.phase == Phase::kAsked) {
      finish_locked(out, it, TransferResult::kCancelled);
      // The prefill request may still come (the proxy sent it): the tombstone makes hold()
      // refuse it, so its blocks are freed at once instead of held until the deadline.
      add_not_needed_locked(ref->transfer_id, peer->channel->id());
    }
  }
  // Nothing of this connection will write transfer_id any more.
  peer->channel->send(MessageType::kCancelAck,
                      protocol::encode(protocol::TransferRef{ref->transfer_id}));
}

bool PrefillSide::hold(const std::string& request_id, const engine::KvTransferParams& params,
                       std::span<const int32_t> prompt_token_ids,
                       std::span<const int32_t> block_ids) {
  Status valid = protocol::validate_id(params.transfer_id, "kv_transfer_params.transfer_id");
  if (!valid.is_ok()) {
    CRESCENT_LOG(kWarn) << "kv connector: request " << request_id
                        << " not held for remote decode: " << valid.message();
    return false;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  if (is_stopping_)
    return false;
  const std::string& transfer_id = params.transfer_id;
  if (transfer_of_request_.count(request_id) != 0) {
    CRESCENT_LOG(kError) << "kv connector: request " << request_id << " held twice";
    return false;
  }
  auto fill = [&](Outgoing& t) {
    t.request_id = request_id;
    t.num_prompt_tokens = static_cast<uint32_t>(prompt_token_ids.size());
    t.prompt_hash = protocol::hash_prompt(prompt_token_ids);
    t.block_ids.assign(block_ids.begin(), block_ids.end());
  };
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end())
    return hold_locked(request_id, transfer_id, prompt_token_ids, block_ids);
  switch (it->second.phase) {
    case Phase::kAsked:
      fill(it->second);
      transfer_of_request_[request_id] = transfer_id;
      // Even when the prompt differs, the blocks are released by the kBlocksReleased event
      // that start_write_locked queued.
      start_write_locked(out, it);
      return true;
    case Phase::kNotNeeded:
      transfers_.erase(it);
      return false;
    case Phase::kFailed:
      // Another request of this transfer_id failed; this one stands alone.
      transfers_.erase(it);
      return hold_locked(request_id, transfer_id, prompt_token_ids, block_ids);
    case Phase::kHeld:
    case Phase::kWriting:
      CRESCENT_LOG(kWarn) << "kv connector: duplicate transfer_id " << transfer_id << ": request "
                          << request_id << " not held (request " << it->second.request_id
                          << " holds it)";
      return false;
  }
  return false;
}

bool PrefillSide::hold_locked(const std::string& request_id, const std::string& transfer_id,
                              std::span<const int32_t> prompt_token_ids,
                              std::span<const int32_t> block_ids) {
  Outgoing t;
  t.phase = Phase::kHeld;
  t.deadline = Deadline::after(ctx_->options->transfer_timeout);
  t.start = Clock::now();
  t.request_id = request_id;
  t.num_prompt_tokens = static_cast<uint32_t>(prompt_token_ids.size());
  t.prompt_hash = protocol::hash_prompt(prompt_token_ids);
  t.block_ids.assign(block_ids.begin(), block_ids.end());
  transfers_.emplace(transfer_id, std::move(t));
  transfer_of_request_[request_id] = transfer_id;
  ctx_->metrics->add_in_flight(TransferRole::kPrefill, 1);
  return true;
}

void PrefillSide::fail(const std::string& transfer_id, const Status& why) {
  if (!protocol::validate_id(transfer_id, "transfer_id").is_ok())
    return;
  Status failure = Status(why.is_ok() ? StatusCode::kInternal : why.code(),
                          "prefill request for transfer_id " + transfer_id +
                              " failed: " + (why.is_ok() ? "unknown reason" : why.message()));
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) {
    ctx_->metrics->count_result(TransferRole::kPrefill, TransferResult::kError);
    Outgoing t;
    t.phase = Phase::kFailed;
    t.deadline = Deadline::after(ctx_->options->transfer_timeout);
    t.start = Clock::now();
    t.failure = std::move(failure);
    transfers_.emplace(transfer_id, std::move(t));
    return;
  }
  if (it->second.phase == Phase::kAsked) {
    send_done_locked(it->second.channel_id, transfer_id, failure, 0, 0);
    finish_locked(out, it, TransferResult::kError);
  } else if (it->second.phase == Phase::kNotNeeded) {
    transfers_.erase(it);
  }
  // Held or writing: that belongs to another request of the same transfer_id.
}

bool PrefillSide::cancel(const std::string& request_id) {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto r = transfer_of_request_.find(request_id);
  if (r == transfer_of_request_.end())
    return false;
  auto it = transfers_.find(r->second);
  CRESCENT_CHECK(it != transfers_.end()) << "held request without a transfer: " << request_id;
  // A write in progress finishes (or fails) on its own and then releases the blocks.
  if (it->second.phase == Phase::kHeld)
    finish_locked(out, it, TransferResult::kCancelled);
  return true;
}

void PrefillSide::tick() {
  std::vector<std::shared_ptr<ControlChannel>> finished;
  {
    Outbox out(ctx_->events);
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = transfers_.begin(); it != transfers_.end();) {
      auto next = std::next(it);
      Outgoing& t = it->second;
      if (t.deadline.is_expired()) {
        std::string timeout = seconds_text(ctx_->options->transfer_timeout);
        switch (t.phase) {
          case Phase::kAsked:
            send_done_locked(t.channel_id, it->first,
                             deadline_exceeded("prefill request for transfer_id " + it->first +
                                               " never arrived within " + timeout),
                             0, 0);
            finish_locked(out, it, TransferResult::kExpired);
            break;
          case Phase::kHeld:
            CRESCENT_LOG(kWarn) << "kv connector: decode engine never asked for transfer_id "
                                << it->first << " within " << timeout
                                << "; releasing the blocks of request " << t.request_id;
            finish_locked(out, it, TransferResult::kExpired);
            break;
          case Phase::kNotNeeded:
          case Phase::kFailed:
            transfers_.erase(it);
            break;
          case Phase::kWriting:
            break;  // the write has its own deadline
        }
      }
      it = next;
    }
    for (auto it = closed_channels_.begin(); it != closed_channels_.end();) {
      if ((*it)->is_finished()) {
        finished.push_back(std::move(*it));
        it = closed_channels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& ch : finished) {
    ch->join();
  }
}

int PrefillSide::num_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(transfer_of_request_.size());
}

void PrefillSide::on_closed(ControlChannel& channel, const Status& reason) {
  std::shared_ptr<DecodePeer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(channel.id());
    if (it == peers_.end())
      return;
    peer = std::move(it->second);
    peers_.erase(it);
    closed_channels_.push_back(peer->channel);
  }
  // Before this channel's socket is shut: the decode engine treats our EOF as "P stopped".
  close_segment(*peer);
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  if (!peer->has_hello) {
    return;  // refused or broken before HELLO: it never asked for anything
  }
  release_for_lost_peer_locked(out, *peer, reason);
}

void PrefillSide::release_for_lost_peer_locked(Outbox& out, const DecodePeer& peer,
                                               const Status& reason) {
  const uint64_t channel_id = peer.channel->id();
  // HELD entries name no decode engine until its ASK arrives. When no decode engine is left
  // connected, nobody can ask for them soon: a decode engine asks right after it got its half,
  // over a connection it keeps open, so the ones still to come were the dead engine's. With
  // other decode engines connected they stay until the deadline (they may be theirs).
  bool has_other_decode = false;
  for (const auto& [id, p] : peers_) {
    has_other_decode = has_other_decode || p->has_hello;
  }
  const Status lost = unavailable("decode engine " + peer.engine_id +
                                  " is gone (control connection: " + reason.message() + ")");
  int num_asked = 0;
  int num_held = 0;
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    auto next = std::next(it);
    Outgoing& t = it->second;
    std::string transfer_id = it->first;
    if (t.phase == Phase::kAsked && t.channel_id == channel_id) {
      // The prefill request may still come (the proxy sent it): the tombstone makes hold()
      // refuse it, so its blocks are freed when its prefill ends instead of at the deadline.
      finish_locked(out, it, TransferResult::kPeerLost);
      add_not_needed_locked(transfer_id, channel_id);
      ++num_asked;
    } else if (t.phase == Phase::kHeld && !has_other_decode) {
      finish_locked(out, it, TransferResult::kPeerLost);
      // A late ASK (from an engine that connects later) is answered at once, naming why.
      Outgoing failed;
      failed.phase = Phase::kFailed;
      failed.deadline = Deadline::after(ctx_->options->transfer_timeout);
      failed.start = Clock::now();
      failed.failure = unavailable("the prefill engine freed the KV of transfer_id " + transfer_id +
                                   ": " + lost.message());
      transfers_.emplace(transfer_id, std::move(failed));
      ++num_held;
    }
    it = next;
  }
  if (num_asked + num_held > 0) {
    CRESCENT_LOG(kWarn) << "kv connector: " << lost.message() << "; freed the blocks of "
                        << num_held << " held request(s) and dropped " << num_asked
                        << " waiting ask(s) at once";
  } else {
    CRESCENT_LOG(kInfo) << "kv connector: decode engine " << peer.engine_id
                        << " disconnected: " << reason.message();
  }
}

void PrefillSide::close_connections() {
  std::vector<std::shared_ptr<DecodePeer>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
    for (auto& [id, p] : peers_) {
      peers.push_back(p);
    }
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
  if (accept_thread_.joinable())
    accept_thread_.join();
  listener_.reset();
  for (auto& p : peers) {
    drop(p, cancelled("the prefill engine's KV connector shut down"));
  }
  std::vector<std::shared_ptr<ControlChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& p : peers) {
      channels.push_back(p->channel);
    }
    for (auto& c : closed_channels_) {
      channels.push_back(c);
    }
    closed_channels_.clear();
  }
  for (auto& c : channels) {
    c->join();
  }
}

void PrefillSide::release_all() {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  while (!transfers_.empty()) {
    auto it = transfers_.begin();
    finish_locked(out, it, TransferResult::kCancelled);
  }
}

}  // namespace crescent::disagg
