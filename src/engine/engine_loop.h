#pragma once
// EngineLoop: runs one Engine on its own thread so that many threads (the HTTP server's) can
// submit and abort requests. Each request's outputs are delivered, in order, to its callback
// on the loop thread; the last one has finished = true, and every accepted request gets one
// (kAbort when aborted or shut down). Callbacks run on the loop thread without the lock held:
// they should be quick, may call submit/abort/stats, and must not call shutdown.
// The thread sleeps on a condition variable while there is no work.
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

class EngineLoop {
 public:
  // Starts the thread. The engine (and the runner it borrows) must only be used by the loop.
  explicit EngineLoop(std::unique_ptr<Engine> engine);
  ~EngineLoop();  // shutdown()

  // Validates (same checks as Engine::add_request, including a live duplicate id) and queues.
  // Unavailable after shutdown.
  Status submit(EngineRequest request, OutputCallback on_output);
  // Asynchronous; unknown ids are ignored.
  void abort(const std::string& request_id);
  // A snapshot, refreshed after every step.
  EngineStats stats() const;
  // Aborts what remains (each gets its kAbort output), stops and joins the thread. Idempotent.
  void shutdown();

 private:
  struct Command {
    bool is_abort = false;
    EngineRequest request;  // !is_abort
    std::string abort_id;   // is_abort
  };

  void run();
  void deliver(const std::vector<RequestOutput>& outputs);

  std::unique_ptr<Engine> engine_;  // used only on thread_ once started
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;                               // guarded by mu_
  std::unordered_map<std::string, OutputCallback> callbacks_;  // guarded by mu_
  bool stopping_ = false;                                      // guarded by mu_
  EngineStats stats_;                                          // guarded by mu_
  std::once_flag shutdown_once_;
  std::thread thread_;
};

}  // namespace crescent::engine
