// crescent's Qwen2-VL / Qwen2.5-VL path against the independent float64 numpy reference
// (tests/vl/qwen2_vl_reference.py, written from transformers, not from crescent):
//
//   for each tiny VL preset, with F32 weights everywhere (F32 files, F32 packed matrices, so the
//   only differences are float32 rounding):
//   - the vision tower + merger output of two images (grids chosen so Qwen2.5-VL's windows are
//     uneven and include the padding quirk's empty windows);
//   - the M-RoPE positions of a prompt holding both images (exactly) and the position delta;
//   - the last prompt position's logits after the image embeddings are scattered in;
//   - three decode steps at position index + delta;
//   each within kRelTol = max|crescent - reference| / max|reference| over the tensor.
//   The same prompt is then run from the GGUF pair (model.gguf + mmproj.gguf), which holds F32
//   too, against the same reference, and its greedy tokens must equal the HF files'.
//
// A failure of the reference program fails the test; it is never skipped.
// CRESCENT_VL_MUTATION=<name> runs crescent with a deliberate bug (see kMutations) so one can
// check that the comparison catches it: every test must then fail.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/file.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/multimodal.h"
#include "engine/transformer_runner.h"
#include "model/make_model.h"
#include "model/model_files.h"
#include "model/tensor_source.h"
#include "model/transformer.h"
#include "model/vision_transformer.h"

namespace crescent {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTol = 1e-4;
constexpr int kBlockSize = 16;
const std::vector<int32_t> kDecodeTokens = {100, 200, 300};

// ----------------------------------------------------------------------------------- .npy I/O
// NumPy's format 1.0: magic, version, u16 header length, a Python dict literal padded with
// spaces to a multiple of 64 bytes and ended by '\n', then the raw little-endian C-order data.

Status write_npy_f32(const fs::path& path, const std::vector<int64_t>& shape,
                     const std::vector<float>& data) {
  std::string dims;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
  }
  if (shape.size() != 1 && !dims.empty()) {
    dims.resize(dims.size() - 1);  // "(3, 4)" but "(5,)"
  }
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  out.close();
  if (!out) {
    return internal_error("cannot write " + path.string());
  }
  return Status::ok();
}

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // '<f4' or '<i8' data, widened

  int64_t num_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) {
      n *= d;
    }
    return n;
  }
};

Result<NpyArray> read_npy(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string raw, read_file(path.string()));
  if (raw.size() < 10 || raw.compare(0, 6, "\x93NUMPY") != 0) {
    return invalid_argument(path.string() + " is not a .npy file");
  }
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(raw[i]); };
  size_t header_len = 0;
  size_t data_start = 0;
  if (byte(6) == 1) {
    header_len = byte(8) | (size_t{byte(9)} << 8);
    data_start = 10 + header_len;
  } else {
    header_len =
        byte(8) | (size_t{byte(9)} << 8) | (size_t{byte(10)} << 16) | (size_t{byte(11)} << 24);
    data_start = 12 + header_len;
  }
  if (data_start > raw.size()) {
    return invalid_argument(path.string() + ": truncated header");
  }
  const std::string header = raw.substr(data_start - header_len, header_len);
  const bool is_f4 = header.find("'descr': '<f4'") != std::string::npos;
  const bool is_i8 = header.find("'descr': '<i8'") != std::string::npos;
  if ((!is_f4 && !is_i8) || header.find("'fortran_order': False") == std::string::npos) {
    return invalid_argument(path.string() + ": want little-endian f4/i8 in C order: " + header);
  }
  NpyArray a;
  const size_t open = header.find("'shape': (");
  const size_t close = header.find(')', open);
  if (open == std::string::npos || close == std::string::npos) {
    return invalid_argument(path.string() + ": no shape in " + header);
  }
  std::stringstream dims(header.substr(open + 10, close - open - 10));
  std::string dim;
  while (std::getline(dims, dim, ',')) {
    if (dim.find_first_not_of(' ') != std::string::npos) {
      a.shape.push_back(std::stoll(dim));
    }
  }
  const int64_t n = a.num_elements();
  const size_t item = is_f4 ? 4 : 8;
  if (raw.size() - data_start != static_cast<size_t>(n) * item) {
    return invalid_argument(path.string() + ": data size does not match the shape");
  }
  a.values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* p = raw.data() + data_start + static_cast<size_t>(i) * item;
    if (is_f4) {
      float f = 0;
      std::memcpy(&f, p, 4);
      a.values[static_cast<size_t>(i)] = f;
    } else {
      int64_t v = 0;
      std::memcpy(&v, p, 8);
      a.values[static_cast<size_t>(i)] = static_cast<double>(v);
    }
  }
  return a;
}

