#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace crescent::model {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("safetensors_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_raw(const std::string& p, const std::string& header, int64_t num_data_bytes,
                        uint64_t header_len_override = 0) {
    std::ofstream out(p, std::ios::binary);
    uint64_t len = header_len_override ? header_len_override : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << std::string(static_cast<size_t>(num_data_bytes), '\x01');
  }

  fs::path dir_;
};

struct OwnedTensor {
  std::vector<uint8_t> bytes;
  TensorView view;
};

OwnedTensor make_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  OwnedTensor t;
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  t.bytes.resize(static_cast<size_t>(dtype_num_bytes(dtype, n)));
  for (size_t i = 0; i < t.bytes.size(); ++i) {
    t.bytes[i] = static_cast<uint8_t>((i * 131 + name.size() * 7) & 0x3f);  // finite halves/floats
  }
  t.view = {name, dtype, std::move(shape), t.bytes.data(), static_cast<int64_t>(t.bytes.size())};
  return t;
}

TEST_F(SafetensorsTest, RoundTripEveryDtypeBitIdentical) {
  std::vector<OwnedTensor> owned;
  owned.push_back(make_tensor("model.embed_tokens.weight", DType::kBF16, {10, 8}));
  owned.push_back(make_tensor("model.norm.weight", DType::kF32, {8}));
  owned.push_back(make_tensor("lm_head.weight", DType::kF16, {10, 8}));
  owned.push_back(make_tensor("odd.weight", DType::kBF16, {3}));  // 6 bytes: later ones unaligned
  owned.push_back(make_tensor("empty.weight", DType::kF32, {0, 4}));
  std::vector<TensorView> views;
  for (const auto& t : owned)
    views.push_back(t.view);
  ASSERT_TRUE(write_safetensors(path("m.safetensors"), views, {{"format", "pt"}}).is_ok());

  // The data section starts 8-byte aligned.
  std::ifstream in(path("m.safetensors"), std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);

  auto file = SafetensorsFile::open(path("m.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_EQ((*file)->names().size(), owned.size());
  for (const auto& t : owned) {
    Result<TensorView> v = (*file)->get(t.view.name);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, t.view.dtype);
    EXPECT_EQ(v->shape, t.view.shape);
    ASSERT_EQ(v->num_bytes, t.view.num_bytes);
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), t.bytes.size()), 0) << t.view.name;
    }
  }
}

TEST_F(SafetensorsTest, StreamingWriterChecksDeclaredSizes) {
  SafetensorsWriter w(path("s.safetensors"));
  ASSERT_TRUE(w.add_tensor("a", DType::kF32, {4}).is_ok());
  EXPECT_FALSE(w.add_tensor("a", DType::kF32, {4}).is_ok());
  EXPECT_FALSE(w.add_tensor("q", DType::kQ8_0, {32}).is_ok());
  ASSERT_TRUE(w.write_header().is_ok());
  float values[4] = {1, 2, 3, 4};
  ASSERT_TRUE(w.write_data(values, 8).is_ok());
  EXPECT_EQ(w.finish().code(), StatusCode::kFailedPrecondition);  // half of "a" missing
}

TEST_F(SafetensorsTest, ShardedIndex) {
  auto a = make_tensor("model.layers.0.mlp.up_proj.weight", DType::kBF16, {4, 8});
  auto b = make_tensor("model.layers.1.mlp.up_proj.weight", DType::kF16, {4, 8});
  auto c = make_tensor("model.norm.weight", DType::kF32, {8});
  ASSERT_TRUE(
      write_safetensors(path("model-00001-of-00002.safetensors"), {a.view, c.view}).is_ok());
  ASSERT_TRUE(write_safetensors(path("model-00002-of-00002.safetensors"), {b.view}).is_ok());
  std::ofstream(path("model.safetensors.index.json")) << R"({"metadata": {"total_size": 200},
    "weight_map": {"model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
                   "model.norm.weight": "model-00001-of-00002.safetensors",
                   "model.layers.1.mlp.up_proj.weight": "model-00002-of-00002.safetensors"}})";
  auto source = open_sharded_safetensors(path("model.safetensors.index.json"));
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ((*source)->names().size(), 3u);
  for (const auto* t : {&a, &b, &c}) {
    Result<TensorView> v = (*source)->get(t->view.name);
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, t->view.dtype);
    EXPECT_EQ(std::memcmp(v->data, t->bytes.data(), t->bytes.size()), 0);
  }
  EXPECT_EQ((*source)->get("lm_head.weight").status().code(), StatusCode::kNotFound);

  // An index naming the wrong shard is caught at open.
  std::ofstream(path("bad.index.json")) << R"({"weight_map": {
    "model.norm.weight": "model-00002-of-00002.safetensors"}})";
  auto bad = open_sharded_safetensors(path("bad.index.json"));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("model.norm.weight"), std::string::npos);
}

