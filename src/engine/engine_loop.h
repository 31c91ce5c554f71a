#pragma once
// EngineLoop: runs one Engine on its own thread so that many threads (the HTTP server's) can
// submit and abort requests. Each request's outputs are delivered, in order, to its callback
// on the loop thread; the last one has finished = true, and every accepted request gets one
// (kAbort when aborted or shut down). Callbacks run on the loop thread without the lock held:
// they should be quick, may call submit/abort/stats, and must not call shutdown.
// The thread sleeps on a condition variable while there is no work, and also while the engine
// only waits on its KV connector (parked fetches, blocks held for a peer): the connector's
// wakeup, a new command or a short poll interval (a safety net) wakes it.
// Thread-safe: every public method may be called from any thread.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/status.h"
#include "engine/engine.h"

namespace crescent::engine {

using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineLoopOptions {
  // While the engine waits only on its KV connector, the loop sleeps until the connector's
  // wakeup or this long, whichever comes first (so a lost wakeup costs latency, not a hang).
  int kv_poll_interval_ms = 50;
  // shutdown() waits this long for the connector to report on blocks a peer may still write
  // or read, then frees them anyway (Engine::drop_remote_holds) and stops.
  int shutdown_kv_wait_ms = 3000;
};

class EngineLoop {
 public:
  // Starts the thread. The engine (and the runner and connector it borrows) must only be used
  // by the loop. Registers the loop's wakeup with the engine's KV connector, if it has one;
  // the connector may call it from any thread, also after the loop is gone (a no-op then).
  explicit EngineLoop(std::unique_ptr<Engine> engine, EngineLoopOptions options = {});
  ~EngineLoop();  // shutdown()

  // Validates (same checks as Engine::add_request, including a live duplicate id) and queues.
  // Unavailable after shutdown.
  Status submit(EngineRequest request, OutputCallback on_output);
  // Asynchronous; unknown ids are ignored.
  void abort(const std::string& request_id);
  // A snapshot, refreshed after every step.
  EngineStats stats() const;
  // The engine's KV event log (Engine::kv_event_log), readable from any thread.
  std::shared_ptr<const KvEventLog> kv_event_log() const { return kv_event_log_; }
  // Aborts what remains (each gets its kAbort output), waits (bounded) for the KV connector
  // to give back blocks a peer may still use, stops and joins the thread. Idempotent.
  void shutdown();

 private:
  struct Command {
    bool is_abort = false;
    EngineRequest request;  // !is_abort
    std::string abort_id;   // is_abort
  };

  // What the connector's wakeup function points at; outlives the loop if the connector does.
  struct KvWaker {
    std::mutex mu;
    EngineLoop* loop = nullptr;  // guarded by mu; null once the loop stopped
  };

  void run();
  void deliver(const std::vector<RequestOutput>& outputs);
  void wake_for_connector();

  EngineLoopOptions options_;
  std::unique_ptr<Engine> engine_;                  // used only on thread_ once started
  std::shared_ptr<const KvEventLog> kv_event_log_;  // engine_'s
  std::shared_ptr<KvWaker> kv_waker_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;                               // guarded by mu_
  std::unordered_map<std::string, OutputCallback> callbacks_;  // guarded by mu_
  bool stopping_ = false;                                      // guarded by mu_
  bool kv_woken_ = false;  // guarded by mu_; the connector queued events since the last step
  EngineStats stats_;      // guarded by mu_
  std::once_flag shutdown_once_;
  std::thread thread_;
};

}  // namespace crescent::engine
