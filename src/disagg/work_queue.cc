#include "disagg/work_queue.h"

namespace crescent::disagg {

WorkQueue::WorkQueue(int num_threads) {
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { run(); });
  }
}

WorkQueue::~WorkQueue() {
  stop();
}

bool WorkQueue::post(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (is_stopping_)
    return false;
  jobs_.push_back(std::move(job));
  cv_.notify_one();
  return true;
}

void WorkQueue::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    is_stopping_ = true;
    cv_.notify_all();
  }
  for (auto& t : threads_) {
    if (t.joinable())
      t.join();
  }
}

void WorkQueue::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return is_stopping_ || !jobs_.empty(); });
      if (jobs_.empty())
        return;  // stopping, and everything queued has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace crescent::disagg
