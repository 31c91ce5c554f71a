#pragma once
// A persistent pool of worker threads for data-parallel loops (the kernels' GEMM/GEMV/attention
// splits). parallel_for() hands out task indices to the workers and to the calling thread and
// returns when every task has run. Workers spin briefly between jobs, so back-to-back loops
// (hundreds per decoded token) cost microseconds, then sleep on a futex when idle.
//
// Thread-safety: one parallel_for() at a time per pool (CHECKed); a task must not call
// parallel_for() on the same pool.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace crescent {

class ThreadPool {
 public:
  // num_threads counts the calling thread: ThreadPool(1) runs everything inline.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, num_tasks).
  template <typename Fn>
  void parallel_for(int num_tasks, Fn&& fn) {
    auto call = [](void* ctx, int i) { (*static_cast<std::remove_reference_t<Fn>*>(ctx))(i); };
    run(num_tasks, call, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Splits [0, n) into about num_threads() * chunks_per_thread contiguous ranges and runs
  // fn(begin, end) for each.
  template <typename Fn>
  void parallel_range(int64_t n, Fn&& fn, int chunks_per_thread = 1) {
    if (n <= 0)
      return;
    int64_t num_chunks = std::min<int64_t>(n, int64_t{num_threads()} * chunks_per_thread);
    parallel_for(static_cast<int>(num_chunks), [&](int c) {
      int64_t begin = n * c / num_chunks;
      int64_t end = n * (c + 1) / num_chunks;
      fn(begin, end);
    });
  }

  // A process-wide pool sized by set_default_threads() (default: hardware concurrency).
  static ThreadPool& default_pool();
  static void set_default_threads(int num_threads);

 private:
  using TaskFn = void (*)(void*, int);
  void run(int num_tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void drain_tasks();

  std::vector<std::thread> workers_;
  // The current job; written by the caller before generation_ is bumped.
  TaskFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int job_num_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> num_done_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> num_active_{0};
  std::atomic<int> num_sleeping_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> in_use_{false};
};

}  // namespace crescent
