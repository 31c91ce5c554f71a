#include "core/task_queue.h"

#include "core/check.h"

namespace crescent {

TaskQueue::TaskQueue(int num_threads) {
  CRESCENT_CHECK(num_threads > 0) << num_threads;
  threads_.reserve(static_cast<size_t>(num_threads));
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { worker_loop(); });
  }
}

TaskQueue::~TaskQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    t.join();
  }
}

void TaskQueue::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    CRESCENT_CHECK(!stopping_) << "post() on a TaskQueue being destroyed";
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

int TaskQueue::num_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(tasks_.size());
}

void TaskQueue::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) {
        return;  // stopping, and everything posted has run
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace crescent
