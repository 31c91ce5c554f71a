#include "proxy/upstream_health.h"

#include <algorithm>

#include "core/logging.h"

namespace crescent::proxy {

UpstreamHealth::UpstreamHealth(std::vector<std::string> urls, UpstreamHealthOptions options)
    : options_(options) {
  CRESCENT_CHECK(options_.base_backoff_ms > 0 &&
                 options_.max_backoff_ms >= options_.base_backoff_ms)
      << "bad upstream backoff: base " << options_.base_backoff_ms << " ms, max "
      << options_.max_backoff_ms << " ms";
  entries_.resize(urls.size());
  for (size_t i = 0; i < urls.size(); ++i) {
    entries_[i].state.url = std::move(urls[i]);
  }
}

size_t UpstreamHealth::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

size_t UpstreamHealth::add(const std::string& url) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.state.url != url) {
      continue;
    }
    if (!e.is_member) {
      e.is_member = true;
      e.state.is_up = true;
      e.state.why_down.clear();
      e.backoff_ms = 0;
      CRESCENT_LOG(kInfo) << "proxy: " << url << " joined again; in rotation";
    }
    return i;
  }
  Entry e;
  e.state.url = url;
  entries_.push_back(std::move(e));
  CRESCENT_LOG(kInfo) << "proxy: " << url << " joined; in rotation";
  return entries_.size() - 1;
}

void UpstreamHealth::remove(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_.at(index);
  if (e.is_member) {
    CRESCENT_LOG(kInfo) << "proxy: " << e.state.url << " left; out of rotation";
  }
  e.is_member = false;
}

std::optional<size_t> UpstreamHealth::find(const std::string& url) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].state.url == url) {
      return i;
    }
  }
  return std::nullopt;
}

bool UpstreamHealth::is_up(size_t index) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry& e = entries_.at(index);
  return e.is_member && e.state.is_up;
}

int UpstreamHealth::num_up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) {
    return e.is_member && e.state.is_up;
  }));
}

std::optional<size_t> UpstreamHealth::next_up() {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t tried = 0; tried < entries_.size(); ++tried) {
    size_t i = next_pick_++ % entries_.size();
    if (entries_[i].is_member && entries_[i].state.is_up) {
      return i;
    }
  }
  return std::nullopt;
}

std::string UpstreamHealth::describe_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Entry& e : entries_) {
    if (e.is_member && !e.state.is_up) {
      out += (out.empty() ? "" : ", ") + e.state.url + " (" + e.state.why_down + ")";
    }
  }
  return out;
}

void UpstreamHealth::report_unreachable(size_t index, int64_t now_ms, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_.at(index);
  if (!e.state.is_up) {
    return;
  }
  e.state.is_up = false;
  e.state.why_down = why;
  ++e.state.num_ejections;
  e.backoff_ms = options_.base_backoff_ms;
  e.next_probe_ms = now_ms + e.backoff_ms;
  CRESCENT_LOG(kWarn) << "proxy: " << e.state.url << " is out of rotation: " << why;
}

std::vector<size_t> UpstreamHealth::take_due_probes(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<size_t> due;
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    if (e.is_member && !e.state.is_up && !e.is_probing && now_ms >= e.next_probe_ms) {
      e.is_probing = true;
      due.push_back(i);
    }
  }
  return due;
}

void UpstreamHealth::probe_succeeded(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_.at(index);
  e.is_probing = false;
  if (!e.state.is_up) {
    CRESCENT_LOG(kInfo) << "proxy: " << e.state.url << " answers /health again; back in rotation";
  }
  e.state.is_up = true;
  e.state.why_down.clear();
  e.backoff_ms = 0;
}

void UpstreamHealth::probe_failed(size_t index, int64_t now_ms, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_.at(index);
  e.is_probing = false;
  if (e.state.is_up) {
    return;  // a stale probe: a newer one already put it back
  }
  e.state.why_down = why;
  e.backoff_ms = std::min(options_.max_backoff_ms, std::max<int64_t>(1, e.backoff_ms) * 2);
  e.next_probe_ms = now_ms + e.backoff_ms;
}

std::vector<UpstreamState> UpstreamHealth::states() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<UpstreamState> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) {
    if (e.is_member) {
      out.push_back(e.state);
    }
  }
  return out;
}

}  // namespace crescent::proxy
