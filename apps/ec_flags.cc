#include "apps/ec_flags.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "disagg/ec_protocol.h"
#include "kernels/matmul.h"
#include "model/vision_transformer.h"

namespace crescent::apps {
namespace {

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(s * 1000)));
}

// FNV-1a, 64 bits: stable across processes and builds (std::hash is not).
std::string fnv1a_hex(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h = (h ^ c) * 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(h));
  return out;
}

server::EcItem to_item(const disagg::EcTensorRef& ref) {
  server::EcItem item;
  item.mm_hash = ref.mm_hash;
  item.num_tokens = ref.shape.size() == 2 ? ref.shape[0] : 0;
  item.hidden_size = ref.shape.size() == 2 ? ref.shape[1] : 0;
  item.wire = disagg::ec_transfer_params_to_json(std::span<const disagg::EcTensorRef>(&ref, 1))
                  .at("items")
                  .at(0);
  return item;
}

// The refs of items that came from to_item() or parse(): their wire JSON parses again.
Result<std::vector<disagg::EcTensorRef>> refs_of(std::span<const server::EcItem> items) {
  nlohmann::json wire = nlohmann::json::array();
  for (const server::EcItem& item : items) {
    wire.push_back(item.wire);
  }
  return disagg::parse_ec_transfer_params(nlohmann::json{{"items", std::move(wire)}});
}

// Producer is EcProducer or EcDiskProducer: the same publish/release.
template <typename Producer>
class ProducerPublisher : public server::EcPublisher {
 public:
  ProducerPublisher(Producer* producer, std::chrono::milliseconds deadline)
      : producer_(producer), deadline_(deadline) {}
  Result<server::EcItem> publish(const std::string& mm_hash, int64_t num_tokens,
                                 int64_t hidden_size,
                                 const std::function<Status(float* dst)>& write,
                                 bool* was_cached) override {
    ASSIGN_OR_RETURN(disagg::EcTensorRef ref,
                     producer_->publish(mm_hash, num_tokens, hidden_size, write,
                                        Deadline::after(deadline_), was_cached));
    return to_item(ref);
  }
  void release(std::span<const server::EcItem> items) override {
    auto refs = refs_of(items);
    if (!refs.is_ok()) {
      return;  // ours: they parse
    }
    for (const disagg::EcTensorRef& ref : *refs) {
      (void)producer_->release(ref.reservation_id);  // NotFound: it already ended
    }
  }

 private:
  Producer* producer_;
  std::chrono::milliseconds deadline_;
};

// Consumer is EcConsumer (transfer) or EcDiskConsumer (disk): the same fetch/release.
template <typename Consumer>
class ConsumerFetcher : public server::EcFetcher {
 public:
  ConsumerFetcher(Consumer* consumer, std::chrono::milliseconds deadline, bool is_disk)
      : consumer_(consumer), deadline_(deadline), is_disk_(is_disk) {}
  Result<std::vector<server::EcItem>> parse(const nlohmann::json& params) const override {
    ASSIGN_OR_RETURN(std::vector<disagg::EcTensorRef> refs,
                     disagg::parse_ec_transfer_params(params));
    std::vector<server::EcItem> items;
    items.reserve(refs.size());
    for (size_t i = 0; i < refs.size(); ++i) {
      if (disagg::is_disk_ref(refs[i]) != is_disk_) {
        return invalid_argument("ec_transfer_params.items[" + std::to_string(i) +
                                "].worker_addr: " + refs[i].worker_addr + " is " +
                                (is_disk_ ? "an encoder's EC listener (--ec-connector transfer)"
                                          : "an encoder's directory (--ec-connector disk)") +
                                ", and this server uses --ec-connector " +
                                (is_disk_ ? "disk" : "transfer"));
      }
      server::EcItem item = to_item(refs[i]);
      item.wire = params.at("items").at(i);  // as sent: it parsed
      items.push_back(std::move(item));
    }
    return items;
  }
  Status fetch(std::span<const server::EcItem> items,
               std::span<const std::span<float>> dsts) override {
    ASSIGN_OR_RETURN(std::vector<disagg::EcTensorRef> refs, refs_of(items));
    return consumer_->fetch(refs, dsts, Deadline::after(deadline_));
  }
  void release(std::span<const server::EcItem> items) override {
    auto refs = refs_of(items);
    if (refs.is_ok()) {
      consumer_->release(*refs);
    }
  }

 private:
  Consumer* consumer_;
  std::chrono::milliseconds deadline_;
  bool is_disk_;
};

}  // namespace