TEST_F(SafetensorsTest, TruncatedFileIsDataLossNamingFileAndTensor) {
  auto a = make_tensor("model.embed_tokens.weight", DType::kBF16, {16, 8});
  auto b = make_tensor("model.layers.0.self_attn.q_proj.weight", DType::kBF16, {8, 8});
  ASSERT_TRUE(write_safetensors(path("t.safetensors"), {a.view, b.view}).is_ok());
  fs::resize_file(path("t.safetensors"), fs::file_size(path("t.safetensors")) - 10);
  auto file = SafetensorsFile::open(path("t.safetensors"));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("t.safetensors"), std::string::npos);
  EXPECT_NE(file.status().message().find("model.layers.0.self_attn.q_proj.weight"),
            std::string::npos)
      << file.status().message();
  EXPECT_NE(file.status().message().find("truncated"), std::string::npos);
}

TEST_F(SafetensorsTest, HeaderLengthOverflowingTheFile) {
  write_raw(path("h.safetensors"),
            R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4,
            /*header_len_override=*/uint64_t{1} << 62);
  auto file = SafetensorsFile::open(path("h.safetensors"));
  ASSERT_FALSE(file.is_ok());
  EXPECT_EQ(file.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(file.status().message().find("header length"), std::string::npos);

  std::ofstream(path("short.safetensors")) << "abc";
  EXPECT_EQ(SafetensorsFile::open(path("short.safetensors")).status().code(),
            StatusCode::kDataLoss);
}

TEST_F(SafetensorsTest, BadOffsetsAreRejected) {
  struct Case {
    const char* header;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1000]}})", "past the end"},
      {R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}})", "reversed"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", "needs 8"},
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       "overlap"},
      {R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", "shape"},
      {R"({"w": {"dtype": "F32", "shape": [2]}})", "data_offsets"},
      {R"([1, 2])", "not a JSON object"},
      {R"({"w": )", "not valid JSON"},
  };
  for (const Case& c : cases) {
    write_raw(path("o.safetensors"), c.header, 16);
    auto file = SafetensorsFile::open(path("o.safetensors"));
    ASSERT_FALSE(file.is_ok()) << c.header;
    EXPECT_EQ(file.status().code(), StatusCode::kDataLoss) << c.header;
    EXPECT_NE(file.status().message().find(c.expect), std::string::npos)
        << c.header << " -> " << file.status().message();
  }
}

TEST_F(SafetensorsTest, UnsupportedDtypeNamesTensorAndDtype) {
  write_raw(path("i.safetensors"),
            R"({"position_ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16);
  auto file = SafetensorsFile::open(path("i.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();  // harmless until someone asks for it
  Result<TensorView> v = (*file)->get("position_ids");
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(v.status().message().find("position_ids"), std::string::npos);
  EXPECT_NE(v.status().message().find("I64"), std::string::npos);
}

TEST_F(SafetensorsTest, RequireTensorErrorsNameTheTensor) {
  auto q = make_tensor("model.layers.3.self_attn.q_proj.weight", DType::kBF16, {64, 32});
  ASSERT_TRUE(write_safetensors(path("r.safetensors"), {q.view}).is_ok());
  auto file = SafetensorsFile::open(path("r.safetensors"));
  ASSERT_TRUE(file.is_ok());
  Result<TensorView> v = require_tensor(**file, "model.layers.3.self_attn.q_proj.weight", {64, 64});
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().message(),
            "model.layers.3.self_attn.q_proj.weight has shape [64, 32], expected [64, 64]");
  v = require_tensor(**file, "model.layers.3.self_attn.k_proj.weight", {64, 64});
  ASSERT_FALSE(v.is_ok());
  EXPECT_EQ(v.status().code(), StatusCode::kNotFound);
  EXPECT_NE(v.status().message().find("model.layers.3.self_attn.k_proj.weight"), std::string::npos);
  EXPECT_TRUE(require_tensor(**file, "model.layers.3.self_attn.q_proj.weight", {64, 32}).is_ok());
}

}  // namespace
}  // namespace crescent::model
