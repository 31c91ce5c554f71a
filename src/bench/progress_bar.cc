#include "bench/progress_bar.h"

#include <algorithm>
#include <chrono>

#include "bench/openai_request.h"

namespace crescent::bench {

std::string format_progress(int64_t num_done, int64_t num_failed, int64_t total, double elapsed_s,
                            int width) {
  double fraction = total > 0 ? static_cast<double>(num_done) / static_cast<double>(total) : 1;
  fraction = std::clamp(fraction, 0.0, 1.0);
  int filled = static_cast<int>(fraction * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  auto secs = static_cast<int64_t>(elapsed_s);
  char text[160];
  std::snprintf(text, sizeof(text), "%3d%% [%s] %lld/%lld %02lld:%02lld, %.2f req/s, %lld failed",
                static_cast<int>(fraction * 100), bar.c_str(), static_cast<long long>(num_done),
                static_cast<long long>(total), static_cast<long long>(secs / 60),
                static_cast<long long>(secs % 60),
                elapsed_s > 0 ? static_cast<double>(num_done) / elapsed_s : 0.0,
                static_cast<long long>(num_failed));
  return text;
}

ProgressBar::ProgressBar(const LoadProgress& progress, int64_t total, FILE* out)
    : progress_(progress), total_(total), out_(out), start_s_(steady_seconds()) {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (!is_stopping_) {
      draw();
      cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
  });
}

ProgressBar::~ProgressBar() {
  stop();
}

void ProgressBar::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (is_stopping_) {
      return;
    }
    is_stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  draw();
  std::fputc('\n', out_);
  std::fflush(out_);
}

void ProgressBar::draw() {
  std::string line = format_progress(progress_.num_done.load(), progress_.num_failed.load(), total_,
                                     steady_seconds() - start_s_);
  std::fprintf(out_, "\r%s\x1b[K", line.c_str());  // erase what a longer line left
  std::fflush(out_);
}

}  // namespace crescent::bench