void EcFlags::add_to(FlagParser& flags) {
  flags.add("ec-role", &ec_role,
            "EPD: producer (encoder worker; --role encode implies it) or consumer (pulls image "
            "embeddings named by a request's ec_transfer_params; the default for --role "
            "prefill|both of a vision-language model)");
  flags.add("ec-transport", &ec_transport,
            "how image embeddings move from encoder to prefill workers: shm, tcp, ucx");
  flags.add("ec-pool-size", &ec_pool_size,
            "encoder: bytes of the tensor pool holding encoded images until prefill workers pull "
            "them (suffixes KiB, MiB, GiB); with --ec-connector disk, the bytes its files may "
            "take in --ec-path");
  flags.add("ec-reservation-timeout-s", &ec_reservation_timeout_s,
            "encoder: seconds an encoded image stays reserved for its prefill worker before the "
            "pool takes it back");
  flags.add("ec-full-pool-wait-s", &ec_full_pool_wait_s,
            "encoder: how long a request waits for pool space when every tensor is reserved (0: "
            "answer 503 at once)");
  flags.add("ec-transfer-timeout-s", &ec_transfer_timeout_s,
            "prefill: seconds a request may spend pulling its images' embeddings");
  flags.add("ec-port", &ec_port, "encoder: port of the EC control listener (0: any free port)");
  flags.add("ec-connector", &ec_connector,
            "how encoder outputs reach prefill workers: transfer (the encoder's tensor pool, "
            "pulled through the transfer engine) or disk (safetensors files named by mm_hash in "
            "--ec-path, a directory both see; --ec-pool-size bounds its bytes)");
  flags.add("ec-path", &ec_path,
            "--ec-connector disk: the directory of encoder outputs (the encoder writes, prefill "
            "workers read)");
  flags.add("ec-fallback-local", &ec_fallback_local,
            "prefill: encode an image here when its pull fails (the default when the vision "
            "tower is loaded; --no-ec-fallback-local answers 502 instead)");
}

Status EcFlags::validate(const std::string& serve_role) {
  if (ec_role.empty()) {
    parsed_role = serve_role == "encode" ? EcRole::kProducer : EcRole::kNone;
  } else if (ec_role == "producer") {
    if (serve_role != "encode") {
      return invalid_argument("--ec-role producer is an encoder worker: use --role encode");
    }
    parsed_role = EcRole::kProducer;
  } else if (ec_role == "consumer") {
    if (serve_role == "encode" || serve_role == "decode") {
      return invalid_argument("--ec-role consumer needs --role prefill or both, not " + serve_role);
    }
    parsed_role = EcRole::kConsumer;
  } else {
    return invalid_argument("--ec-role must be producer or consumer, got '" + ec_role + "'");
  }
  auto transport = transfer::parse_transport(ec_transport);
  if (!transport.is_ok()) {
    return invalid_argument("--ec-transport: " + transport.status().message());
  }
  if (!transfer::is_transport_available(*transport)) {
    return invalid_argument("--ec-transport " + ec_transport + " is not available in this build");
  }
  parsed_transport = *transport;
  auto bytes = parse_byte_size(ec_pool_size);
  if (!bytes.is_ok()) {
    return invalid_argument("--ec-pool-size: " + bytes.status().message());
  }
  if (*bytes < (4u << 10)) {
    return invalid_argument("--ec-pool-size must be at least 4KiB, got " + ec_pool_size);
  }
  parsed_pool_bytes = *bytes;
  auto in_range = [](double s, bool allow_zero) {
    return (allow_zero ? s >= 0 : s > 0) && s <= 24 * 3600;
  };
  if (!in_range(ec_reservation_timeout_s, false) || !in_range(ec_transfer_timeout_s, false) ||
      !in_range(ec_full_pool_wait_s, true)) {
    return invalid_argument(
        "--ec-reservation-timeout-s and --ec-transfer-timeout-s must be in (0, 86400] seconds, "
        "--ec-full-pool-wait-s in [0, 86400]");
  }
  if (ec_port < 0 || ec_port > 65535) {
    return invalid_argument("--ec-port must be 0..65535");
  }
  if (ec_connector == "transfer") {
    parsed_connector = EcConnectorKind::kTransfer;
    if (!ec_path.empty()) {
      return invalid_argument("--ec-path is for --ec-connector disk");
    }
  } else if (ec_connector == "disk") {
    parsed_connector = EcConnectorKind::kDisk;
    // A decode server never touches encoder outputs; every other role may.
    if (ec_path.empty() && serve_role != "decode") {
      return invalid_argument(
          "--ec-connector disk needs --ec-path DIR (the directory the "
          "encoder writes and prefill workers read)");
    }
  } else {
    return invalid_argument("--ec-connector must be transfer or disk, got '" + ec_connector + "'");
  }
  return Status::ok();
}

