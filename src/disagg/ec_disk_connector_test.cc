// The disk EC connector: round trip through a directory, atomic writes, bad files refused
// naming them, the byte bound with LRU deletion, reserved files never deleted, and the disk
// form of ec_transfer_params.

#include "disagg/ec_disk_connector.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "model/safetensors.h"

namespace crescent::disagg {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kTokens = 16;
constexpr int64_t kHidden = 64;

EcCompat test_compat() {
  EcCompat c;
  c.vision_model = "qwen2_vl depth=2";
  c.dtype = "float32";
  c.hidden_size = kHidden;
  c.preprocess_hash = "abc123";
  return c;
}

class EcDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("crescent_ec_disk_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<EcDiskProducer> producer(
      uint64_t max_bytes = 1 << 20,
      std::chrono::milliseconds reservation_timeout = std::chrono::milliseconds(30'000),
      std::chrono::milliseconds full_pool_wait = std::chrono::milliseconds(0)) {
    EcDiskProducerOptions o;
    o.engine_id = "encode-test";
    o.dir = dir_.string();
    o.max_bytes = max_bytes;
    o.reservation_timeout = reservation_timeout;
    o.full_pool_wait = full_pool_wait;
    o.compat = test_compat();
    auto p = EcDiskProducer::create(o);
    EXPECT_TRUE(p.is_ok()) << p.status().to_string();
    return p.is_ok() ? std::move(p).value() : nullptr;
  }
  std::unique_ptr<EcDiskConsumer> consumer(EcCompat compat = test_compat()) {
    EcDiskConsumerOptions o;
    o.dir = dir_.string();
    o.compat = compat;
    auto c = EcDiskConsumer::create(o);
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    return c.is_ok() ? std::move(c).value() : nullptr;
  }
  static std::function<Status(float*)> fill(float seed, int* num_calls = nullptr) {
    return [seed, num_calls](float* dst) {
      if (num_calls != nullptr)
        ++*num_calls;
      for (int64_t i = 0; i < kTokens * kHidden; ++i) {
        dst[i] = seed + static_cast<float>(i) * 0.25f;
      }
      return Status::ok();
    };
  }
  Result<EcTensorRef> publish(EcDiskProducer& p, const std::string& mm_hash, float seed,
                              int* num_calls = nullptr, bool* was_cached = nullptr) {
    return p.publish(mm_hash, kTokens, kHidden, fill(seed, num_calls), Deadline::after_ms(5000),
                     was_cached);
  }
  Status fetch(EcDiskConsumer& c, const EcTensorRef& ref, std::vector<float>* out) {
    out->assign(static_cast<size_t>(kTokens * kHidden), -1.0f);
    std::span<float> dst(*out);
    return c.fetch(std::span<const EcTensorRef>(&ref, 1),
                   std::span<const std::span<float>>(&dst, 1), Deadline::after_ms(5000));
  }
  bool exists(const std::string& mm_hash) const {
    return fs::exists(ec_disk_file_path(dir_.string(), mm_hash));
  }
  int num_temp_files() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) {
      n += e.path().extension() == ".tmp" ? 1 : 0;
    }
    return n;
  }

  fs::path dir_;
};

