#include "core/thread_pool.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "core/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define CRESCENT_CPU_RELAX() _mm_pause()
#else
#define CRESCENT_CPU_RELAX() ((void)0)
#endif

namespace crescent {
namespace {
// About 50-100 us of spinning before a worker goes to sleep.
constexpr int kSpinIterations = 20000;

std::mutex& default_pool_mutex() {
  static std::mutex m;
  return m;
}
std::unique_ptr<ThreadPool>& default_pool_storage() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  CRESCENT_CHECK_GE(num_threads, 1);
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(2);
  generation_.notify_all();
  for (auto& t : workers_) {
    t.join();
  }
}

void ThreadPool::drain_tasks() {
  while (true) {
    int i = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (i >= job_num_tasks_)
      return;
    job_fn_(job_ctx_, i);
    num_done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  while (true) {
    int spins = 0;
    while (generation_.load() == seen) {
      if (++spins < kSpinIterations) {
        CRESCENT_CPU_RELAX();
        continue;
      }
      num_sleeping_.fetch_add(1);
      if (generation_.load() == seen) {
        generation_.wait(seen);
      }
      num_sleeping_.fetch_sub(1);
      spins = 0;
    }
    if (stop_.load())
      return;
    // Announce ourselves before reading the job, so the caller cannot rewrite the job fields
    // while we may still read them. An odd generation means "job being written": leave it.
    num_active_.fetch_add(1);
    uint64_t g = generation_.load();
    if (g != seen && (g & 1) == 0 && !stop_.load()) {
      seen = g;
      drain_tasks();
    }
    num_active_.fetch_sub(1);
  }
}

void ThreadPool::run(int num_tasks, TaskFn fn, void* ctx) {
  if (num_tasks <= 0)
    return;
  if (workers_.empty() || num_tasks == 1) {
    for (int i = 0; i < num_tasks; ++i) {
      fn(ctx, i);
    }
    return;
  }
  bool was_in_use = in_use_.exchange(true);
  CRESCENT_CHECK(!was_in_use) << "ThreadPool::parallel_for is not reentrant";
  // Seqlock-style publication: odd generation while the fields are rewritten, and no worker
  // may be inside the previous job when they are.
  generation_.fetch_add(1);
  while (num_active_.load() != 0) {
    CRESCENT_CPU_RELAX();
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  num_done_.store(0, std::memory_order_relaxed);
  generation_.fetch_add(1);  // even again: publishes the job (seq_cst)
  if (num_sleeping_.load() > 0) {
    generation_.notify_all();
  }
  drain_tasks();
  while (num_done_.load(std::memory_order_acquire) < num_tasks) {
    CRESCENT_CPU_RELAX();
  }
  while (num_active_.load() != 0) {
    CRESCENT_CPU_RELAX();
  }
  in_use_.store(false);
}

ThreadPool& ThreadPool::default_pool() {
  std::lock_guard<std::mutex> lock(default_pool_mutex());
  auto& pool = default_pool_storage();
  if (!pool) {
    pool = std::make_unique<ThreadPool>(
        std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  }
  return *pool;
}

void ThreadPool::set_default_threads(int num_threads) {
  std::lock_guard<std::mutex> lock(default_pool_mutex());
  default_pool_storage() = std::make_unique<ThreadPool>(std::max(1, num_threads));
}

}  // namespace crescent