std::chrono::milliseconds EcFlags::reservation_timeout() const {
  return seconds_to_ms(ec_reservation_timeout_s);
}
std::chrono::milliseconds EcFlags::full_pool_wait() const {
  return seconds_to_ms(ec_full_pool_wait_s);
}
std::chrono::milliseconds EcFlags::transfer_timeout() const {
  return seconds_to_ms(ec_transfer_timeout_s);
}

Result<uint64_t> parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    ++i;
  }
  if (i == 0 || i > 19) {
    return invalid_argument("expected a byte count such as 268435456 or 256MiB, got '" + text +
                            "'");
  }
  const uint64_t number = std::stoull(text.substr(0, i));
  std::string unit = text.substr(i);
  for (char& c : unit) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  uint64_t scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kib") {
    scale = 1ull << 10;
  } else if (unit == "m" || unit == "mib") {
    scale = 1ull << 20;
  } else if (unit == "g" || unit == "gib") {
    scale = 1ull << 30;
  } else if (unit == "kb") {
    scale = 1000;
  } else if (unit == "mb") {
    scale = 1000'000;
  } else if (unit == "gb") {
    scale = 1000'000'000;
  } else {
    return invalid_argument("unknown unit '" + text.substr(i) + "' in '" + text +
                            "' (use B, KiB, MiB, GiB, KB, MB or GB)");
  }
  if (number > (uint64_t{1} << 50) / scale) {
    return invalid_argument("'" + text + "' is too large");
  }
  return number * scale;
}

disagg::EcCompat ec_compat(const engine::LoadedEngine& loaded) {
  const model::VisionConfig& v = *loaded.config.vision;
  disagg::EcCompat compat;
  compat.vision_model =
      std::string(model::vision_architecture_name(v.architecture)) +
      " depth=" + std::to_string(v.depth) + " embed_dim=" + std::to_string(v.embed_dim) +
      " heads=" + std::to_string(v.num_heads) + " patch=" + std::to_string(v.patch_size) +
      " merge=" + std::to_string(v.spatial_merge_size);
  if (loaded.vision != nullptr) {
    // Which weights, and how they compute: another checkpoint of the same shape, or the same
    // one packed as bf16 on one side and f32 on the other, gives other embeddings.
    char fingerprint[17];
    std::snprintf(fingerprint, sizeof(fingerprint), "%016llx",
                  static_cast<unsigned long long>(loaded.vision->weights_fingerprint()));
    compat.vision_model +=
        " weights=" + std::string(kernels::weight_format_name(loaded.vision->weight_format())) +
        ":" + fingerprint;
  }
  compat.dtype = "float32";
  compat.hidden_size = v.out_hidden_size;
  // Canonical JSON, so that formatting does not matter; no file: the defaults.
  std::string processor = "default";
  if (!loaded.preprocessor_config_json.empty()) {
    auto j = nlohmann::json::parse(loaded.preprocessor_config_json, nullptr,
                                   /*allow_exceptions=*/false);
    processor = j.is_discarded() ? loaded.preprocessor_config_json : j.dump();
  }
  compat.preprocess_hash = fnv1a_hex(processor);
  return compat;
}

std::unique_ptr<server::EcPublisher> make_ec_publisher(disagg::EcProducer* producer,
                                                       std::chrono::milliseconds deadline) {
  return std::make_unique<ProducerPublisher<disagg::EcProducer>>(producer, deadline);
}

std::unique_ptr<server::EcFetcher> make_ec_fetcher(disagg::EcConsumer* consumer,
                                                   std::chrono::milliseconds deadline) {
  return std::make_unique<ConsumerFetcher<disagg::EcConsumer>>(consumer, deadline,
                                                               /*is_disk=*/false);
}

std::unique_ptr<server::EcPublisher> make_ec_publisher(disagg::EcDiskProducer* producer,
                                                       std::chrono::milliseconds deadline) {
  return std::make_unique<ProducerPublisher<disagg::EcDiskProducer>>(producer, deadline);
}

std::unique_ptr<server::EcFetcher> make_ec_fetcher(disagg::EcDiskConsumer* consumer,
                                                   std::chrono::milliseconds deadline) {
  return std::make_unique<ConsumerFetcher<disagg::EcDiskConsumer>>(consumer, deadline,
                                                                   /*is_disk=*/true);
}

}  // namespace crescent::apps
