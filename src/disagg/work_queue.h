#pragma once
// WorkQueue: a few threads that run the connector's blocking work (resolve, connect, WRITE and
// wait) so that the engine thread and the control channels' reader threads never block.
// Thread-safety: post() from any thread; stop() once, not from a job.

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace crescent::disagg {

class WorkQueue {
 public:
  explicit WorkQueue(int num_threads);
  ~WorkQueue();  // stop()
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Runs job on a worker thread. False (job dropped) after stop() began.
  bool post(std::function<void()> job);
  // Runs the jobs already queued, then joins the threads. Idempotent.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // GUARDED_BY(mu_)
  bool is_stopping_ = false;                // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
  std::mutex stop_mu_;  // serialises stop()
};

}  // namespace crescent::disagg
