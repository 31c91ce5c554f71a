#include "disagg/control_channel.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

#include "core/logging.h"
#include "net/auth/handshake.h"

namespace crescent::disagg {
namespace {

std::atomic<uint64_t> g_next_channel_id{1};

void signal_eventfd(const net::Fd& fd) {
  uint64_t one = 1;
  // A full counter still leaves the fd readable, which is all the reader needs.
  [[maybe_unused]] ssize_t n = ::write(fd.get(), &one, sizeof(one));
}

void drain_eventfd(const net::Fd& fd) {
  uint64_t v = 0;
  [[maybe_unused]] ssize_t n = ::read(fd.get(), &v, sizeof(v));
}

}  // namespace

ControlChannel::ControlChannel(net::Fd fd, Options options, FrameHandler on_frame,
                               CloseHandler on_closed)
    : id_(g_next_channel_id.fetch_add(1)),
      options_(std::move(options)),
      on_frame_(std::move(on_frame)),
      on_closed_(std::move(on_closed)),
      fd_(std::move(fd)),
      wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      peer_interval_(options_.heartbeat_interval) {
  CRESCENT_CHECK(wake_fd_.is_valid()) << "eventfd failed";
  reader_ = std::thread([this] { read_loop(); });
  writer_ = std::thread([this] { write_loop(); });
}

ControlChannel::~ControlChannel() {
  abort(cancelled("control channel destroyed"));
  join();
}

void ControlChannel::send(protocol::MessageType type, std::string payload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_closing_ || is_reader_done_)
    return;
  queue_.push_back(Outgoing{type, std::move(payload)});
  cv_.notify_all();
}

bool ControlChannel::begin_close(const Status& reason, bool is_graceful) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_closing_)
    return false;
  is_closing_ = true;
  is_graceful_ = is_graceful;
  close_reason_ = reason;
  close_deadline_ = Clock::now() + options_.close_grace;
  cv_.notify_all();
  return true;
}

void ControlChannel::close(const Status& reason) {
  if (begin_close(reason, /*is_graceful=*/true))
    signal_eventfd(wake_fd_);
}

void ControlChannel::abort(const Status& reason) {
  begin_close(reason, /*is_graceful=*/false);
  // Wakes the reader (poll sees the hang-up) and the writer (its write fails).
  net::shutdown_both(fd_);
  signal_eventfd(wake_fd_);
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

void ControlChannel::set_heartbeat_interval(std::chrono::milliseconds interval) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_interval_ = interval;
}

bool ControlChannel::is_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !is_closing_ && !is_reader_done_;
}

bool ControlChannel::is_finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return is_reader_done_ && is_writer_done_;
}

void ControlChannel::join() {
  std::lock_guard<std::mutex> lock(join_mu_);
  if (is_joined_)
    return;
  if (reader_.joinable())
    reader_.join();
  if (writer_.joinable())
    writer_.join();
  is_joined_ = true;
}

