#pragma once
// EcImagePuller: the prefill side of EPD in the server (DESIGN.md §2b). A request that carries
// ec_transfer_params gets, for each of its images whose mm_hash matches an item, the encoder's
// output pulled through the EC connector before the request reaches the engine, which then
// does not encode that image. Items that match no image are released at once; images without
// an item are encoded locally as always. A failed pull falls back to local encoding (when the
// tower is here and the flag allows it) or fails the request. Runs on the media threads.
// Thread-safe.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "server/ec_link.h"
#include "server/multimodal_processor.h"

namespace crescent::server {

struct EcPullOptions {
  bool fallback_local = true;  // encode here when a pull fails (needs the vision tower)
  int64_t hidden_size = 0;     // embedding width the engine takes
};

class EcImagePuller {
 public:
  // fetcher must outlive the puller.
  EcImagePuller(EcFetcher* fetcher, EcPullOptions options) : fetcher_(fetcher), options_(options) {}

  // InvalidArgument naming the field of ec_transfer_params that is wrong.
  Result<std::vector<EcItem>> parse(const nlohmann::json& ec_transfer_params) const;
  // Pulls the items that match images into their `embeddings` and releases the others.
  // A failed pull: OK with the images left for local encoding (fallback_local), else
  // Unavailable / DeadlineExceeded with the connector's message.
  Status pull(std::vector<PreparedImage>& images, const std::vector<EcItem>& items);
  // The request will not use them (no images, or it failed before the pull).
  void release(const std::vector<EcItem>& items);

  void render_metrics(const std::string& model_name, std::string* out) const;

 private:
  EcFetcher* fetcher_;
  EcPullOptions options_;
  std::atomic<int64_t> num_images_pulled_total_{0};
  std::atomic<int64_t> num_bytes_pulled_total_{0};
  std::atomic<int64_t> num_pull_failures_total_{0};
  std::atomic<int64_t> num_fallback_local_total_{0};  // images encoded here after a failure
  std::atomic<int64_t> num_items_unused_total_{0};    // items that matched no image
  std::atomic<int64_t> pull_ns_total_{0};
};

}  // namespace crescent::server