// ----------------------------------------------------------------------------------- prompt
struct Grid {
  int t = 1;
  int h = 0;  // in ViT patches
  int w = 0;
};

struct Prompt {
  std::vector<int32_t> token_ids;
  // Each image: placeholder offset / count, LLM grid, and its encoder input (ViT grid and
  // [t*h*w][patch_dim] pixel values, uniform in [-2, 2]).
  std::vector<engine::MultiModalItem> items;
};

// splitmix64: the same values on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  float uniform(float lo, float hi) {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53);
  }

 private:
  uint64_t state_;
};

// text, <vision_start> image 0 pads <vision_end>, text, <vision_start> image 1 pads
// <vision_end>, text.
Prompt build_prompt(const model::ModelConfig& config, const std::vector<Grid>& grids) {
  const model::VisionConfig& v = *config.vision;
  const std::vector<std::vector<int32_t>> text = {
      {1000, 2000, 3000, 4000}, {5000, 6000, 7000}, {8000, 9000, 10000, 11000}};
  Prompt p;
  Rng rng(1234);
  p.token_ids = text[0];
  for (size_t i = 0; i < grids.size(); ++i) {
    const Grid g = grids[i];
    auto input = std::make_shared<engine::EncoderInput>();
    input->grid_t = g.t;
    input->grid_h = g.h;
    input->grid_w = g.w;
    input->pixel_values.resize(static_cast<size_t>(g.t) * g.h * g.w * v.patch_dim());
    for (float& x : input->pixel_values) {
      x = rng.uniform(-2.0f, 2.0f);
    }

    p.token_ids.push_back(config.vision_start_token_id);
    engine::MultiModalItem item;
    item.mm_hash = "image" + std::to_string(i);
    item.offset = static_cast<int>(p.token_ids.size());
    item.llm_grid_t = g.t;
    item.llm_grid_h = g.h / v.spatial_merge_size;
    item.llm_grid_w = g.w / v.spatial_merge_size;
    item.num_tokens = item.llm_grid_t * item.llm_grid_h * item.llm_grid_w;
    item.input = std::move(input);
    p.token_ids.insert(p.token_ids.end(), static_cast<size_t>(item.num_tokens),
                       config.image_token_id);
    p.token_ids.push_back(config.vision_end_token_id);
    p.items.push_back(std::move(item));
    const std::vector<int32_t>& after = text[std::min(i + 1, text.size() - 1)];
    p.token_ids.insert(p.token_ids.end(), after.begin(), after.end());
  }
  return p;
}

// ----------------------------------------------------------------------------------- mutations
// Deliberate bugs, selected by CRESCENT_VL_MUTATION, to show that the comparison catches them.
//   mrope_sections  the decoder turns rotary pairs with mrope_section {3, 2, 3} instead of
//                   {2, 3, 3} (the temporal and height sections swapped)
//   merger_ln       the merger's ln_q loses its affine part (weight 1, bias 0)
//   positions       the height and width rows of the M-RoPE positions swapped
//   window          Qwen2.5-VL's window_size doubled (4x4 merged tokens per window, not 2x2)
//   scatter_shift   each image's embeddings scattered one row late (its last row dropped)
std::string mutation() {
  const char* m = std::getenv("CRESCENT_VL_MUTATION");
  return m == nullptr ? "" : m;
}

// A TensorSource that serves `base` but replaces some tensors by owned values.
class PatchedSource : public model::TensorSource {
 public:
  explicit PatchedSource(const model::TensorSource& base) : base_(base) {}
  void replace(const std::string& name, float value) {
    Result<model::TensorView> view = base_.get(name);
    CRESCENT_CHECK(view.is_ok()) << view.status().to_string();
    auto& data = patched_[name];
    data.assign(static_cast<size_t>(view->num_elements()), value);
  }
  Result<model::TensorView> get(const std::string& hf_name) const override {
    ASSIGN_OR_RETURN(model::TensorView view, base_.get(hf_name));
    auto it = patched_.find(hf_name);
    if (it != patched_.end()) {
      view.dtype = DType::kF32;
      view.data = it->second.data();
      view.num_bytes = static_cast<int64_t>(it->second.size() * sizeof(float));
    }
    return view;
  }
  std::vector<std::string> names() const override { return base_.names(); }

