#include "server/ec_pull.h"

#include <map>

#include "core/clock.h"
#include "core/logging.h"
#include "core/prometheus.h"

namespace crescent::server {

Result<std::vector<EcItem>> EcImagePuller::parse(const nlohmann::json& ec_transfer_params) const {
  return fetcher_->parse(ec_transfer_params);
}

void EcImagePuller::release(const std::vector<EcItem>& items) {
  if (items.empty()) {
    return;
  }
  num_items_unused_total_.fetch_add(static_cast<int64_t>(items.size()));
  fetcher_->release(items);
}

Status EcImagePuller::pull(std::vector<PreparedImage>& images, const std::vector<EcItem>& items) {
  // The first item of each mm_hash serves every image with that hash.
  std::map<std::string, size_t> item_of_hash;
  std::vector<EcItem> unused;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!item_of_hash.emplace(items[i].mm_hash, i).second) {
      unused.push_back(items[i]);
    }
  }
  std::vector<EcItem> wanted;
  std::vector<std::vector<float>> buffers;
  std::map<std::string, size_t> wanted_of_hash;
  std::string mismatch;
  for (const PreparedImage& image : images) {
    auto it = item_of_hash.find(image.mm_hash);
    if (it == item_of_hash.end() || wanted_of_hash.contains(image.mm_hash)) {
      continue;
    }
    const EcItem& item = items[it->second];
    if (item.num_tokens != image.num_tokens() || item.hidden_size != options_.hidden_size) {
      mismatch = "the encoder's tensor for image " + image.mm_hash.substr(0, 16) + " holds " +
                 std::to_string(item.num_tokens) + " x " + std::to_string(item.hidden_size) +
                 " floats, not " + std::to_string(image.num_tokens()) + " x " +
                 std::to_string(options_.hidden_size);
      break;
    }
    wanted_of_hash.emplace(image.mm_hash, wanted.size());
    wanted.push_back(item);
    buffers.emplace_back(static_cast<size_t>(item.num_tokens * item.hidden_size));
  }
  for (const auto& [hash, index] : item_of_hash) {
    if (!wanted_of_hash.contains(hash)) {
      unused.push_back(items[index]);
    }
  }
  Status status;
  if (!mismatch.empty()) {
    // Nothing is pulled: every item goes back.
    unused = items;
    wanted.clear();
    status = invalid_argument(mismatch);
  }
  release(unused);
  if (!wanted.empty()) {
    std::vector<std::span<float>> dsts(buffers.begin(), buffers.end());
    const int64_t t0 = now_ns();
    status = fetcher_->fetch(wanted, dsts);
    pull_ns_total_.fetch_add(now_ns() - t0);
  }
  if (status.is_ok()) {
    std::vector<std::shared_ptr<const std::vector<float>>> pulled;
    pulled.reserve(buffers.size());
    for (auto& b : buffers) {
      num_bytes_pulled_total_.fetch_add(static_cast<int64_t>(b.size() * sizeof(float)));
      pulled.push_back(std::make_shared<const std::vector<float>>(std::move(b)));
    }
    for (PreparedImage& image : images) {
      auto it = wanted_of_hash.find(image.mm_hash);
      if (it != wanted_of_hash.end()) {
        image.embeddings = pulled[it->second];
        image.input = nullptr;
      }
    }
    num_images_pulled_total_.fetch_add(static_cast<int64_t>(wanted.size()));
    return Status::ok();
  }
  num_pull_failures_total_.fetch_add(1);
  if (options_.fallback_local) {
    int64_t num_local = 0;
    for (const PreparedImage& image : images) {
      num_local += item_of_hash.contains(image.mm_hash) ? 1 : 0;
    }
    num_fallback_local_total_.fetch_add(num_local);
    CRESCENT_LOG(kWarn) << "pulling " << wanted.size()
                        << " image embedding(s) from an encoder failed, encoding them here: "
                        << status.to_string();
    return Status::ok();
  }
  return Status(status.code() == StatusCode::kDeadlineExceeded ? StatusCode::kDeadlineExceeded
                                                               : StatusCode::kUnavailable,
                "pulling image embeddings from the encoder failed: " + status.message());
}

void EcImagePuller::render_metrics(const std::string& model_name, std::string* out) const {
  const std::string label = "{model_name=\"" + model_name + "\"}";
  prometheus::SampleWriter w(out, "", label);
  auto counter = [&](const std::string& name, const char* help, double v) {
    w.counter(name, help, v);
  };
  counter("crescent_ec_images_pulled_total",
          "Images whose embeddings were pulled from an encoder worker instead of encoded here.",
          static_cast<double>(num_images_pulled_total_.load()));
  counter("crescent_ec_pulled_bytes_total", "Embedding bytes pulled from encoder workers.",
          static_cast<double>(num_bytes_pulled_total_.load()));
  counter("crescent_ec_pull_seconds_total", "Time requests spent pulling embeddings.",
          static_cast<double>(pull_ns_total_.load()) * 1e-9);
  counter("crescent_ec_pull_failures_total", "Requests whose pull of embeddings failed.",
          static_cast<double>(num_pull_failures_total_.load()));
  counter("crescent_ec_fallback_local_total",
          "Images encoded here because their pull failed (--ec-fallback-local).",
          static_cast<double>(num_fallback_local_total_.load()));
  counter("crescent_ec_items_unused_total",
          "ec_transfer_params items that matched no image of their request (released at once).",
          static_cast<double>(num_items_unused_total_.load()));
}

}  // namespace crescent::server
