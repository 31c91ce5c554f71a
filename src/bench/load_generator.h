#pragma once
// Sends requests at their arrival times with at most max_concurrency in flight. A request that
// arrives while every slot is busy waits (its wait is RequestOutput::queue_time_s), like
// vLLM's semaphore. Each in-flight request has a thread of its own, from a pool of
// min(num_requests, limit) threads created up front.

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "bench/request_output.h"

namespace crescent::bench {

// Read by a progress display while the run goes on.
struct LoadProgress {
  std::atomic<int64_t> num_done{0};
  std::atomic<int64_t> num_failed{0};
};

struct LoadOptions {
  std::vector<double> arrival_offsets_s;  // one per request, from the start of the run
  int max_concurrency = 0;                // 0: no limit but the thread cap
  int thread_cap = 1024;                  // in-flight bound when max_concurrency is 0
};

struct LoadResult {
  std::vector<RequestOutput> outputs;  // in request order; start times rebased to the run
  double duration_s = 0;               // start of the schedule to the last response
};

// send(i) sends request i on the calling worker thread and returns its measurement (times
// on the steady clock, as steady_seconds()). `worker` is the pool thread's index, so a
// caller can keep one connection per thread. Blocks until every request has finished.
using SendFn = std::function<RequestOutput(size_t request, size_t worker)>;
LoadResult run_load(const LoadOptions& options, const SendFn& send,
                    LoadProgress* progress = nullptr);

// The number of pool threads run_load uses.
size_t num_load_threads(const LoadOptions& options);

}  // namespace crescent::bench