TEST_F(EcDiskTest, RoundTripThroughTheDirectory) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p && c);
  int num_calls = 0;
  bool was_cached = true;
  auto ref = publish(*p, "aaaa", 1.0f, &num_calls, &was_cached);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  EXPECT_FALSE(was_cached);
  EXPECT_EQ(num_calls, 1);
  EXPECT_EQ(ref->worker_addr, "file://" + fs::absolute(dir_).lexically_normal().string());
  EXPECT_TRUE(is_disk_ref(*ref));
  EXPECT_EQ(ref->shape, (std::vector<int64_t>{kTokens, kHidden}));
  EXPECT_EQ(ref->num_bytes, static_cast<uint64_t>(kTokens * kHidden * 4));
  EXPECT_GT(ref->reservation_id, 0u);
  EXPECT_TRUE(exists("aaaa"));

  // The file is a plain safetensors file with the compat metadata.
  auto file = model::SafetensorsFile::open(ec_disk_file_path(dir_.string(), "aaaa"));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata().at("format"), kEcDiskFormat);
  EXPECT_EQ((*file)->metadata().at("hidden_size"), std::to_string(kHidden));
  EXPECT_EQ((*file)->metadata().at("mm_hash"), "aaaa");

  // Through the wire form, as a prefill worker gets it.
  auto parsed =
      parse_ec_transfer_params(ec_transfer_params_to_json(std::span<const EcTensorRef>(&*ref, 1)));
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  std::vector<float> out;
  ASSERT_TRUE(fetch(*c, (*parsed)[0], &out).is_ok());
  for (int64_t i = 0; i < kTokens * kHidden; ++i) {
    ASSERT_EQ(out[i], 1.0f + static_cast<float>(i) * 0.25f) << i;
  }
  EXPECT_EQ(c->metrics().num_tensors, 1u);

  // The same image again: not written again, another reservation.
  auto again = publish(*p, "aaaa", 9.0f, &num_calls, &was_cached);
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(was_cached);
  EXPECT_EQ(num_calls, 1);
  EXPECT_NE(again->reservation_id, ref->reservation_id);
  EXPECT_EQ(p->metrics().num_reservations, 2);
  // Release deletes nothing.
  c->release(std::span<const EcTensorRef>(&*again, 1));
  EXPECT_TRUE(exists("aaaa"));
  EXPECT_TRUE(p->release(again->reservation_id).is_ok());
  EXPECT_EQ(p->release(again->reservation_id).code(), StatusCode::kNotFound);
}

TEST_F(EcDiskTest, WritesAreAtomic) {
  auto p = producer();
  ASSERT_TRUE(p);
  // While the encoder writes, the final name does not exist yet.
  bool seen_early = true;
  auto ref = p->publish(
      "bbbb", kTokens, kHidden,
      [&](float* dst) {
        seen_early = exists("bbbb");
        return fill(2.0f)(dst);
      },
      Deadline::after_ms(5000));
  ASSERT_TRUE(ref.is_ok());
  EXPECT_FALSE(seen_early);
  EXPECT_TRUE(exists("bbbb"));
  EXPECT_EQ(num_temp_files(), 0);

  // A failed encode leaves neither the file nor a temp file.
  auto failed = p->publish(
      "cccc", kTokens, kHidden, [](float*) { return internal_error("tower broke"); },
      Deadline::after_ms(5000));
  EXPECT_FALSE(failed.is_ok());
  EXPECT_NE(failed.status().message().find("tower broke"), std::string::npos);
  EXPECT_FALSE(exists("cccc"));
  EXPECT_EQ(num_temp_files(), 0);
  EXPECT_FALSE(p->holds("cccc"));

  // Readers racing a rewrite of the same name see a whole file every time: rename replaces
  // it atomically (the old file stays readable through its open mapping).
  auto c = consumer();
  std::atomic<bool> stop{false};
  std::atomic<int> num_bad{0};
  std::thread reader([&] {
    std::vector<float> out;
    while (!stop.load()) {
      Status s = fetch(*c, *ref, &out);
      if (!s.is_ok() && s.code() != StatusCode::kNotFound) {
        ++num_bad;
      }
    }
  });
  for (int i = 0; i < 50; ++i) {
    // Deleting it behind the ledger's back makes the next publish write it again.
    fs::remove(ec_disk_file_path(dir_.string(), "bbbb"));
    ASSERT_TRUE(publish(*p, "bbbb", 2.0f).is_ok());
  }
  stop = true;
  reader.join();
  EXPECT_EQ(num_bad.load(), 0);
  EXPECT_EQ(num_temp_files(), 0);
}