 private:
  const model::TensorSource& base_;
  std::map<std::string, std::vector<float>> patched_;
};

// ----------------------------------------------------------------------------------- crescent
struct CrescentRun {
  std::vector<std::vector<float>> embeddings;  // per image [tokens][hidden]
  std::vector<int32_t> positions3;             // [token][3]
  int delta = 0;
  std::vector<float> last_logits;                 // [vocab], the prompt in one step
  std::vector<std::vector<float>> decode_logits;  // per decode step [vocab]
  std::vector<float> stepped_logits;              // [prompt token][vocab], one token a step
};

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Encodes the prompt's images with the tower of `files`, then runs the prompt (embeddings
// scattered over the placeholders, M-RoPE positions) and kDecodeTokens through the decoder
// with F32 weights.
Result<CrescentRun> run_crescent(model::ModelFiles files, const Prompt& prompt, ThreadPool& pool) {
  CrescentRun run;
  const std::string mut = mutation();
  if (!files.config.vision) {
    return invalid_argument("the model has no vision tower");
  }
  {
    const model::TensorSource& tower_source =
        files.vision_tensors ? *files.vision_tensors : *files.tensors;
    PatchedSource patched(tower_source);
    if (mut == "merger_ln") {
      patched.replace("visual.merger.ln_q.weight", 1.0f);
      if (files.config.vision->architecture == model::VisionArchitecture::kQwen2Vl) {
        patched.replace("visual.merger.ln_q.bias", 0.0f);
      }
    }
    if (mut == "window") {
      files.config.vision->window_size *= 2;
    }
    model::VisionTransformerOptions vopts;
    vopts.weights = kernels::WeightFormat::kF32;
    ASSIGN_OR_RETURN(std::unique_ptr<model::VisionTransformer> tower,
                     model::VisionTransformer::load(*files.config.vision, patched, vopts, pool));
    for (const engine::MultiModalItem& item : prompt.items) {
      const engine::EncoderInput& in = *item.input;
      std::vector<float> out;
      RETURN_IF_ERROR(tower->encode(in.pixel_values, in.grid_t, in.grid_h, in.grid_w, out));
      run.embeddings.push_back(std::move(out));
    }
  }

  const int num_prompt = static_cast<int>(prompt.token_ids.size());
  RETURN_IF_ERROR(engine::validate_multimodal_items(prompt.items, num_prompt));
  run.positions3 = engine::mrope_positions(num_prompt, prompt.items, &run.delta);
  std::vector<int32_t> positions = run.positions3;
  if (mut == "positions") {
    for (int i = 0; i < num_prompt; ++i) {
      std::swap(positions[3 * i + 1], positions[3 * i + 2]);
    }
  }

  if (mut == "mrope_sections") {
    std::swap(files.config.mrope_section[0], files.config.mrope_section[1]);
  }
  model::TransformerOptions topts;
  topts.weights = model::TransformerOptions::Weights::kF32;
  ASSIGN_OR_RETURN(std::unique_ptr<model::Transformer> decoder,
                   model::Transformer::load(std::move(files), topts, pool));
  const int num_total = num_prompt + static_cast<int>(kDecodeTokens.size());
  engine::KvCacheOptions kv;
  kv.block_size = kBlockSize;
  const int num_seq_blocks = (num_total + kBlockSize - 1) / kBlockSize;
  kv.num_blocks = 2 * num_seq_blocks;  // the one-step run, then the token-by-token one
  ASSIGN_OR_RETURN(std::unique_ptr<engine::TransformerRunner> runner,
                   engine::TransformerRunner::create(*decoder, kv));
  std::vector<int32_t> block_table(static_cast<size_t>(num_seq_blocks));
  std::vector<int32_t> stepped_block_table(static_cast<size_t>(num_seq_blocks));
  for (int b = 0; b < num_seq_blocks; ++b) {
    block_table[static_cast<size_t>(b)] = b;
    stepped_block_table[static_cast<size_t>(b)] = num_seq_blocks + b;
  }

  std::vector<engine::InputEmbeddings> overrides;
  for (size_t i = 0; i < prompt.items.size(); ++i) {
    const int64_t hidden = decoder->config().hidden_size;
    if (static_cast<int64_t>(run.embeddings[i].size()) !=
        int64_t{prompt.items[i].num_tokens} * hidden) {
      return internal_error("image " + std::to_string(i) + ": the tower returned " +
                            std::to_string(run.embeddings[i].size()) + " values, want " +
                            std::to_string(prompt.items[i].num_tokens) + " x " +
                            std::to_string(hidden));
    }
    if (mutation() == "scatter_shift") {  // image rows land one token late, the last lost
      overrides.push_back(
          {prompt.items[i].offset + 1, prompt.items[i].num_tokens - 1, run.embeddings[i].data()});
      continue;
    }
    overrides.push_back(
        {prompt.items[i].offset, prompt.items[i].num_tokens, run.embeddings[i].data()});
  }
  engine::RunnerSeq seq;
  seq.token_ids = prompt.token_ids;
  seq.start_pos = 0;
  seq.block_table = block_table;
  seq.needs_logits = true;
  seq.positions3 = positions;
  seq.embeddings = overrides;
  RETURN_IF_ERROR(runner->execute({&seq, 1}, run.last_logits));

  for (size_t k = 0; k < kDecodeTokens.size(); ++k) {
    const int32_t pos = num_prompt + static_cast<int32_t>(k) + run.delta;
    const std::array<int32_t, 3> pos3 = {pos, pos, pos};
    engine::RunnerSeq step;
    step.token_ids = {&kDecodeTokens[k], 1};
    step.start_pos = num_prompt + static_cast<int64_t>(k);
    step.block_table = block_table;
    step.needs_logits = true;
    step.positions3 = pos3;
    std::vector<float> logits;
    RETURN_IF_ERROR(runner->execute({&step, 1}, logits));
    run.decode_logits.push_back(std::move(logits));
  }

  // The prompt again, one token a step (each image split over as many steps as it has rows):
  // the logits of every position, to hold against the reference's [seq][vocab], so that an
  // image's embeddings are checked where they enter the decoder, not only through the last
  // position.
  const int64_t hidden = decoder->config().hidden_size;
  for (int i = 0; i < num_prompt; ++i) {
    engine::RunnerSeq step;
    step.token_ids = {&prompt.token_ids[static_cast<size_t>(i)], 1};
    step.start_pos = i;
    step.block_table = stepped_block_table;
    step.needs_logits = true;
    step.positions3 = std::span<const int32_t>(positions).subspan(static_cast<size_t>(3 * i), 3);
    std::vector<engine::InputEmbeddings> row;
    for (const engine::InputEmbeddings& o : overrides) {
      if (i >= o.row && i < o.row + o.num_rows) {
        row.push_back({0, 1, o.data + (i - o.row) * hidden});
      }
    }
    step.embeddings = row;
    std::vector<float> logits;
    RETURN_IF_ERROR(runner->execute({&step, 1}, logits));
    run.stepped_logits.insert(run.stepped_logits.end(), logits.begin(), logits.end());
  }
  return run;
}

