#include "disagg/event_queue.h"

namespace crescent::disagg {

void EventQueue::push(std::vector<engine::KvConnectorEvent> events) {
  std::function<void()> wakeup;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : events) {
      events_.push_back(std::move(e));
    }
    wakeup = wakeup_;
  }
  if (wakeup)
    wakeup();
}

std::vector<engine::KvConnectorEvent> EventQueue::take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<engine::KvConnectorEvent> out;
  out.swap(events_);
  return out;
}

void EventQueue::set_wakeup(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  wakeup_ = std::move(fn);
}

}  // namespace crescent::disagg
