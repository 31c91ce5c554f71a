#pragma once
// EventQueue: the connector's events for the engine (take_events) and the engine's wakeup.
// Outbox collects events under a side's lock and publishes them after that lock is released,
// so the wakeup function (the engine's code) never runs under a connector lock.
// Thread-safety: every method may be called from any thread.

#include <functional>
#include <mutex>
#include <vector>

#include "engine/kv_connector.h"

namespace crescent::disagg {

class EventQueue {
 public:
  void push(std::vector<engine::KvConnectorEvent> events);
  std::vector<engine::KvConnectorEvent> take();
  void set_wakeup(std::function<void()> fn);

 private:
  std::mutex mu_;
  std::vector<engine::KvConnectorEvent> events_;  // GUARDED_BY(mu_)
  std::function<void()> wakeup_;                  // GUARDED_BY(mu_)
};

// Declare before the lock_guard it outlives: events added under the lock are pushed when the
// Outbox is destroyed, after the lock was released.
class Outbox {
 public:
  explicit Outbox(EventQueue* queue) : queue_(queue) {}
  ~Outbox() {
    if (!events_.empty())
      queue_->push(std::move(events_));
  }
  Outbox(const Outbox&) = delete;
  Outbox& operator=(const Outbox&) = delete;

  void add(engine::KvConnectorEvent event) { events_.push_back(std::move(event)); }

 private:
  EventQueue* queue_;
  std::vector<engine::KvConnectorEvent> events_;
};

}  // namespace crescent::disagg