// ----------------------------------------------------------------------------------- reference
struct ReferenceRun {
  std::vector<NpyArray> embeddings;
  NpyArray positions;  // [3][seq]
  NpyArray logits;     // [seq][vocab]
  NpyArray decode_logits;
  nlohmann::json meta;
};

Result<ReferenceRun> run_reference(const fs::path& model_dir, const Prompt& prompt,
                                   const fs::path& work) {
  fs::create_directories(work);
  nlohmann::json in;
  in["input_ids"] = prompt.token_ids;
  in["images"] = nlohmann::json::array();
  for (size_t i = 0; i < prompt.items.size(); ++i) {
    const engine::EncoderInput& image = *prompt.items[i].input;
    const std::string name = "pixels_" + std::to_string(i) + ".npy";
    const int64_t rows = int64_t{image.grid_t} * image.grid_h * image.grid_w;
    RETURN_IF_ERROR(write_npy_f32(work / name,
                                  {rows, static_cast<int64_t>(image.pixel_values.size()) / rows},
                                  image.pixel_values));
    in["images"].push_back(
        {{"pixel_values_npy", name}, {"grid_thw", {image.grid_t, image.grid_h, image.grid_w}}});
  }
  in["decode_tokens"] = kDecodeTokens;
  std::ofstream(work / "in.json") << in.dump(1);

  const fs::path out = work / "out";
  const std::string cmd = std::string("/usr/bin/python3 ") + CRESCENT_SOURCE_DIR +
                          "/tests/vl/qwen2_vl_reference.py --model '" + model_dir.string() +
                          "' --input '" + (work / "in.json").string() + "' --out '" + out.string() +
                          "' > '" + (work / "reference.log").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    Result<std::string> log = read_file((work / "reference.log").string());
    return internal_error("the reference failed (status " + std::to_string(rc) + "): " + cmd +
                          "\n" + (log.is_ok() ? *log : std::string()));
  }
  ReferenceRun ref;
  for (size_t i = 0; i < prompt.items.size(); ++i) {
    ASSIGN_OR_RETURN(NpyArray e, read_npy(out / ("embeddings_" + std::to_string(i) + ".npy")));
    ref.embeddings.push_back(std::move(e));
  }
  ASSIGN_OR_RETURN(ref.positions, read_npy(out / "positions.npy"));
  ASSIGN_OR_RETURN(ref.logits, read_npy(out / "logits.npy"));
  ASSIGN_OR_RETURN(ref.decode_logits, read_npy(out / "decode_logits.npy"));
  ASSIGN_OR_RETURN(std::string meta, read_file((out / "meta.json").string()));
  ref.meta = nlohmann::json::parse(meta);
  return ref;
}

