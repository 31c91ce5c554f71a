#include "bench/load_generator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "bench/openai_request.h"

namespace crescent::bench {

size_t num_load_threads(const LoadOptions& options) {
  size_t limit = options.max_concurrency > 0 ? static_cast<size_t>(options.max_concurrency)
                                             : static_cast<size_t>(std::max(1, options.thread_cap));
  return std::min(options.arrival_offsets_s.size(), limit);
}

LoadResult run_load(const LoadOptions& options, const SendFn& send, LoadProgress* progress) {
  const size_t num_requests = options.arrival_offsets_s.size();
  LoadResult result;
  result.outputs.resize(num_requests);
  if (num_requests == 0) {
    return result;
  }
  struct Arrived {
    size_t index;
    double arrival_s;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Arrived> queue;  // guarded by mu
  bool is_closed = false;     // guarded by mu: no more arrivals

  const double start_s = steady_seconds();
  auto worker_loop = [&](size_t worker) {
    for (;;) {
      Arrived next{};
      {
        std::unique_lock<std::mutex> lock(mu);
        // Woken by each arrival and by the close; both are bounded by the schedule.
        cv.wait(lock, [&] { return !queue.empty() || is_closed; });
        if (queue.empty()) {
          return;
        }
        next = queue.front();
        queue.pop_front();
      }
      RequestOutput out = send(next.index, worker);
      out.queue_time_s = std::max(0.0, out.start_time_s - next.arrival_s);
      out.start_time_s -= start_s;
      if (progress != nullptr) {
        if (!out.success) {
          progress->num_failed.fetch_add(1);
        }
        progress->num_done.fetch_add(1);
      }
      result.outputs[next.index] = std::move(out);
    }
  };
  std::vector<std::thread> workers;
  const size_t num_threads = num_load_threads(options);
  for (size_t w = 0; w < num_threads; ++w) {
    workers.emplace_back(worker_loop, w);
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < num_requests; ++i) {
    double offset_s = options.arrival_offsets_s[i];
    if (offset_s > 0) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::duration<double>(offset_s)));
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back({i, steady_seconds()});
    }
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    is_closed = true;
  }
  cv.notify_all();
  for (auto& t : workers) {
    t.join();
  }
  result.duration_s = steady_seconds() - start_s;
  return result;
}

}  // namespace crescent::bench