void ControlChannel::read_loop() {
  TimePoint last_rx = Clock::now();
  Status reason;
  // Gives up on the peer: either now, or (waits_for_peer_close_on_error) after a graceful close.
  auto fail = [&](const Status& why) {
    if (options_.waits_for_peer_close_on_error && begin_close(why, /*is_graceful=*/true))
      return false;
    std::lock_guard<std::mutex> lock(mu_);
    reason = is_closing_ ? close_reason_ : why;
    return true;
  };
  // The accepting side proves the peer's identity before reading any protocol frame.
  const Status auth = net::auth::authenticate_client(fd_, options_.auth_token);
  if (!auth.is_ok()) {
    reason = auth.with_context("authenticating " + options_.peer_name);
  }
  last_rx = Clock::now();
  while (auth.is_ok()) {
    bool closing;
    TimePoint until;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing = is_closing_;
      if (closing && !is_graceful_) {
        reason = close_reason_;
        break;
      }
      until = closing ? close_deadline_ : last_rx + 3 * peer_interval_;
    }
    auto now = Clock::now();
    if (now >= until) {
      if (closing) {
        std::lock_guard<std::mutex> lock(mu_);
        reason = close_reason_;
        break;
      }
      auto silent_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_rx);
      if (fail(unavailable("no frame from " + options_.peer_name + " for " +
                           std::to_string(silent_ms.count()) + " ms (heartbeats missed)"))) {
        break;
      }
      continue;
    }
    pollfd fds[2] = {{fd_.get(), POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1;
    int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(wait_ms, 60'000)));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      fail(internal_error("poll on the control connection failed"));
      break;
    }
    if (fds[1].revents != 0)
      drain_eventfd(wake_fd_);
    if (fds[0].revents == 0)
      continue;
    if (closing) {
      // Waiting for the peer's EOF: framing may be lost, so read raw bytes and drop them.
      char scratch[4096];
      ssize_t got = ::recv(fd_.get(), scratch, sizeof(scratch), 0);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        continue;
      if (got <= 0) {
        std::lock_guard<std::mutex> lock(mu_);
        reason = close_reason_;
        break;
      }
      continue;
    }
    auto frame =
        net::read_frame(fd_, protocol::kMaxPayloadBytes, Deadline::after(options_.io_timeout));
    if (!frame.is_ok()) {
      bool is_eof = frame.status().code() == StatusCode::kUnavailable;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (is_closing_) {
          // close()/abort() raced with this read: keep their reason.
          if (is_eof || !is_graceful_) {
            reason = close_reason_;
            break;
          }
          continue;
        }
      }
      if (is_eof) {
        std::lock_guard<std::mutex> lock(mu_);
        reason = unavailable(options_.peer_name + " closed the connection");
        break;
      }
      if (fail(frame.status().with_context("bad frame from " + options_.peer_name)))
        break;
      continue;
    }
    last_rx = Clock::now();
    on_frame_(*this, std::move(*frame));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!is_closing_) {
      is_closing_ = true;
      close_reason_ = reason;
    }
    queue_.clear();
    cv_.notify_all();
  }
  on_closed_(*this, reason);
  net::shutdown_both(fd_);
  std::lock_guard<std::mutex> lock(mu_);
  is_reader_done_ = true;
  cv_.notify_all();
}

void ControlChannel::write_loop() {
  // Heartbeats go out every interval whatever else is sent: the peer answers each one, and
  // that answer is what keeps this side's liveness check satisfied while the peer has nothing
  // else to say (a prefill engine in a long prefill). Basing them on "time since the last
  // frame of any kind" starved them under a steady stream of ASKs and dropped live peers.
  TimePoint last_heartbeat = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (is_reader_done_)
      break;
    const bool sending_allowed = !(is_closing_ && !is_graceful_);
    if (options_.sends_heartbeats && sending_allowed && !is_closing_ &&
        Clock::now() >= last_heartbeat + options_.heartbeat_interval) {
      lock.unlock();
      Status s = net::write_frame(fd_, static_cast<uint16_t>(protocol::MessageType::kHeartbeat), "",
                                  Deadline::after(options_.io_timeout));
      last_heartbeat = Clock::now();
      if (!s.is_ok())
        abort(s.with_context("heartbeat to " + options_.peer_name));
      lock.lock();
      continue;
    }
    if (!queue_.empty() && sending_allowed) {
      Outgoing out = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Status s = net::write_frame(fd_, static_cast<uint16_t>(out.type), out.payload,
                                  Deadline::after(options_.io_timeout));
      if (!s.is_ok())
        abort(s.with_context("writing to " + options_.peer_name));
      lock.lock();
      continue;
    }
    if (is_closing_) {
      if (is_graceful_) {
        // Queued frames are out; tell the peer we are done and let the reader wait for its EOF.
        ::shutdown(fd_.get(), SHUT_WR);
      }
      cv_.wait(lock, [&] { return is_reader_done_; });
      break;
    }
    if (options_.sends_heartbeats) {
      cv_.wait_until(lock, last_heartbeat + options_.heartbeat_interval);
    } else {
      cv_.wait(lock);
    }
  }
  is_writer_done_ = true;
}

}  // namespace crescent::disagg
