#pragma once
// Matcher: the position of one request's output in its Grammar, advanced one byte at a time.
// A stack of small frames (one per open object, array, string, number or literal), so a copy
// costs a few dozen bytes per nesting level: the vocabulary walk (vocab_trie.h) copies it at
// every trie node. Not thread-safe; copies are independent.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "engine/guided/grammar.h"

namespace crescent::engine::guided {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  Matcher(const Matcher& other) { *this = other; }
  Matcher& operator=(const Matcher& other);  // copies only the frames in use

  // Consumes `byte`; false if the grammar does not allow it here, and then this matcher's
  // state is unspecified (callers try bytes on a copy).
  bool advance(uint8_t byte);
  bool advance(std::string_view bytes);
  // The output so far is a complete value: ending here is allowed.
  bool is_accepting() const;
  // Nothing more may follow (the value is closed).
  bool is_complete() const { return depth_ == 0; }
  // Inside a string without maxLength, between characters: every run of whole UTF-8
  // characters without '"', '\\' and control bytes is accepted and leaves the state as it is
  // (the vocabulary walk's fast path).
  bool is_in_free_string() const;
  // When the whole grammar is a regex (guided_regex) and no value has closed yet: its DFA, with
  // the current state in *state; the vocabulary walk then steps the DFA alone. Else null.
  const RegexDfa* root_regex(int32_t* state) const;

 private:
  struct Frame {
    int32_t node = -1;
    uint8_t state = 0;
    uint8_t num_ws = 0;
    uint16_t pos = 0;    // literal / key bytes matched, \u digits, UTF-8 bytes to come
    uint32_t count = 0;  // array items, string code points, number bytes, property index
    uint64_t alive = 0;  // literal / key candidates still possible
  };
  enum class Step { kReject, kConsumed, kPopConsumed, kPopReprocess, kReprocess };

  Step step(Frame& f, uint8_t b);
  static Step open_container(Frame& f, uint8_t open, uint8_t next_state, uint8_t b);
  static std::optional<Step> take_whitespace(Frame& f, uint8_t b);
  Step step_object(Frame& f, const Node& n, uint8_t b);
  Step step_array(Frame& f, const Node& n, uint8_t b);
  Step step_string(Frame& f, const Node& n, uint8_t b);
  Step step_number(Frame& f, const Node& n, uint8_t b);
  Step step_literals(Frame& f, const Node& n, uint8_t b);
  Step step_tagged_union(Frame& f, const Node& n, uint8_t b);
  bool push(int32_t node);
  bool can_end(const Frame& f) const;

  std::shared_ptr<const Grammar> grammar_;
  const Node* nodes_ = nullptr;
  int depth_ = 0;
  std::array<Frame, kMaxDepth> frames_;
};

}  // namespace crescent::engine::guided
