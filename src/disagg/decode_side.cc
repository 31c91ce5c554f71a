#include "disagg/decode_side.h"

#include "core/logging.h"
#include "net/auth/handshake.h"

namespace crescent::disagg {
namespace {

using protocol::MessageType;

double seconds_between(TimePoint a, TimePoint b) {
  return std::chrono::duration<double>(b - a).count();
}

engine::KvConnectorEvent kv_ready(const std::string& request_id, Status status) {
  engine::KvConnectorEvent e;
  e.kind = engine::KvConnectorEvent::Kind::kRemoteKvReady;
  e.request_id = request_id;
  e.status = std::move(status);
  return e;
}

// "tcp://HOST:PORT" -> host, port.
Status parse_worker_addr(const std::string& addr, std::string* host, int* port) {
  constexpr std::string_view kScheme = "tcp://";
  if (addr.rfind(kScheme, 0) != 0)
    return invalid_argument("worker address \"" + addr + "\" does not start with tcp://");
  return net::parse_host_port(addr.substr(kScheme.size()), host, port);
}

}  // namespace

DecodeSide::DecodeSide(const ConnectorContext* ctx) : ctx_(ctx) {}

DecodeSide::~DecodeSide() {
  close_connections();
  fail_all();
}

// What is wrong with a start_remote_prefill() call, if anything.
static Status validate_fetch(const DisaggOptions& o, const engine::KvTransferParams& params,
                             std::span<const int32_t> block_ids, int num_local_tokens,
                             uint32_t num_prompt, uint32_t first, uint32_t n) {
  const int block_size = o.compat.block_size;
  RETURN_IF_ERROR(protocol::validate_id(params.transfer_id, "kv_transfer_params.transfer_id"));
  RETURN_IF_ERROR(
      protocol::validate_id(params.remote_engine_id, "kv_transfer_params.remote_engine_id"));
  if (params.remote_bootstrap_addr.empty())
    return invalid_argument("kv_transfer_params.remote_bootstrap_addr is empty");
  if (num_local_tokens < 0 || num_local_tokens % block_size != 0) {
    return invalid_argument("num_local_tokens " + std::to_string(num_local_tokens) +
                            " is not a multiple of the block size " + std::to_string(block_size));
  }
  if (num_prompt > protocol::kMaxPromptTokens)
    return invalid_argument("prompt of " + std::to_string(num_prompt) + " tokens is too long");
  if (first >= n)
    return Status::ok();  // nothing to fetch: the rest concerns fetches only
  if (block_ids.size() < n) {
    return invalid_argument("block table has " + std::to_string(block_ids.size()) +
                            " blocks, the prompt needs " + std::to_string(n));
  }
  if (!o.resolve)
    return failed_precondition("this engine's KV connector has no bootstrap resolver");
  if (n - first > protocol::kMaxBlocksPerAsk) {
    return invalid_argument("prompt needs more than " + std::to_string(protocol::kMaxBlocksPerAsk) +
                            " blocks");
  }
  for (uint32_t i = first; i < n; ++i) {
    if (block_ids[i] < 0 || block_ids[i] >= o.memory.num_blocks) {
      return invalid_argument("block id " + std::to_string(block_ids[i]) +
                              " is outside this engine's " + std::to_string(o.memory.num_blocks) +
                              " blocks");
    }
  }
  return Status::ok();
}

void DecodeSide::start(const std::string& request_id, const engine::KvTransferParams& params,
                       std::span<const int32_t> prompt_token_ids,
                       std::span<const int32_t> block_ids, int num_local_tokens) {
  const DisaggOptions& o = *ctx_->options;
  auto num_prompt = static_cast<uint32_t>(prompt_token_ids.size());
  uint32_t n = protocol::num_blocks_to_send(num_prompt, o.compat.block_size);
  auto first = static_cast<uint32_t>(std::max(0, num_local_tokens) / o.compat.block_size);
  // The engine waits for an event only when something is to be fetched (kv_connector.h).
  bool is_needed = first < n;
  Status invalid = validate_fetch(o, params, block_ids, num_local_tokens, num_prompt, first, n);

  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  if (!is_needed) {
    // The local prefix covers the prompt: tell the prefill engine (best effort) and report
    // nothing, as the engine does not wait for this request.
    if (!invalid.is_ok()) {
      CRESCENT_LOG(kWarn) << "kv connector: NOT_NEEDED for request " << request_id
                          << " not sent: " << invalid.message();
      return;
    }
    ctx_->metrics->count_result(TransferRole::kDecode, TransferResult::kNotNeeded);
    post_not_needed_locked(params);
    return;
  }
  if (fetches_.count(request_id) != 0) {
    // An engine bug; the first fetch of this id still reports.
    CRESCENT_LOG(kError) << "kv connector: start_remote_prefill twice for request " << request_id;
    return;
  }
  auto report_now = [&](Status s) {
    ctx_->metrics->count_result(TransferRole::kDecode, TransferResult::kError);
    FetchTiming timing;
    timing.request_id = request_id;
    timing.transfer_id = params.transfer_id;
    ctx_->metrics->record_fetch(timing);
    out.add(kv_ready(request_id, std::move(s)));
  };
  if (!invalid.is_ok()) {
    report_now(invalid);
    return;
  }
  if (is_stopping_) {
    report_now(unavailable("the decode engine's KV connector is shut down"));
    return;
  }
  auto dup = request_of_transfer_.find(params.transfer_id);
  if (dup != request_of_transfer_.end()) {
    report_now(already_exists("duplicate transfer_id " + params.transfer_id + ": request " +
                              dup->second + " is already fetching it"));
    return;
  }
  Fetch f;
  f.transfer_id = params.transfer_id;
  f.engine_id = params.remote_engine_id;
  f.bootstrap_url = params.remote_bootstrap_addr;
  f.ask.transfer_id = params.transfer_id;
  f.ask.num_prompt_tokens = num_prompt;
  f.ask.prompt_hash = protocol::hash_prompt(prompt_token_ids);
  f.ask.first_block = first;
  f.ask.block_ids.assign(block_ids.begin() + first, block_ids.begin() + n);
  f.expected_bytes = uint64_t{n - first} * ctx_->block_bytes();
  f.start = Clock::now();
  f.deadline = Deadline::after(o.transfer_timeout);
  fetches_.emplace(request_id, std::move(f));
  request_of_transfer_[params.transfer_id] = request_id;
  ctx_->metrics->add_in_flight(TransferRole::kDecode, 1);
  if (!ctx_->work->post([this, request_id] { run_fetch(request_id); })) {
    finish_locked(out, fetches_.find(request_id),
                  unavailable("the decode engine's KV connector is shut down"),
                  TransferResult::kError);
  }
}

Status DecodeSide::timed_out(const Fetch& f, const std::string& where) const {
  return deadline_exceeded("transfer " + f.transfer_id + " timed out after " +
                           seconds_text(ctx_->options->transfer_timeout) + " (" + where + ")");
}

void DecodeSide::run_fetch(const std::string& request_id) {
  std::string url;
  std::string engine_id;
  Deadline deadline = Deadline::never();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fetches_.find(request_id);
    if (it == fetches_.end() || it->second.phase != Phase::kPreparing)
      return;
    url = it->second.bootstrap_url;
    engine_id = it->second.engine_id;
    deadline = it->second.deadline;
  }
  TimePoint t0 = Clock::now();
  auto addr = resolve(url, engine_id, deadline);
  if (!addr.is_ok()) {
    fail_unasked(request_id, addr.status());
    return;
  }
  double bootstrap_s = seconds_between(t0, Clock::now());
  auto channel = channel_to(*addr, engine_id, deadline);
  if (!channel.is_ok()) {
    fail_unasked(request_id, channel.status());
    return;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fetches_.find(request_id);
  if (it == fetches_.end() || it->second.phase != Phase::kPreparing)
    return;  // cancelled or expired meanwhile, and already reported
  Fetch& f = it->second;
  f.bootstrap_s = bootstrap_s;
  // is_open() is false before on_closed runs, and on_closed takes mu_: if the channel is open
  // now, its on_closed will find this fetch.
  if (!(*channel)->is_open()) {
    finish_locked(out, it, unavailable("prefill engine " + engine_id + " closed the connection"),
                  TransferResult::kError);
    return;
  }
  f.phase = Phase::kAsked;
  f.channel = *channel;
  f.ask_sent = Clock::now();
  f.channel->send(MessageType::kAsk, protocol::encode(f.ask));
}

void DecodeSide::post_not_needed_locked(const engine::KvTransferParams& params) {
  if (is_stopping_) {
    return;
  }
  std::string url = params.remote_bootstrap_addr;
  std::string engine_id = params.remote_engine_id;
  std::string transfer_id = params.transfer_id;
  (void)ctx_->work->post(
      [this, url, engine_id, transfer_id] { run_not_needed(url, engine_id, transfer_id); });
}

void DecodeSide::release_unpulled(const engine::KvTransferParams& params) {
  if (!params.do_remote_prefill || params.transfer_id.empty() || params.remote_engine_id.empty() ||
      params.remote_bootstrap_addr.empty()) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ctx_->metrics->count_result(TransferRole::kDecode, TransferResult::kCancelled);
  post_not_needed_locked(params);
}

void DecodeSide::run_not_needed(const std::string& bootstrap_url, const std::string& engine_id,
                                const std::string& transfer_id) {
  Deadline deadline = Deadline::after(ctx_->options->transfer_timeout);
  auto addr = resolve(bootstrap_url, engine_id, deadline);
  if (!addr.is_ok()) {
    CRESCENT_LOG(kDebug) << "kv connector: NOT_NEEDED for " << transfer_id
                         << " not sent: " << addr.status().to_string();
    return;
  }
  auto channel = channel_to(*addr, engine_id, deadline);
  if (!channel.is_ok()) {
    CRESCENT_LOG(kDebug) << "kv connector: NOT_NEEDED for " << transfer_id
                         << " not sent: " << channel.status().to_string();
    return;
  }
  (*channel)->send(MessageType::kNotNeeded, protocol::encode(protocol::TransferRef{transfer_id}));
}

void DecodeSide::fail_unasked(const std::string& request_id, const Status& status) {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fetches_.find(request_id);
  if (it == fetches_.end() || it->second.phase != Phase::kPreparing)
    return;
  if (status.code() == StatusCode::kDeadlineExceeded || it->second.deadline.is_expired()) {
    finish_locked(out, it, timed_out(it->second, status.message()), TransferResult::kExpired);
    return;
  }
  finish_locked(out, it, status, TransferResult::kError);
}

Result<std::string> DecodeSide::resolve(const std::string& bootstrap_url,
                                        const std::string& engine_id, Deadline deadline) {
  std::string key = bootstrap_url + "\n" + engine_id;
  {
    // One lookup per engine at a time: a burst of requests makes one bootstrap query.
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (is_stopping_)
        return unavailable("the decode engine's KV connector is shut down");
      auto it = resolved_.find(key);
      if (it != resolved_.end())
        return it->second;
      if (resolving_.count(key) == 0)
        break;
      if (connected_cv_.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
          deadline.is_expired()) {
        return deadline_exceeded("waiting for another bootstrap lookup of " + engine_id);
      }
    }
    resolving_.insert(key);
  }
  struct Done {
    DecodeSide* side;
    const std::string& key;
    ~Done() {
      std::lock_guard<std::mutex> lock(side->mu_);
      side->resolving_.erase(key);
      side->connected_cv_.notify_all();
    }
  } done{this, key};
  auto addr = ctx_->options->resolve(bootstrap_url, engine_id, deadline);
  if (!addr.is_ok()) {
    const Status& s = addr.status();
    switch (s.code()) {
      case StatusCode::kNotFound:
        return not_found("prefill engine " + engine_id + " unknown at bootstrap URL " +
                         bootstrap_url + " (" + s.message() + ")");
      case StatusCode::kDeadlineExceeded:
        return deadline_exceeded("bootstrap lookup of " + engine_id + " at " + bootstrap_url +
                                 ": " + s.message());
      default:
        return unavailable("bootstrap URL " + bootstrap_url + " unreachable: " + s.message());
    }
  }
  std::string host;
  int port = 0;
  Status valid = parse_worker_addr(*addr, &host, &port);
  if (!valid.is_ok()) {
    return data_loss("bootstrap URL " + bootstrap_url + " returned a bad worker address for " +
                     engine_id + ": " + valid.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  resolved_[key] = *addr;
  return *addr;
}

void DecodeSide::forget_worker_locked(const std::string& addr) {
  for (auto it = resolved_.begin(); it != resolved_.end();) {
    if (it->second != addr) {
      ++it;
      continue;
    }
    // The shared resolver's answer is as stale as ours: a restarted prefill engine registers
    // under a new engine id (and may replace this one at the bootstrap).
    if (ctx_->options->forget) {
      const size_t nl = it->first.find('\n');
      ctx_->options->forget(it->first.substr(0, nl), it->first.substr(nl + 1));
    }
    it = resolved_.erase(it);
  }
}

Result<net::Fd> DecodeSide::handshake(const std::string& addr, const std::string& engine_id,
                                      Deadline deadline) {
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(parse_worker_addr(addr, &host, &port));
  auto fd = net::connect_tcp(host, port, deadline);
  if (!fd.is_ok()) {
    if (fd.status().code() == StatusCode::kDeadlineExceeded)
      return fd.status();
    return unavailable("prefill engine " + engine_id + " at " + addr +
                       " unreachable: " + fd.status().message());
  }
  const DisaggOptions& o = *ctx_->options;
  const std::string peer = "prefill engine " + engine_id + " at " + addr;
  RETURN_IF_ERROR(net::auth::authenticate_to_server(*fd, o.auth_token, peer, deadline));
  protocol::Hello hello;
  hello.compat = o.compat;
  hello.compat_hash = o.compat.hash();
  hello.engine_id = o.engine_id;
  hello.segment_descriptor = ctx_->transfer->local_segment().serialize();
  hello.region_id = ctx_->region.value();
  hello.block_bytes = o.memory.block_bytes;
  hello.num_blocks = static_cast<uint32_t>(o.memory.num_blocks);
  hello.heartbeat_interval_ms = static_cast<uint32_t>(o.heartbeat_interval.count());
  std::string context = "handshake with prefill engine " + engine_id + " at " + addr;
  Status sent = net::write_frame(*fd, static_cast<uint16_t>(MessageType::kHello),
                                 protocol::encode(hello), deadline);
  if (!sent.is_ok())
    return sent.with_context(context);
  auto reply = net::read_frame(*fd, protocol::kMaxPayloadBytes, deadline);
  if (!reply.is_ok()) {
    if (reply.status().code() == StatusCode::kUnavailable)
      return unavailable("prefill engine " + engine_id +
                         " closed the connection during the "
                         "handshake");
    return reply.status().with_context(context);
  }
  RETURN_IF_ERROR(net::auth::refusal_in_reply(*reply, peer));
  if (reply->type == static_cast<uint16_t>(MessageType::kRefused)) {
    auto refused = protocol::decode_refused(reply->payload);
    if (!refused.is_ok())
      return refused.status().with_context(context);
    if (refused->kind == protocol::RefusalKind::kCompatibility)
      return failed_precondition("compatibility mismatch with prefill engine " + engine_id + ": " +
                                 refused->message);
    return failed_precondition("prefill engine " + engine_id +
                               " refused the connection: " + refused->message);
  }
  if (reply->type != static_cast<uint16_t>(MessageType::kHelloOk)) {
    return data_loss(context + ": unexpected " + protocol::message_type_name(reply->type));
  }
  auto ok = protocol::decode_hello_ok(reply->payload);
  if (!ok.is_ok())
    return ok.status().with_context(context);
  if (ok->engine_id != engine_id) {
    return failed_precondition("the worker at " + addr + " is prefill engine " + ok->engine_id +
                               ", not " + engine_id);
  }
  return fd;
}

Result<std::shared_ptr<ControlChannel>> DecodeSide::channel_to(const std::string& addr,
                                                               const std::string& engine_id,
                                                               Deadline deadline) {
  {
    // One connect per worker at a time; the others wait for it and reuse its channel.
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (is_stopping_)
        return unavailable("the decode engine's KV connector is shut down");
      auto it = channels_.find(addr);
      if (it != channels_.end() && it->second->is_open())
        return it->second;
      if (connecting_.count(addr) == 0)
        break;
      if (connected_cv_.wait_until(lock, deadline.when()) == std::cv_status::timeout &&
          deadline.is_expired()) {
        return deadline_exceeded("waiting for another connection attempt to " + addr);
      }
    }
    connecting_.insert(addr);
  }
  auto fd = handshake(addr, engine_id, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  connecting_.erase(addr);
  connected_cv_.notify_all();
  if (!fd.is_ok()) {
    forget_worker_locked(addr);  // the bootstrap may know a newer address next time
    return fd.status();
  }
  if (is_stopping_)
    return unavailable("the decode engine's KV connector is shut down");
  const DisaggOptions& o = *ctx_->options;
  ControlChannel::Options co;
  co.peer_name = "prefill engine " + engine_id + " at " + addr;
  co.heartbeat_interval = o.heartbeat_interval;
  co.sends_heartbeats = true;
  co.close_grace = o.cancel_grace;
  co.io_timeout = 3 * o.heartbeat_interval;
  co.waits_for_peer_close_on_error = true;
  // Built under mu_ so that the handlers (which take mu_) find it registered.
  auto channel = std::make_shared<ControlChannel>(
      std::move(*fd), co, [this](ControlChannel& ch, net::Frame f) { on_frame(ch, std::move(f)); },
      [this](ControlChannel& ch, const Status& why) { on_closed(ch, why); });
  channels_[addr] = channel;
  live_channels_[channel->id()] = LiveChannel{addr, channel};
  return channel;
}

void DecodeSide::on_frame(ControlChannel& channel, net::Frame frame) {
  auto type = static_cast<MessageType>(frame.type);
  if (type == MessageType::kHeartbeatAck && frame.payload.empty())
    return;
  if (type != MessageType::kDone && type != MessageType::kCancelAck) {
    channel.close(data_loss("unexpected " + protocol::message_type_name(frame.type) + " from " +
                            channel.peer_name()));
    return;
  }
  std::string transfer_id;
  protocol::Done done;
  if (type == MessageType::kDone) {
    auto d = protocol::decode_done(frame.payload);
    if (!d.is_ok()) {
      channel.close(d.status().with_context("from " + channel.peer_name()));
      return;
    }
    done = std::move(*d);
    transfer_id = done.transfer_id;
  } else {
    auto ref = protocol::decode_transfer_ref(frame.payload, "CANCEL_ACK");
    if (!ref.is_ok()) {
      channel.close(ref.status().with_context("from " + channel.peer_name()));
      return;
    }
    transfer_id = ref->transfer_id;
  }
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto r = request_of_transfer_.find(transfer_id);
  if (r == request_of_transfer_.end())
    return;  // e.g. the ack of a CANCEL whose DONE already ended the fetch
  auto it = fetches_.find(r->second);
  CRESCENT_CHECK(it != fetches_.end()) << "transfer without a fetch: " << transfer_id;
  Fetch& f = it->second;
  if (f.channel.get() != &channel)
    return;
  double transfer_s = static_cast<double>(done.write_ns) * 1e-9;
  if (f.phase == Phase::kCancelling) {
    // DONE or CANCEL_ACK: either way the prefill engine writes nothing more.
    finish_locked(out, it, f.pending, f.pending_result);
    return;
  }
  if (f.phase != Phase::kAsked || type != MessageType::kDone)
    return;
  if (!done.status.is_ok()) {
    finish_locked(
        out, it,
        Status(done.status.code(), "prefill engine " + f.engine_id + ": " + done.status.message()),
        done.status.code() == StatusCode::kDeadlineExceeded ? TransferResult::kExpired
                                                            : TransferResult::kError);
    return;
  }
  if (done.num_bytes != f.expected_bytes) {
    finish_locked(out, it,
                  data_loss("prefill engine " + f.engine_id + " wrote " +
                            std::to_string(done.num_bytes) + " bytes for transfer " +
                            f.transfer_id + ", expected " + std::to_string(f.expected_bytes)),
                  TransferResult::kError);
    return;
  }
  ctx_->metrics->add_bytes(TransferRole::kDecode, done.num_bytes);
  ctx_->metrics->observe_write(TransferRole::kDecode, transfer_s);
  finish_locked(out, it, Status::ok(), TransferResult::kOk, transfer_s);
}

void DecodeSide::on_closed(ControlChannel& channel, const Status& reason) {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_channels_.find(channel.id());
  if (live != live_channels_.end()) {
    const std::string& addr = live->second.addr;
    auto c = channels_.find(addr);
    if (c != channels_.end() && c->second.get() == &channel)
      channels_.erase(c);
    forget_worker_locked(addr);
    closed_channels_.push_back(std::move(live->second.channel));
    live_channels_.erase(live);
  }
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    auto next = std::next(it);
    Fetch& f = it->second;
    if (f.channel.get() == &channel) {
      if (f.phase == Phase::kCancelling) {
        finish_locked(out, it, f.pending, f.pending_result);
      } else {
        finish_locked(out, it, unavailable(reason.message()), TransferResult::kError);
      }
    }
    it = next;
  }
}

void DecodeSide::finish_locked(Outbox& out, FetchMap::iterator it, Status status,
                               TransferResult result, double transfer_s) {
  const Fetch& f = it->second;
  TimePoint now = Clock::now();
  FetchTiming timing;
  timing.request_id = it->first;
  timing.transfer_id = f.transfer_id;
  timing.bootstrap_s = f.bootstrap_s;
  timing.transfer_s = transfer_s;
  if (f.phase != Phase::kPreparing)
    timing.wait_s = std::max(0.0, seconds_between(f.ask_sent, now) - transfer_s);
  timing.total_s = seconds_between(f.start, now);
  timing.num_bytes = status.is_ok() ? f.expected_bytes : 0;
  timing.is_ok = status.is_ok();
  ctx_->metrics->record_fetch(timing);
  ctx_->metrics->count_result(TransferRole::kDecode, result);
  ctx_->metrics->add_in_flight(TransferRole::kDecode, -1);
  if (!status.is_ok()) {
    CRESCENT_LOG(kInfo) << "kv connector: fetch of request " << it->first
                        << " failed: " << status.to_string();
  }
  out.add(kv_ready(it->first, std::move(status)));
  request_of_transfer_.erase(f.transfer_id);
  fetches_.erase(it);
}

void DecodeSide::begin_cancel_locked(Fetch& f, Status pending, TransferResult result) {
  f.phase = Phase::kCancelling;
  f.pending = std::move(pending);
  f.pending_result = result;
  f.grace_until = Clock::now() + ctx_->options->cancel_grace;
  f.channel->send(MessageType::kCancel, protocol::encode(protocol::TransferRef{f.transfer_id}));
}

bool DecodeSide::cancel(const std::string& request_id) {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fetches_.find(request_id);
  if (it == fetches_.end())
    return false;
  Fetch& f = it->second;
  Status why = cancelled("request " + request_id + " was cancelled");
  switch (f.phase) {
    case Phase::kPreparing:
      // No ASK was sent: nobody can write into the blocks.
      finish_locked(out, it, why, TransferResult::kCancelled);
      break;
    case Phase::kAsked:
      begin_cancel_locked(f, why, TransferResult::kCancelled);
      break;
    case Phase::kCancelling:
      break;
  }
  return true;
}

void DecodeSide::tick() {
  std::vector<std::shared_ptr<ControlChannel>> to_close;
  std::vector<std::shared_ptr<ControlChannel>> finished;
  {
    Outbox out(ctx_->events);
    std::lock_guard<std::mutex> lock(mu_);
    TimePoint now = Clock::now();
    for (auto it = fetches_.begin(); it != fetches_.end();) {
      auto next = std::next(it);
      Fetch& f = it->second;
      switch (f.phase) {
        case Phase::kPreparing:
          if (f.deadline.is_expired()) {
            finish_locked(
                out, it, timed_out(f, "looking up and connecting to prefill engine " + f.engine_id),
                TransferResult::kExpired);
          }
          break;
        case Phase::kAsked:
          if (f.deadline.is_expired()) {
            begin_cancel_locked(f, timed_out(f, "waiting for prefill engine " + f.engine_id),
                                TransferResult::kExpired);
          }
          break;
        case Phase::kCancelling:
          if (now >= f.grace_until && !f.is_close_requested) {
            // No ack: the only proof left that the peer stops is its closed connection.
            f.is_close_requested = true;
            to_close.push_back(f.channel);
          }
          break;
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
  for (auto& ch : to_close) {
    ch->close(unavailable("no CANCEL_ACK from " + ch->peer_name() + " within " +
                          seconds_text(ctx_->options->cancel_grace)));
  }
  for (auto& ch : finished) {
    ch->join();
  }
}

int DecodeSide::num_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(fetches_.size());
}

void DecodeSide::close_connections() {
  std::vector<std::shared_ptr<ControlChannel>> channels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
    connected_cv_.notify_all();
    for (auto& [id, live] : live_channels_) {
      channels.push_back(live.channel);
    }
    for (auto& ch : closed_channels_) {
      channels.push_back(ch);
    }
  }
  for (auto& ch : channels) {
    ch->close(unavailable("the decode engine's KV connector shut down"));
  }
  for (auto& ch : channels) {
    ch->join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_channels_.clear();
}

void DecodeSide::fail_all() {
  Outbox out(ctx_->events);
  std::lock_guard<std::mutex> lock(mu_);
  while (!fetches_.empty()) {
    finish_locked(out, fetches_.begin(), unavailable("the decode engine's KV connector shut down"),
                  TransferResult::kCancelled);
  }
}

}  // namespace crescent::disagg
