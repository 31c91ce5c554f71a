#pragma once
// A one-line progress bar redrawn in place (carriage return) on a terminal while a run goes
// on: done/total, a bar, percent, elapsed time, requests/s and the failures so far. It runs
// its own thread, redrawing every 200 ms, until stop() (also called by the destructor), which
// draws the final state and ends the line.

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "bench/load_generator.h"

namespace crescent::bench {

// The bar's text for a state (no carriage return, no newline); `width` is the bar's cells.
std::string format_progress(int64_t num_done, int64_t num_failed, int64_t total, double elapsed_s,
                            int width = 30);

class ProgressBar {
 public:
  // Draws to `out` (stderr in the command); `progress` must outlive the bar.
  ProgressBar(const LoadProgress& progress, int64_t total, FILE* out);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void stop();

 private:
  void draw();

  const LoadProgress& progress_;
  int64_t total_;
  FILE* out_;
  double start_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool is_stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace crescent::bench