TEST_F(EcDiskTest, BadFilesAreRefusedNamingThem) {
  auto p = producer();
  auto c = consumer();
  ASSERT_TRUE(p && c);
  auto ref = publish(*p, "dddd", 3.0f);
  ASSERT_TRUE(ref.is_ok());
  const std::string path = ec_disk_file_path(dir_.string(), "dddd");
  std::vector<float> out;

  // Missing.
  EcTensorRef missing = *ref;
  missing.mm_hash = "eeee";
  Status s = fetch(*c, missing, &out);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(ec_disk_file_path(dir_.string(), "eeee")), std::string::npos)
      << s.to_string();

  // Another model's embeddings.
  EcCompat other = test_compat();
  other.preprocess_hash = "zzz";
  s = fetch(*consumer(other), *ref, &out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("preprocess_hash"), std::string::npos) << s.to_string();

  // A shape the item does not say.
  EcTensorRef wrong_shape = *ref;
  wrong_shape.shape = {kTokens / 2, kHidden};
  wrong_shape.num_bytes /= 2;
  std::vector<float> half(static_cast<size_t>(kTokens / 2 * kHidden));
  std::span<float> half_dst(half);
  s = c->fetch(std::span<const EcTensorRef>(&wrong_shape, 1),
               std::span<const std::span<float>>(&half_dst, 1), Deadline::after_ms(5000));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();

  // Truncated, then garbage.
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 100);
  s = fetch(*c, *ref, &out);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();
  std::ofstream(path, std::ios::trunc) << "not a safetensors file at all";
  s = fetch(*c, *ref, &out);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();

  // A safetensors file that is not ours.
  std::vector<float> data(static_cast<size_t>(kTokens * kHidden), 1.0f);
  model::TensorView view;
  view.name = "embeddings";
  view.shape = {kTokens, kHidden};
  view.data = data.data();
  view.num_bytes = static_cast<int64_t>(data.size() * 4);
  ASSERT_TRUE(model::write_safetensors(path, {view}).is_ok());
  s = fetch(*c, *ref, &out);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find(path), std::string::npos) << s.to_string();

  // A transfer connector's item is not read as a file.
  EcTensorRef transfer = *ref;
  transfer.worker_addr = "tcp://127.0.0.1:7000";
  s = fetch(*c, transfer, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--ec-connector disk"), std::string::npos) << s.to_string();
  EXPECT_EQ(c->metrics().num_failures, 6u);
}

