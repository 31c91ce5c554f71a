// EcConsumer finding its encoder through the bootstrap server: an item's engine_id resolved
// through its bootstrap_addr (the encoder registered with role "encode") wins over its
// worker_addr; an unreachable bootstrap falls back to worker_addr; EC_HELLO_OK still has to
// name the item's engine_id.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap_client.h"
#include "bootstrap/bootstrap_server.h"
#include "disagg/ec_consumer.h"
#include "disagg/ec_producer.h"

namespace crescent::disagg {
namespace {

constexpr int64_t kTokens = 4;
constexpr int64_t kHidden = 32;

EcCompat test_compat() {
  EcCompat c;
  c.vision_model = "test-vit";
  c.hidden_size = kHidden;
  c.preprocess_hash = "pp-1";
  return c;
}

class EcConsumerResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bootstrap::BootstrapServerOptions bo;
    bo.port = 0;
    auto server = bootstrap::BootstrapServer::start(bo);
    ASSERT_TRUE(server.is_ok()) << server.status().to_string();
    bootstrap_ = std::move(server).value();

    EcProducerOptions po;
    po.engine_id = "encode-1";
    po.transport = transfer::TransportKind::kTcp;
    po.pool_bytes = 1 << 20;
    po.compat = test_compat();
    po.bootstrap_addr = bootstrap_->url();
    auto producer = EcProducer::create(po);
    ASSERT_TRUE(producer.is_ok()) << producer.status().to_string();
    producer_ = std::move(producer).value();

    bootstrap::WorkerRegistration reg;
    reg.engine_id = "encode-1";
    reg.addr = producer_->worker_addr();
    reg.role = std::string(bootstrap::kEncodeRole);
    ASSERT_TRUE(
        bootstrap::register_worker(bootstrap_->url(), reg, Deadline::after_ms(5000)).is_ok());

    resolver_ = std::make_shared<bootstrap::EngineResolver>();
    EcConsumerOptions co;
    co.transport = transfer::TransportKind::kTcp;
    co.timeout = std::chrono::milliseconds(5000);
    co.compat = test_compat();
    co.resolve = [r = resolver_](const std::string& url, const std::string& engine_id,
                                 Deadline deadline) {
      return r->resolve_encoder(url, engine_id, deadline);
    };
    auto consumer = EcConsumer::create(co);
    ASSERT_TRUE(consumer.is_ok()) << consumer.status().to_string();
    consumer_ = std::move(consumer).value();
  }

  EcTensorRef publish(const std::string& mm_hash) {
    auto ref = producer_->publish(
        mm_hash, kTokens, kHidden,
        [](float* dst) {
          for (int64_t i = 0; i < kTokens * kHidden; ++i) {
            dst[i] = static_cast<float>(i) + 0.5f;
          }
          return Status::ok();
        },
        Deadline::after_ms(5000));
    CRESCENT_CHECK(ref.is_ok()) << ref.status().to_string();
    return *ref;
  }

  Status fetch(const EcTensorRef& ref) {
    out_.assign(static_cast<size_t>(kTokens * kHidden), 0.0f);
    std::span<float> dst(out_);
    return consumer_->fetch(std::span<const EcTensorRef>(&ref, 1),
                            std::span<const std::span<float>>(&dst, 1), Deadline::after_ms(5000));
  }

  std::unique_ptr<bootstrap::BootstrapServer> bootstrap_;
  std::unique_ptr<EcProducer> producer_;
  std::shared_ptr<bootstrap::EngineResolver> resolver_;
  std::unique_ptr<EcConsumer> consumer_;
  std::vector<float> out_;
};

TEST_F(EcConsumerResolveTest, TheBootstrapsAnswerWinsOverWorkerAddr) {
  EcTensorRef ref = publish("h1");
  EXPECT_EQ(ref.bootstrap_addr, bootstrap_->url());
  // Nothing listens there: only the bootstrap's answer reaches the encoder.
  ref.worker_addr = "tcp://127.0.0.1:1";
  Status s = fetch(ref);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(out_[5], 5.5f);
  EXPECT_EQ(resolver_->num_queries(), 1);
  // Cached per engine id.
  EcTensorRef again = publish("h2");
  again.worker_addr = "tcp://127.0.0.1:1";
  ASSERT_TRUE(fetch(again).is_ok());
  EXPECT_EQ(resolver_->num_queries(), 1);
  EXPECT_EQ(consumer_->metrics().num_resolve_failures, 0u);
}

TEST_F(EcConsumerResolveTest, AnUnreachableBootstrapFallsBackToWorkerAddr) {
  EcTensorRef ref = publish("h3");
  ref.bootstrap_addr = "http://127.0.0.1:1";
  Status s = fetch(ref);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(consumer_->metrics().num_resolve_failures, 1u);
  // Without a bootstrap_addr the resolver is not asked.
  EcTensorRef plain = publish("h4");
  plain.bootstrap_addr.clear();
  const int64_t before = resolver_->num_queries();
  ASSERT_TRUE(fetch(plain).is_ok());
  EXPECT_EQ(resolver_->num_queries(), before);
}

TEST_F(EcConsumerResolveTest, TheEncoderMustBeTheEngineTheItemNames) {
  // Another engine id registered at this encoder's address: EC_HELLO_OK names encode-1.
  bootstrap::WorkerRegistration reg;
  reg.engine_id = "encode-2";
  reg.addr = producer_->worker_addr();
  reg.role = std::string(bootstrap::kEncodeRole);
  ASSERT_TRUE(bootstrap::register_worker(bootstrap_->url(), reg, Deadline::after_ms(5000)).is_ok());
  EcTensorRef ref = publish("h5");
  ref.engine_id = "encode-2";
  ref.worker_addr = "tcp://127.0.0.1:1";
  Status s = fetch(ref);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.to_string();
  EXPECT_NE(s.message().find("encode-1"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace crescent::disagg
