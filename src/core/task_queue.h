#pragma once
// TaskQueue: a few threads that run posted tasks in the order they were posted. For work that
// may block and must stay off the threads that post it (the HTTP server's I/O threads hand
// image fetching and decoding to one). Thread-safe. The destructor runs every task already
// posted, then joins; post() after destruction began is a bug (CHECKed).

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace crescent {

class TaskQueue {
 public:
  explicit TaskQueue(int num_threads);
  ~TaskQueue();
  TaskQueue(const TaskQueue&) = delete;
  TaskQueue& operator=(const TaskQueue&) = delete;

  void post(std::function<void()> task);
  int num_pending() const;

 private:
  void worker_loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // GUARDED_BY(mu_)
  bool stopping_ = false;                    // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace crescent