// max |a - b| / max |b| over `count` values of b starting at b_offset.
double max_rel_diff(const std::vector<float>& a, const NpyArray& b, int64_t b_offset,
                    int64_t count) {
  double diff = 0;
  double scale = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double r = b.values[static_cast<size_t>(b_offset + i)];
    diff = std::max(diff, std::abs(static_cast<double>(a[static_cast<size_t>(i)]) - r));
    scale = std::max(scale, std::abs(r));
  }
  return scale > 0 ? diff / scale : diff;
}

// Compares one crescent run with the reference; `label` names the run in the printout.
void expect_matches_reference(const CrescentRun& run, const ReferenceRun& ref, const Prompt& prompt,
                              const std::string& label) {
  const int seq = static_cast<int>(prompt.token_ids.size());
  for (size_t i = 0; i < prompt.items.size(); ++i) {
    const NpyArray& e = ref.embeddings[i];
    ASSERT_EQ(e.num_elements(), static_cast<int64_t>(run.embeddings[i].size()))
        << label << " image " << i;
    const double d = max_rel_diff(run.embeddings[i], e, 0, e.num_elements());
    std::printf("[%s] embeddings_%zu [%lld x %lld]: max rel diff %.3g\n", label.c_str(), i,
                static_cast<long long>(e.shape[0]), static_cast<long long>(e.shape[1]), d);
    EXPECT_LE(d, kRelTol) << label << " image " << i << " embeddings";
  }

  ASSERT_EQ(ref.positions.shape, (std::vector<int64_t>{3, seq}));
  int num_position_mismatches = 0;
  for (int row = 0; row < 3; ++row) {
    for (int i = 0; i < seq; ++i) {
      const auto want = static_cast<int32_t>(
          ref.positions.values[static_cast<size_t>(row) * seq + static_cast<size_t>(i)]);
      const int32_t got = run.positions3[static_cast<size_t>(3 * i + row)];
      if (got != want && ++num_position_mismatches <= 5) {
        ADD_FAILURE() << label << " position[" << row << "][" << i << "] = " << got
                      << ", reference " << want;
      }
    }
  }
  EXPECT_EQ(num_position_mismatches, 0) << label << " positions";
  EXPECT_EQ(run.delta, ref.meta.at("mrope_position_delta").get<int>()) << label << " delta";
  std::printf("[%s] positions [3 x %d]: %d mismatches, delta %d (reference %d)\n", label.c_str(),
              seq, num_position_mismatches, run.delta,
              ref.meta.at("mrope_position_delta").get<int>());

  const int64_t vocab = ref.logits.shape.at(1);
  ASSERT_EQ(static_cast<int64_t>(run.last_logits.size()), vocab) << label;
  const double d_last = max_rel_diff(run.last_logits, ref.logits, (seq - 1) * vocab, vocab);
  std::printf("[%s] logits[last] [%lld]: max rel diff %.3g, argmax %d (reference %d)\n",
              label.c_str(), static_cast<long long>(vocab), d_last, argmax(run.last_logits),
              ref.meta.at("argmax_last").get<int>());
  EXPECT_LE(d_last, kRelTol) << label << " last prompt logits";

  ASSERT_EQ(static_cast<int64_t>(run.stepped_logits.size()), seq * vocab) << label;
  double d_rows = 0;
  int worst_row = 0;
  for (int i = 0; i < seq; ++i) {
    const std::vector<float> row(run.stepped_logits.begin() + int64_t{i} * vocab,
                                 run.stepped_logits.begin() + int64_t{i + 1} * vocab);
    const double d = max_rel_diff(row, ref.logits, int64_t{i} * vocab, vocab);
    if (d > d_rows) {
      d_rows = d;
      worst_row = i;
    }
  }
  std::printf("[%s] logits[all %d positions, one token a step]: max rel diff %.3g (position %d)\n",
              label.c_str(), seq, d_rows, worst_row);
  EXPECT_LE(d_rows, kRelTol) << label << " logits of position " << worst_row
                             << " (prompt run one token a step)";

  ASSERT_EQ(ref.decode_logits.shape,
            (std::vector<int64_t>{static_cast<int64_t>(kDecodeTokens.size()), vocab}));
  for (size_t k = 0; k < kDecodeTokens.size(); ++k) {
    ASSERT_EQ(static_cast<int64_t>(run.decode_logits[k].size()), vocab) << label;
    const double d = max_rel_diff(run.decode_logits[k], ref.decode_logits,
                                  static_cast<int64_t>(k) * vocab, vocab);
    std::printf("[%s] decode_logits[%zu] (token %d at position %d): max rel diff %.3g\n",
                label.c_str(), k, kDecodeTokens[k], seq + static_cast<int>(k) + run.delta, d);
    EXPECT_LE(d, kRelTol) << label << " decode step " << k;
  }
}

