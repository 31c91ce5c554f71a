#pragma once
// Test-only KvConnector: records what the engine asks of it and lets a test play the peer.
// A fetch (start_remote_prefill with something to fetch) stays pending until the test calls
// complete_fetch(); a hold (hold_for_remote_decode answered true) until release_hold(). Both
// queue the event and call the wakeup like a real connector's threads would. The test writes
// the "transferred" K/V itself (FakeModelRunner::write_kv) before completing a fetch.
// Thread-safe: the engine's thread and the test's threads may call it at once.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/kv_connector.h"

namespace crescent::engine::testing {

class FakeKvConnector : public KvConnector {
 public:
  struct Fetch {
    std::string request_id;
    KvTransferParams params;
    std::vector<int32_t> prompt_token_ids;
    std::vector<int32_t> block_ids;
    int num_local_tokens = 0;
    bool cancelled = false;
  };
  struct Hold {
    std::string request_id;
    KvTransferParams params;
    std::vector<int32_t> prompt_token_ids;
    std::vector<int32_t> block_ids;
  };

  // --- KvConnector (the engine's thread) ---
  void start_remote_prefill(const std::string& request_id, const KvTransferParams& params,
                            std::span<const int32_t> prompt_token_ids,
                            std::span<const int32_t> block_ids, int num_local_tokens) override {
    Fetch f{request_id,
            params,
            {prompt_token_ids.begin(), prompt_token_ids.end()},
            {block_ids.begin(), block_ids.end()},
            num_local_tokens,
            false};
    std::lock_guard<std::mutex> lock(mu_);
    if (num_local_tokens < static_cast<int>(prompt_token_ids.size()) - 1) {
      pending_fetches_[request_id] = f;  // nothing to fetch: the contract says no event
    }
    fetches_.push_back(std::move(f));
  }

  bool hold_for_remote_decode(const std::string& request_id, const KvTransferParams& params,
                              std::span<const int32_t> prompt_token_ids,
                              std::span<const int32_t> block_ids) override {
    Hold h{request_id,
           params,
           {prompt_token_ids.begin(), prompt_token_ids.end()},
           {block_ids.begin(), block_ids.end()}};
    std::lock_guard<std::mutex> lock(mu_);
    holds_.push_back(h);
    if (hold_result_) {
      pending_holds_[request_id] = std::move(h);
    }
    return hold_result_;
  }

  void fail_remote_decode(const std::string& request_id, const KvTransferParams& params,
                          const Status& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    failed_decodes_.push_back(request_id);
    last_fail_message_ = why.message();
  }

  void cancel(const std::string& request_id) override {
    bool report = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels_.push_back(request_id);
      auto it = pending_fetches_.find(request_id);
      if (it != pending_fetches_.end()) {
        it->second.cancelled = true;
        if (report_on_cancel_) {
          pending_fetches_.erase(it);
          events_.push_back({KvConnectorEvent::Kind::kRemoteKvReady, request_id,
                             cancelled("cancelled by the engine")});
          report = true;
        }
      }
    }
    if (report) {
      wake();
    }
  }

  std::vector<KvConnectorEvent> take_events() override {
    num_take_events_calls_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(events_, {});
  }

  int num_pending() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(pending_fetches_.size() + pending_holds_.size());
  }

  void set_wakeup(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    wakeup_ = std::move(fn);
  }

  // --- The test (the peer) ---
  void set_hold_result(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_result_ = hold;
  }
  // cancel() of a pending fetch reports it (status Cancelled) at once.
  void set_report_on_cancel(bool report) {
    std::lock_guard<std::mutex> lock(mu_);
    report_on_cancel_ = report;
  }
  // Ends a pending fetch with kRemoteKvReady(status). False: no such pending fetch.
  bool complete_fetch(const std::string& request_id, Status status = Status::ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_fetches_.erase(request_id) == 0) {
        return false;
      }
      events_.push_back({KvConnectorEvent::Kind::kRemoteKvReady, request_id, std::move(status)});
    }
    wake();
    return true;
  }
  // Ends a pending hold with kBlocksReleased. False: no such pending hold.
  bool release_hold(const std::string& request_id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_holds_.erase(request_id) == 0) {
        return false;
      }
      events_.push_back({KvConnectorEvent::Kind::kBlocksReleased, request_id, Status::ok()});
    }
    wake();
    return true;
  }

  std::vector<Fetch> fetches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fetches_;
  }
  std::map<std::string, Fetch> pending_fetches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_fetches_;
  }
  std::vector<Hold> holds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return holds_;
  }
  std::map<std::string, Hold> pending_holds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_holds_;
  }
  std::vector<std::string> cancels() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  std::vector<std::string> failed_decodes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_decodes_;
  }
  std::string last_fail_message() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_fail_message_;
  }
  int num_take_events_calls() const { return num_take_events_calls_.load(); }
  std::function<void()> wakeup() const {
    std::lock_guard<std::mutex> lock(mu_);
    return wakeup_;
  }

 private:
  void wake() {
    std::function<void()> fn = wakeup();
    if (fn) {
      fn();  // outside mu_, as a real connector's thread would call it
    }
  }

  mutable std::mutex mu_;
  bool hold_result_ = true;
  bool report_on_cancel_ = false;
  std::vector<Fetch> fetches_;
  std::map<std::string, Fetch> pending_fetches_;
  std::vector<Hold> holds_;
  std::map<std::string, Hold> pending_holds_;
  std::vector<std::string> cancels_;
  std::vector<std::string> failed_decodes_;
  std::string last_fail_message_;
  std::vector<KvConnectorEvent> events_;
  std::function<void()> wakeup_;
  std::atomic<int> num_take_events_calls_{0};
};

}  // namespace crescent::engine::testing
