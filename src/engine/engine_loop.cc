#include "engine/engine_loop.h"

#include <chrono>

#include "core/check.h"
#include "core/clock.h"
#include "core/logging.h"

namespace crescent::engine {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, EngineLoopOptions options)
    : options_(options), engine_(std::move(engine)) {
  CRESCENT_CHECK(engine_ != nullptr) << "EngineLoop needs an engine";
  CRESCENT_CHECK(options_.kv_poll_interval_ms > 0 && options_.shutdown_kv_wait_ms >= 0)
      << "bad EngineLoop options";
  stats_ = engine_->stats();
  kv_event_log_ = engine_->kv_event_log();
  if (KvConnector* connector = engine_->options().kv_connector) {
    kv_waker_ = std::make_shared<KvWaker>();
    kv_waker_->loop = this;
    connector->set_wakeup([waker = kv_waker_] {
      std::lock_guard<std::mutex> lock(waker->mu);
      if (waker->loop != nullptr) {
        waker->loop->wake_for_connector();
      }
    });
  }
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
    if (kv_waker_ != nullptr) {
      std::lock_guard<std::mutex> lock(kv_waker_->mu);
      kv_waker_->loop = nullptr;  // the connector may outlive this loop
    }
  });
}

void EngineLoop::wake_for_connector() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kv_woken_ = true;
  }
  cv_.notify_one();
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
  // The last step computed nothing and returned nothing: the engine waits only on its KV
  // connector (or on blocks the connector holds), so stepping again before news is a spin.
  bool idle = false;
  bool stop_seen = false;
  TimePoint give_up_at = TimePoint::max();
  int64_t num_steps_seen = 0;
  const auto poll_interval = std::chrono::milliseconds(options_.kv_poll_interval_ms);
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto has_news = [&] {
        return (stopping_ && !stop_seen) || !commands_.empty() || kv_woken_ ||
               (!idle && engine_->has_unfinished_requests());
      };
      if (engine_->has_unfinished_requests()) {
        cv_.wait_for(lock, poll_interval, has_news);  // the safety net against a lost wakeup
      } else {
        cv_.wait(lock, has_news);
      }
      kv_woken_ = false;
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
        out.error_code = added.code();
        deliver({out});
      }
    }
    commands.clear();
    if (stopping && !stop_seen) {
      // submit() refuses new requests from now on, so one abort_all() covers everything.
      stop_seen = true;
      engine_->abort_all();
      give_up_at = Clock::now() + std::chrono::milliseconds(options_.shutdown_kv_wait_ms);
    }
    Result<std::vector<RequestOutput>> outputs = engine_->step();
    if (!outputs.is_ok()) {
      CRESCENT_LOG(kError) << "engine step failed: " << outputs.status().to_string();
      engine_->abort_all();
    }
    // Publish the stats before delivering, so a client that has seen its final output never
    // reads counters that predate it.
    const EngineStats stats = engine_->stats();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = stats;
    }
    idle = outputs.is_ok() && outputs->empty() && stats.num_steps_total == num_steps_seen;
    num_steps_seen = stats.num_steps_total;
    if (outputs.is_ok()) {
      deliver(*outputs);
    }
    if (stopping && engine_->has_unfinished_requests() && Clock::now() >= give_up_at) {
      CRESCENT_LOG(kWarn) << "shutdown: the KV connector did not give back the blocks of "
                          << stats.num_blocks_held_for_remote << " block references within "
                          << options_.shutdown_kv_wait_ms << " ms; freeing them anyway";
      engine_->drop_remote_holds();
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = engine_->stats();
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
