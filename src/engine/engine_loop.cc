#include "engine/engine_loop.h"

#include "core/check.h"
#include "core/logging.h"

namespace crescent::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  CRESCENT_CHECK(engine_ != nullptr) << "EngineLoop needs an engine";
  stats_ = engine_->stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  shutdown();
}

Status EngineLoop::submit(EngineRequest request, OutputCallback on_output) {
  CRESCENT_CHECK(on_output != nullptr) << "submit needs an output callback";
  // Engine::validate_request reads only options fixed at construction: safe from any thread.
  RETURN_IF_ERROR(engine_->validate_request(request));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      return unavailable("the engine is shutting down");
    }
    // A callback lives from submit until its final output, so this covers queued requests too.
    if (!callbacks_.emplace(request.request_id, std::move(on_output)).second) {
      return already_exists("request id '" + request.request_id + "' is already in use");
    }
    commands_.push_back(Command{false, std::move(request), {}});
  }
  cv_.notify_one();
  return Status::ok();
}

void EngineLoop::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      return;  // shutdown aborts everything anyway
    }
    commands_.push_back(Command{true, {}, request_id});
  }
  cv_.notify_one();
}

EngineStats EngineLoop::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void EngineLoop::shutdown() {
  std::call_once(shutdown_once_, [this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) {
      thread_.join();
    }
  });
}

void EngineLoop::deliver(const std::vector<RequestOutput>& outputs) {
  for (const RequestOutput& out : outputs) {
    OutputCallback callback;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = callbacks_.find(out.request_id);
      CRESCENT_CHECK(it != callbacks_.end()) << "output for unknown request " << out.request_id;
      // Copy, not move: the id stays reserved until its final output has been delivered.
      callback = it->second;
    }
    callback(out);
    if (out.finished) {
      std::lock_guard<std::mutex> lock(mu_);
      callbacks_.erase(out.request_id);
    }
  }
}

void EngineLoop::run() {
  std::deque<Command> commands;
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stopping_ || !commands_.empty() || engine_->has_unfinished_requests();
      });
      commands.swap(commands_);
      stopping = stopping_;
    }
    for (Command& c : commands) {
      if (c.is_abort) {
        engine_->abort(c.abort_id);
        continue;
      }
      const std::string id = c.request.request_id;
      Status added = engine_->add_request(std::move(c.request));
      if (!added.is_ok()) {
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.finish_reason = FinishReason::kError;
        out.error_message = added.to_string();
        deliver({out});
      }
    }
    commands.clear();
    if (stopping) {
      engine_->abort_all();
    }
    Result<std::vector<RequestOutput>> outputs = engine_->step();
    if (!outputs.is_ok()) {
      CRESCENT_LOG(kError) << "engine step failed: " << outputs.status().to_string();
      engine_->abort_all();
    }
    // Publish the stats before delivering, so a client that has seen its final output never
    // reads counters that predate it.
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = engine_->stats();
    }
    if (outputs.is_ok()) {
      deliver(*outputs);
    }
    if (stopping && !engine_->has_unfinished_requests()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (commands_.empty()) {
        return;
      }
    }
  }
}

}  // namespace crescent::engine
