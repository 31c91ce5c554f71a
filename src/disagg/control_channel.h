#pragma once
// ControlChannel: one control connection of the KV connector (decode engine <-> prefill
// worker), carrying protocol.h messages as net/frame.h frames. A reader thread hands each
// frame to the owner's handler; a writer thread sends queued frames in order, so send() never
// blocks and may be called under the owner's lock. Liveness: the side that sends heartbeats
// does so after heartbeat_interval without sending; either side declares the peer dead after
// three intervals without receiving any frame.
//
// Closing: abort() shuts the socket at once. close() is graceful: queued frames go out, the
// write side is shut, and the reader discards input until the peer closes its side (at most
// close_grace) — a prefill peer closes only after it has stopped writing into our memory, so its
// EOF is the proof the decode side needs. Either way on_closed(reason) runs exactly once, on the
// reader thread, BEFORE this side's socket is shut in both directions (so a prefill side can
// stop its writes before the decode side sees EOF).
//
// Thread-safety: every public method may be called from any thread; handlers run on the
// reader thread, one at a time, and must not destroy the channel (the owner keeps a
// reference until is_finished()). The destructor aborts and joins; never run it on the
// channel's own threads.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/clock.h"
#include "core/status.h"
#include "disagg/protocol.h"
#include "net/frame.h"
#include "net/socket.h"

namespace crescent::disagg {

class ControlChannel {
 public:
  struct Options {
    std::string peer_name;  // for messages: "prefill engine P at tcp://..."
    std::chrono::milliseconds heartbeat_interval{1000};
    bool sends_heartbeats = false;
    std::chrono::milliseconds close_grace{1000};
    std::chrono::milliseconds io_timeout{5000};  // a started frame must be read/written in this
    // On a bad frame or missed heartbeats: close gracefully and wait (close_grace) for the
    // peer's EOF instead of giving up at once (the decode side: the EOF says P stopped writing).
    bool waits_for_peer_close_on_error = false;
    // Accepting side: when not empty, the reader first runs net/auth/handshake.h's
    // authenticate_client() and closes the channel (on_closed) if the peer fails it.
    std::string auth_token;
  };
  using FrameHandler = std::function<void(ControlChannel& channel, net::Frame frame)>;
  using CloseHandler = std::function<void(ControlChannel& channel, const Status& reason)>;

  // Starts the reader and writer threads on a connected socket.
  ControlChannel(net::Fd fd, Options options, FrameHandler on_frame, CloseHandler on_closed);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Queues a frame; dropped silently once the channel is closing.
  void send(protocol::MessageType type, std::string payload);
  void close(const Status& reason);
  void abort(const Status& reason);
  // The peer's heartbeat interval (liveness timeout = 3x); the prefill side learns it in HELLO.
  void set_heartbeat_interval(std::chrono::milliseconds interval);

  // False once close/abort started or the reader saw an error; from then on on_closed runs or
  // has run.
  bool is_open() const;
  // Both threads have ended; join() returns at once.
  bool is_finished() const;
  void join();
  uint64_t id() const { return id_; }
  const std::string& peer_name() const { return options_.peer_name; }

 private:
  void read_loop();
  void write_loop();
  // Sets the closing state (first reason wins). Returns false if already closing.
  bool begin_close(const Status& reason, bool is_graceful);

  const uint64_t id_;
  Options options_;
  FrameHandler on_frame_;
  CloseHandler on_closed_;
  net::Fd fd_;
  net::Fd wake_fd_;  // eventfd: wakes the reader's poll when closing starts

  mutable std::mutex mu_;
  std::condition_variable cv_;  // writer: frames queued, closing, reader done
  struct Outgoing {
    protocol::MessageType type;
    std::string payload;
  };
  std::deque<Outgoing> queue_;               // GUARDED_BY(mu_)
  bool is_closing_ = false;                  // GUARDED_BY(mu_)
  bool is_graceful_ = false;                 // GUARDED_BY(mu_)
  bool is_reader_done_ = false;              // GUARDED_BY(mu_)
  bool is_writer_done_ = false;              // GUARDED_BY(mu_)
  Status close_reason_;                      // GUARDED_BY(mu_)
  TimePoint close_deadline_{};               // GUARDED_BY(mu_)
  std::chrono::milliseconds peer_interval_;  // GUARDED_BY(mu_)
  bool is_joined_ = false;                   // GUARDED_BY(join_mu_)
  std::mutex join_mu_;

  std::thread reader_;
  std::thread writer_;
};

}  // namespace crescent::disagg
