#pragma once
// Test-only ModelRunner whose "model" is a hash of the token prefix read back from its fake KV
// cache. Every computed token writes (token id, position) into its slot; logits for a sequence
// are derived from reading positions [0, end) back through the block table. So a wrong block
// table, a block shared while still written, or a prefix that was never computed changes the
// logits (or is reported as an error), and chunked / batched / cached / recomputed runs agree
// exactly only when the engine is right. A script can force the tokens of chosen prompts.

#include <algorithm>
#include <cstdint>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/detokenizer.h"
#include "engine/model_runner.h"

namespace crescent::engine::testing {

class FakeModelRunner : public ModelRunner {
 public:
  FakeModelRunner(int vocab_size, int num_blocks, int block_size)
      : vocab_size_(vocab_size),
        num_blocks_(num_blocks),
        block_size_(block_size),
        kv_(static_cast<size_t>(num_blocks) * block_size) {}

  int32_t vocab_size() const override { return vocab_size_; }
  int32_t num_kv_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return block_size_; }

  // Prompts starting with first_token and of length prompt_len get `tokens` as their output
  // (greedy), then fall back to the hash model.
  void set_script(int32_t first_token, int prompt_len, std::vector<int32_t> tokens) {
    scripts_[first_token] = {prompt_len, std::move(tokens)};
  }
  void fail_on_call(int call_index) { fail_on_call_ = call_index; }

  // What a peer's KV transfer does to this fake cache: writes the K/V of positions
  // [begin, end) of `tokens` into the slots of `block_table`, as if they had been computed.
  void write_kv(std::span<const int32_t> tokens, std::span<const int32_t> block_table,
                int64_t begin, int64_t end) {
    for (int64_t pos = begin; pos < end; ++pos) {
      Slot& slot = kv_[slot_index(block_table, pos)];
      slot.token_id = tokens[pos];
      slot.pos = pos;
    }
  }
  // Whether the slots of `block_table` hold the K/V of positions [begin, end) of `tokens`.
  bool holds_kv(std::span<const int32_t> tokens, std::span<const int32_t> block_table,
                int64_t begin, int64_t end) const {
    for (int64_t pos = begin; pos < end; ++pos) {
      const Slot& slot = kv_[slot_index(block_table, pos)];
      if (slot.token_id != tokens[pos] || slot.pos != pos) {
        return false;
      }
    }
    return true;
  }

  int num_calls() const { return num_calls_; }
  int64_t num_tokens_computed() const { return num_tokens_computed_; }
  int max_batch_tokens() const { return max_batch_tokens_; }
  int max_batch_seqs() const { return max_batch_seqs_; }

  Status execute(std::span<const RunnerSeq> batch, std::vector<float>& logits) override {
    const int call = num_calls_++;
    if (call == fail_on_call_) {
      return internal_error("injected runner failure");
    }
    int batch_tokens = 0;
    for (const RunnerSeq& s : batch) {
      const int64_t end = s.start_pos + static_cast<int64_t>(s.token_ids.size());
      if (s.token_ids.empty() || static_cast<int64_t>(s.block_table.size()) * block_size_ < end) {
        return internal_error("block table does not cover the tokens to compute");
      }
      for (size_t i = 0; i < s.token_ids.size(); ++i) {
        const int64_t pos = s.start_pos + static_cast<int64_t>(i);
        if (s.token_ids[i] < 0 || s.token_ids[i] >= vocab_size_) {
          return internal_error("token id outside the vocabulary");
        }
        Slot& slot = kv_[slot_index(s.block_table, pos)];
        slot.token_id = s.token_ids[i];
        slot.pos = pos;
      }
      batch_tokens += static_cast<int>(s.token_ids.size());
    }
    num_tokens_computed_ += batch_tokens;
    max_batch_tokens_ = std::max(max_batch_tokens_, batch_tokens);
    max_batch_seqs_ = std::max(max_batch_seqs_, static_cast<int>(batch.size()));
    // Read after all writes, so that two sequences writing one slot in a batch show up.
    logits.clear();
    for (const RunnerSeq& s : batch) {
      if (!s.needs_logits) {
        continue;
      }
      const int64_t end = s.start_pos + static_cast<int64_t>(s.token_ids.size());
      uint64_t h = 0x1234567u;
      int32_t first_token = -1;
      for (int64_t pos = 0; pos < end; ++pos) {
        const Slot& slot = kv_[slot_index(s.block_table, pos)];
        if (slot.pos != pos) {
          std::ostringstream os;
          os << "position " << pos << " was never computed into its slot (found " << slot.pos
             << ")";
          return internal_error(os.str());
        }
        if (pos == 0) {
          first_token = slot.token_id;
        }
        h = mix(h ^ (static_cast<uint64_t>(slot.token_id) + 0x9e37u * static_cast<uint64_t>(pos)));
      }
      const size_t row = logits.size();
      logits.resize(row + vocab_size_);
      for (int v = 0; v < vocab_size_; ++v) {
        // Values in [-4, 4): distinct enough that greedy and sampling have real choices.
        logits[row + v] = static_cast<float>(mix(h + 0x51u * (v + 1)) >> 40) / (1 << 24) * 8 - 4;
      }
      auto it = scripts_.find(first_token);
      if (it != scripts_.end()) {
        const int64_t index = end - it->second.prompt_len;
        if (index >= 0 && index < static_cast<int64_t>(it->second.tokens.size())) {
          logits[row + it->second.tokens[index]] = 100.0f;
        }
      }
    }
    return Status::ok();
  }

 private:
  struct Slot {
    int32_t token_id = -1;
    int64_t pos = -1;
  };
  struct Script {
    int prompt_len;
    std::vector<int32_t> tokens;
  };

  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  size_t slot_index(std::span<const int32_t> table, int64_t pos) const {
    return static_cast<size_t>(table[pos / block_size_]) * block_size_ + pos % block_size_;
  }

  int vocab_size_;
  int num_blocks_;
  int block_size_;
  std::vector<Slot> kv_;
  std::map<int32_t, Script> scripts_;
  int fail_on_call_ = -1;
  int num_calls_ = 0;
  int64_t num_tokens_computed_ = 0;
  int max_batch_tokens_ = 0;
  int max_batch_seqs_ = 0;
};

// Token v is the text pieces[v]; "<s>"-like specials are dropped when skip_special_tokens; a
// piece that starts with '~' is held until the next token (like an incomplete UTF-8 char).
class FakeDetokenizer : public Detokenizer {
 public:
  FakeDetokenizer(std::vector<std::string> pieces, int32_t special_id, bool skip_special)
      : pieces_(std::move(pieces)), special_id_(special_id), skip_special_(skip_special) {}
  std::string push(int32_t token_id) override {
    if (token_id == special_id_ && skip_special_) {
      return "";
    }
    const std::string& piece = pieces_.at(token_id);
    if (!piece.empty() && piece[0] == '~') {
      held_ += piece.substr(1);
      return "";
    }
    std::string out = held_ + piece;
    held_.clear();
    return out;
  }
  std::string flush() override { return std::exchange(held_, ""); }

 private:
  std::vector<std::string> pieces_;
  int32_t special_id_;
  bool skip_special_;
  std::string held_;
};

}  // namespace crescent::engine::testing