TEST_F(EcDiskTest, BoundIsKeptByDeletingLeastRecentlyUsedFiles) {
  // Two files fit, three do not (each is 4 KiB of data plus a few hundred bytes of header).
  auto p = producer(10'000);
  ASSERT_TRUE(p);
  auto a = publish(*p, "aaaa", 1.0f);
  auto b = publish(*p, "bbbb", 2.0f);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_TRUE(p->release(a->reservation_id).is_ok());
  ASSERT_TRUE(p->release(b->reservation_id).is_ok());
  // a is used again (a cache hit), so b is the least recently used.
  auto a2 = publish(*p, "aaaa", 1.0f);
  ASSERT_TRUE(a2.is_ok());
  ASSERT_TRUE(p->release(a2->reservation_id).is_ok());
  auto c = publish(*p, "cccc", 3.0f);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_TRUE(exists("aaaa"));
  EXPECT_FALSE(exists("bbbb"));
  EXPECT_TRUE(exists("cccc"));
  const EcDiskProducerMetrics m = p->metrics();
  EXPECT_EQ(m.num_evictions, 1u);
  EXPECT_EQ(m.num_files, 2);
  EXPECT_LE(m.bytes_used, 10'000u);
  EXPECT_EQ(m.bytes_used, fs::file_size(ec_disk_file_path(dir_.string(), "aaaa")) +
                              fs::file_size(ec_disk_file_path(dir_.string(), "cccc")));
  // An image bigger than the whole bound is refused as such.
  auto huge = p->publish("ffff", 1000, kHidden, fill(0), Deadline::after_ms(1000));
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(EcDiskTest, ReservedFilesAreNeverDeleted) {
  // The reservations must outlive three publishes on a loaded machine under TSan (300 ms did
  // not always).
  auto p = producer(10'000, std::chrono::milliseconds(2000));
  ASSERT_TRUE(p);
  ASSERT_TRUE(publish(*p, "aaaa", 1.0f).is_ok());
  ASSERT_TRUE(publish(*p, "bbbb", 2.0f).is_ok());
  // Both reserved: a third is refused, and both files stay.
  auto c = publish(*p, "cccc", 3.0f);
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("full"), std::string::npos) << c.status().to_string();
  EXPECT_TRUE(exists("aaaa"));
  EXPECT_TRUE(exists("bbbb"));
  EXPECT_FALSE(exists("cccc"));
  EXPECT_EQ(p->metrics().num_refusals, 1u);
  EXPECT_EQ(p->metrics().num_evictions, 0u);

  // Reservations end only by expiry (the consumer cannot tell the encoder); then room is made.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  p->expire_now();
  EXPECT_EQ(p->metrics().num_reservations, 0);
  EXPECT_EQ(p->metrics().num_expired_reservations, 2u);
  ASSERT_TRUE(publish(*p, "cccc", 3.0f).is_ok());
  EXPECT_EQ(p->metrics().num_evictions, 1u);
}

TEST_F(EcDiskTest, AFullDirectoryWaitsForExpiryWhenAsked) {
  auto p = producer(10'000, std::chrono::milliseconds(200), std::chrono::milliseconds(2000));
  ASSERT_TRUE(p);
  ASSERT_TRUE(publish(*p, "aaaa", 1.0f).is_ok());
  ASSERT_TRUE(publish(*p, "bbbb", 2.0f).is_ok());
  const TimePoint start = Clock::now();
  auto c = publish(*p, "cccc", 3.0f);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_TRUE(exists("cccc"));
}

TEST_F(EcDiskTest, OneWriteForConcurrentPublishesOfOneImage) {
  auto p = producer();
  ASSERT_TRUE(p);
  std::atomic<int> num_calls{0};
  std::vector<std::thread> threads;
  std::atomic<int> num_ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = p->publish(
          "aaaa", kTokens, kHidden,
          [&](float* dst) {
            ++num_calls;
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            return fill(1.0f)(dst);
          },
          Deadline::after_ms(5000));
      num_ok += r.is_ok() ? 1 : 0;
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_calls.load(), 1);
  EXPECT_EQ(num_ok.load(), 8);
  EXPECT_EQ(p->metrics().num_reservations, 8);
}

TEST(EcDiskParams, DiskItemsParseStrictly) {
  EcTensorRef r;
  r.mm_hash = "0123abcdef";
  r.engine_id = "encode-1";
  r.worker_addr = "file:///tmp/ec";
  r.reservation_id = 7;
  r.shape = {4, 8};
  r.num_bytes = 4 * 8 * 4;
  nlohmann::json j = ec_transfer_params_to_json(std::span<const EcTensorRef>(&r, 1));
  auto parsed = parse_ec_transfer_params(j);
  ASSERT_TRUE(parsed.is_ok()) << parsed.status().to_string();
  EXPECT_TRUE(is_disk_ref((*parsed)[0]));
  EXPECT_EQ((*parsed)[0].worker_addr, "file:///tmp/ec");

  auto refused = [&](const char* field, const nlohmann::json& value, const char* expect_field) {
    nlohmann::json bad = j;
    bad["items"][0][field] = value;
    auto p = parse_ec_transfer_params(bad);
    EXPECT_FALSE(p.is_ok()) << value.dump();
    EXPECT_NE(p.status().message().find(expect_field), std::string::npos) << p.status().to_string();
  };
  refused("worker_addr", "file://relative/dir", "items[0].worker_addr");
  refused("worker_addr", "file://", "items[0].worker_addr");
  refused("worker_addr", "http://x:1", "items[0].worker_addr");
  refused("mm_hash", "../../etc/passwd", "items[0].mm_hash");
  refused("mm_hash", "a.b", "items[0].mm_hash");
  // The transfer form still has no file-name restriction on mm_hash.
  nlohmann::json tcp = j;
  tcp["items"][0]["worker_addr"] = "tcp://127.0.0.1:9000";
  tcp["items"][0]["mm_hash"] = "a.b";
  EXPECT_TRUE(parse_ec_transfer_params(tcp).is_ok());
}

}  // namespace
}  // namespace crescent::disagg