std::vector<int> greedy(const CrescentRun& run) {
  std::vector<int> tokens = {argmax(run.last_logits)};
  for (const auto& l : run.decode_logits) {
    tokens.push_back(argmax(l));
  }
  return tokens;
}

// ----------------------------------------------------------------------------------- the test
struct VlCase {
  std::string preset;
  std::vector<Grid> grids;
  // 0: the preset's. The tiny presets' theta of 1e6 with head_dim 16 leaves the height and
  // width rotary pairs with frequencies of at most 0.03 rad per position, so at these positions
  // a wrong M-RoPE (sections or rows swapped) moves the logits by only ~3e-5 relative, under
  // kRelTol. A small theta turns every pair by a sizeable angle, so such bugs show.
  double rope_theta = 0;

  std::string name() const {
    std::string n = preset;
    if (rope_theta != 0) {
      n += "_theta" + std::to_string(static_cast<int>(rope_theta));
    }
    n.erase(std::remove_if(n.begin(), n.end(),
                           [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }),
            n.end());
    return n;
  }
};
void PrintTo(const VlCase& c, std::ostream* os) {
  *os << c.name();
}

// Sets rope_theta in config.json (top level and text_config, wherever transformers reads it).
Status set_rope_theta(const fs::path& model_dir, double theta) {
  const fs::path path = model_dir / "config.json";
  ASSIGN_OR_RETURN(std::string text, read_file(path.string()));
  nlohmann::json j = nlohmann::json::parse(text);
  j["rope_theta"] = theta;
  if (j.contains("text_config") && j["text_config"].is_object()) {
    j["text_config"]["rope_theta"] = theta;
  }
  std::ofstream(path) << j.dump(2);
  return Status::ok();
}

class VlReferenceTest : public ::testing::TestWithParam<VlCase> {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("vl_reference_test_" + std::to_string(::getpid()) + "_" + GetParam().name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) {
      fs::remove_all(dir_);
    } else {
      std::printf("kept %s for inspection\n", dir_.string().c_str());
    }
  }
  fs::path dir_;
};

TEST_P(VlReferenceTest, MatchesNumpyReference) {
  if (!mutation().empty()) {
    std::printf("CRESCENT_VL_MUTATION=%s: this run must FAIL\n", mutation().c_str());
  }
  const VlCase& c = GetParam();
  ThreadPool pool(2);
  model::MakeModelOptions make;
  make.preset = c.preset;
  make.out_dir = (dir_ / "model").string();
  make.dtype = DType::kF32;
  make.gguf_dtype = DType::kF32;
  make.seed = 7;
  const Status made = model::make_model(make);
  ASSERT_TRUE(made.is_ok()) << made.to_string();
  if (c.rope_theta != 0) {
    const Status set = set_rope_theta(make.out_dir, c.rope_theta);
    ASSERT_TRUE(set.is_ok()) << set.to_string();
  }
  const std::string label =
      c.preset + (c.rope_theta != 0 ? " rope_theta=" + std::to_string(int(c.rope_theta)) : "");

  Result<model::ModelFiles> hf = model::open_model(make.out_dir);
  ASSERT_TRUE(hf.is_ok()) << hf.status().to_string();
  ASSERT_TRUE(hf->config.vision.has_value());
  const Prompt prompt = build_prompt(hf->config, c.grids);

  Result<ReferenceRun> ref = run_reference(make.out_dir, prompt, dir_ / "reference");
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();

  Result<CrescentRun> from_hf = run_crescent(std::move(*hf), prompt, pool);
  ASSERT_TRUE(from_hf.is_ok()) << from_hf.status().to_string();
  expect_matches_reference(*from_hf, *ref, prompt, label + " HF");

  // llama.cpp's layout: the LLM in model.gguf, the tower in mmproj.gguf, both F32.
  Result<model::ModelFiles> gguf = model::open_model((dir_ / "model" / "model.gguf").string(),
                                                     (dir_ / "model" / "mmproj.gguf").string());
  ASSERT_TRUE(gguf.is_ok()) << gguf.status().to_string();
  ASSERT_TRUE(gguf->vision_tensors != nullptr);
  // F32 files, so the GGUF pair is held to the same tolerance as the HF checkout.
  for (const auto& [source, name] :
       {std::pair{gguf->tensors.get(), "model.layers.0.mlp.gate_proj.weight"},
        std::pair{gguf->vision_tensors.get(), "visual.blocks.0.attn.qkv.weight"}}) {
    Result<model::TensorView> view = source->get(name);
    ASSERT_TRUE(view.is_ok()) << view.status().to_string();
    ASSERT_EQ(view->dtype, DType::kF32) << name;
  }
  if (c.rope_theta != 0) {
    gguf->config.rope_theta = c.rope_theta;  // model.gguf keeps the preset's
  }
  Result<CrescentRun> from_gguf = run_crescent(std::move(*gguf), prompt, pool);
  ASSERT_TRUE(from_gguf.is_ok()) << from_gguf.status().to_string();
  expect_matches_reference(*from_gguf, *ref, prompt, label + " GGUF");
  EXPECT_EQ(greedy(*from_gguf), greedy(*from_hf)) << "greedy tokens of the GGUF pair vs HF";
}

// Qwen2.5-VL's window is 2x2 merged tokens here: 1x8x12 (4x6 merged) tiles exactly, which
// adds an empty window row and column (the get_window_index padding quirk); 1x6x10 (3x5) has
// windows of 4, 2 and 1 tokens.
INSTANTIATE_TEST_SUITE_P(
    Presets, VlReferenceTest,
    ::testing::Values(VlCase{"tiny-qwen2-vl", {{1, 8, 8}, {1, 6, 10}}},
                      VlCase{"tiny-qwen2.5-vl", {{1, 8, 12}, {1, 6, 10}}},
                      VlCase{"tiny-qwen2-vl", {{1, 8, 8}, {1, 6, 10}}, /*rope_theta=*/10},
                      VlCase{"tiny-qwen2.5-vl", {{1, 8, 12}, {1, 6, 10}}, /*rope_theta=*/10}),
    [](const ::testing::TestParamInfo<VlCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace crescent
