#include "engine/guided/matcher.h"

#include <algorithm>
#include <optional>

#include "core/check.h"

namespace crescent::engine::guided {
namespace {

bool is_ws(uint8_t b) {
  return b == ' ' || b == '\n' || b == '\t' || b == '\r';
}
bool is_digit(uint8_t b) {
  return b >= '0' && b <= '9';
}
bool is_hex(uint8_t b) {
  return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

// How many continuation bytes follow a UTF-8 lead byte b; -1 for a continuation byte, -2 for
// a byte that never occurs in UTF-8.
int utf8_continuations(uint8_t b) {
  if (b < 0x80) {
    return 0;
  }
  if (b < 0xC0) {
    return -1;
  }
  if (b < 0xC2 || b > 0xF4) {
    return -2;
  }
  return b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
}

// Object states.
enum : uint8_t {
  kObjOpen,        // expects '{'
  kObjFirst,       // after '{': a key or '}'
  kObjKey,         // inside a schema key (after its opening quote)
  kObjColon,       // after the key: ':'
  kObjValue,       // after ':': the value
  kObjAfterValue,  // ',' or '}'
  kObjNext,        // after ',': a key
};
// Tagged-union states: up to its tag's value, then the chosen branch's object in
// kObjAfterValue.
enum : uint8_t { kUnionOpen, kUnionFirst, kUnionKey, kUnionColon, kUnionValue, kUnionTag };
// Array states.
enum : uint8_t { kArrOpen, kArrFirst, kArrAfterItem, kArrNext };
// String states.
enum : uint8_t { kStrOpen, kStrBody, kStrEscape, kStrUnicode };
// Number states; kNumZero, kNumInt, kNumFrac and kNumExpDigits may end the number.
enum : uint8_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumExp,
  kNumExpSign,
  kNumExpDigits,
};

// The candidate properties for the next key of an object when the properties before `from`
// are done or skipped: every one up to and including the first required one.
uint64_t key_candidates(const Node& n, uint32_t from) {
  uint64_t mask = 0;
  for (size_t i = from; i < n.properties.size(); ++i) {
    mask |= uint64_t{1} << i;
    if (n.properties[i].is_required) {
      break;
    }
  }
  return mask;
}

bool has_required_from(const Node& n, uint32_t from) {
  for (size_t i = from; i < n.properties.size(); ++i) {
    if (n.properties[i].is_required) {
      return true;
    }
  }
  return false;
}

uint64_t all_literals(const Node& n) {
  return n.literals.size() >= 64 ? ~uint64_t{0} : (uint64_t{1} << n.literals.size()) - 1;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  CRESCENT_CHECK(grammar_ != nullptr && grammar_->root >= 0) << "matcher without a grammar";
  nodes_ = grammar_->nodes.data();
  CRESCENT_CHECK(push(grammar_->root));
}

Matcher& Matcher::operator=(const Matcher& other) {
  if (this != &other) {
    if (grammar_ != other.grammar_) {
      grammar_ = other.grammar_;
    }
    nodes_ = other.nodes_;
    depth_ = other.depth_;
    std::copy_n(other.frames_.begin(), depth_, frames_.begin());
  }
  return *this;
}

bool Matcher::push(int32_t node) {
  if (depth_ == kMaxDepth) {
    return false;
  }
  Frame& f = frames_[depth_++];
  f = Frame();
  f.node = node;
  if (nodes_[node].kind == NodeKind::kLiteralSet) {
    f.alive = all_literals(nodes_[node]);
  }
  return true;
}

bool Matcher::advance(std::string_view bytes) {
  for (char c : bytes) {
    if (!advance(static_cast<uint8_t>(c))) {
      return false;
    }
  }
  return true;
}

bool Matcher::advance(uint8_t b) {
  while (depth_ > 0) {
    switch (step(frames_[depth_ - 1], b)) {
      case Step::kReject:
        return false;
      case Step::kConsumed:
        return true;
      case Step::kPopConsumed:
        --depth_;
        return true;
      case Step::kPopReprocess:
        --depth_;
        break;
      case Step::kReprocess:
        break;
    }
  }
  return false;  // the value is complete: nothing may follow
}

bool Matcher::can_end(const Frame& f) const {
  const Node& n = nodes_[f.node];
  switch (n.kind) {
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      return f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac ||
             f.state == kNumExpDigits;
    case NodeKind::kLiteralSet:
      for (size_t i = 0; i < n.literals.size(); ++i) {
        if ((f.alive >> i & 1) != 0 && n.literals[i].size() == f.pos) {
          return true;
        }
      }
      return false;
    case NodeKind::kRegex:
      return n.regex->accepting[f.count] != 0;
    default:
      return false;
  }
}

bool Matcher::is_in_free_string() const {
  if (depth_ == 0) {
    return false;
  }
  const Frame& f = frames_[depth_ - 1];
  const Node& n = nodes_[f.node];
  return n.kind == NodeKind::kString && f.state == kStrBody && f.pos == 0 && n.max_length < 0 &&
         n.regex == nullptr;
}

const RegexDfa* Matcher::root_regex(int32_t* state) const {
  if (depth_ != 1 || nodes_[frames_[0].node].kind != NodeKind::kRegex) {
    return nullptr;
  }
  *state = static_cast<int32_t>(frames_[0].count);
  return nodes_[frames_[0].node].regex.get();
}

bool Matcher::is_accepting() const {
  return depth_ == 0 || (depth_ == 1 && can_end(frames_[0]));
}

Matcher::Step Matcher::step(Frame& f, uint8_t b) {
  const Node& n = nodes_[f.node];
  switch (n.kind) {
    case NodeKind::kAny: {
      // Becomes the kind of value its first byte starts.
      int32_t next = -1;
      if (b == '{') {
        next = Grammar::kAnyObject;
      } else if (b == '[') {
        next = Grammar::kAnyArray;
      } else if (b == '"') {
        next = Grammar::kAnyString;
      } else if (b == '-' || is_digit(b)) {
        next = Grammar::kAnyNumber;
      } else if (b == 't' || b == 'f' || b == 'n') {
        next = Grammar::kTrueFalseNull;
      } else {
        return Step::kReject;
      }
      f = Frame();
      f.node = next;
      f.alive = all_literals(nodes_[next]);
      return Step::kReprocess;
    }
    case NodeKind::kAnyOf:
      for (int32_t branch : n.branches) {
        if (nodes_[branch].first_bytes.test(b)) {
          f = Frame();
          f.node = branch;
          f.alive = all_literals(nodes_[branch]);
          return Step::kReprocess;
        }
      }
      return Step::kReject;
    case NodeKind::kObject:
      return step_object(f, n, b);
    case NodeKind::kArray:
      return step_array(f, n, b);
    case NodeKind::kString:
      return step_string(f, n, b);
    case NodeKind::kNumber:
    case NodeKind::kInteger:
      return step_number(f, n, b);
    case NodeKind::kLiteralSet:
      return step_literals(f, n, b);
    case NodeKind::kTaggedUnion:
      return step_tagged_union(f, n, b);
    case NodeKind::kRegex: {
      // count is the DFA state. A full match that nothing may extend closes the value.
      const int32_t next = n.regex->next[f.count][b];
      if (next < 0) {
        return Step::kReject;
      }
      f.count = static_cast<uint32_t>(next);
      const auto s = static_cast<size_t>(next);
      return n.regex->accepting[s] != 0 && n.regex->has_exit[s] == 0 ? Step::kPopConsumed
                                                                     : Step::kConsumed;
    }
  }
  return Step::kReject;
}

Matcher::Step Matcher::open_container(Frame& f, uint8_t open, uint8_t next_state, uint8_t b) {
  if (b != open) {
    return Step::kReject;
  }
  f.state = next_state;
  return Step::kConsumed;
}

// Bounded whitespace between the tokens of an object or array: a step when b is whitespace.
std::optional<Matcher::Step> Matcher::take_whitespace(Frame& f, uint8_t b) {
  if (!is_ws(b)) {
    f.num_ws = 0;
    return std::nullopt;
  }
  if (f.num_ws >= kMaxWhitespace) {
    return Step::kReject;
  }
  ++f.num_ws;
  return Step::kConsumed;
}

Matcher::Step Matcher::step_object(Frame& f, const Node& n, uint8_t b) {
  if (f.state == kObjOpen) {
    return open_container(f, '{', kObjFirst, b);
  }
  if (f.state == kObjKey) {
    // Narrow the candidates to the keys that continue with b; '"' ends a key matched in full.
    uint64_t next = 0;
    for (uint64_t m = f.alive; m != 0; m &= m - 1) {
      const int i = __builtin_ctzll(m);
      const std::string& key = n.properties[i].key;
      if (f.pos < key.size()) {
        if (static_cast<uint8_t>(key[f.pos]) == b) {
          next |= uint64_t{1} << i;
        }
      } else if (f.pos == key.size() && b == '"') {
        f.count = static_cast<uint32_t>(i);
        f.state = kObjColon;
        return Step::kConsumed;
      }
    }
    if (next == 0) {
      return Step::kReject;
    }
    f.alive = next;
    ++f.pos;
    return Step::kConsumed;
  }
  if (is_ws(b) || f.num_ws > 0) {
    if (std::optional<Step> step = take_whitespace(f, b)) {
      return *step;
    }
  }
  switch (f.state) {
    case kObjFirst:
    case kObjNext:
      if (f.state == kObjFirst && b == '}') {
        return n.any_keys || !has_required_from(n, 0) ? Step::kPopConsumed : Step::kReject;
      }
      if (b != '"') {
        return Step::kReject;
      }
      if (n.any_keys) {
        f.state = kObjColon;
        return push(Grammar::kAnyString) ? Step::kReprocess : Step::kReject;
      }
      f.alive = key_candidates(n, f.count);
      if (f.alive == 0) {
        return Step::kReject;
      }
      f.pos = 0;
      f.state = kObjKey;
      return Step::kConsumed;
    case kObjColon:
      if (b != ':') {
        return Step::kReject;
      }
      f.state = kObjValue;
      return Step::kConsumed;
    case kObjValue:
      f.state = kObjAfterValue;
      return push(n.any_keys ? Grammar::kAnyValue : n.properties[f.count].value) ? Step::kReprocess
                                                                                 : Step::kReject;
    case kObjAfterValue:
      if (b == ',') {
        if (!n.any_keys && f.count + 1 >= n.properties.size()) {
          return Step::kReject;
        }
        f.count = n.any_keys ? 0 : f.count + 1;
        f.state = kObjNext;
        return Step::kConsumed;
      }
      if (b == '}') {
        return n.any_keys || !has_required_from(n, f.count + 1) ? Step::kPopConsumed
                                                                : Step::kReject;
      }
      return Step::kReject;
    default:
      return Step::kReject;
  }
}

// `{`, the tag's key, `:` and the tag's constant, with the object's bounded whitespace; the
// constant's closing quote picks the branch, and the frame becomes that branch's object just
// after its first property's value.
Matcher::Step Matcher::step_tagged_union(Frame& f, const Node& n, uint8_t b) {
  const std::string& key = n.properties[0].key;
  switch (f.state) {
    case kUnionOpen:
      return open_container(f, '{', kUnionFirst, b);
    case kUnionKey:
      if (f.pos < key.size()) {
        if (static_cast<uint8_t>(key[f.pos]) != b) {
          return Step::kReject;
        }
        ++f.pos;
        return Step::kConsumed;
      }
      if (b != '"') {
        return Step::kReject;
      }
      f.state = kUnionColon;
      return Step::kConsumed;
    case kUnionTag: {
      uint64_t next = 0;
      for (uint64_t m = f.alive; m != 0; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        const std::string& lit = n.literals[i];
        if (f.pos < lit.size() && static_cast<uint8_t>(lit[f.pos]) == b) {
          if (f.pos + 1U == lit.size()) {
            const int32_t branch = n.branches[i];
            f = Frame();
            f.node = branch;
            f.state = kObjAfterValue;
            f.count = 0;
            return Step::kConsumed;
          }
          next |= uint64_t{1} << i;
        }
      }
      if (next == 0) {
        return Step::kReject;
      }
      f.alive = next;
      ++f.pos;
      return Step::kConsumed;
    }
    default:
      break;
  }
  if (is_ws(b) || f.num_ws > 0) {
    if (std::optional<Step> step = take_whitespace(f, b)) {
      return *step;
    }
  }
  switch (f.state) {
    case kUnionFirst:
      if (b != '"') {
        return Step::kReject;
      }
      f.pos = 0;
      f.state = kUnionKey;
      return Step::kConsumed;
    case kUnionColon:
      if (b != ':') {
        return Step::kReject;
      }
      f.state = kUnionValue;
      return Step::kConsumed;
    case kUnionValue:
      f.state = kUnionTag;
      f.pos = 0;
      f.alive = all_literals(n);
      return Step::kReprocess;
    default:
      return Step::kReject;
  }
}

Matcher::Step Matcher::step_array(Frame& f, const Node& n, uint8_t b) {
  if (f.state == kArrOpen) {
    return open_container(f, '[', kArrFirst, b);
  }
  if (is_ws(b) || f.num_ws > 0) {
    if (std::optional<Step> step = take_whitespace(f, b)) {
      return *step;
    }
  }
  const int64_t count = f.count;
  switch (f.state) {
    case kArrFirst:
      if (b == ']') {
        return n.min_items == 0 ? Step::kPopConsumed : Step::kReject;
      }
      [[fallthrough]];
    case kArrNext:
      if (n.max_items >= 0 && count >= n.max_items) {
        return Step::kReject;
      }
      ++f.count;
      f.state = kArrAfterItem;
      return push(n.items) ? Step::kReprocess : Step::kReject;
    case kArrAfterItem:
      if (b == ',') {
        if (n.max_items >= 0 && count >= n.max_items) {
          return Step::kReject;
        }
        f.state = kArrNext;
        return Step::kConsumed;
      }
      if (b == ']') {
        return count >= n.min_items ? Step::kPopConsumed : Step::kReject;
      }
      return Step::kReject;
    default:
      return Step::kReject;
  }
}

Matcher::Step Matcher::step_string(Frame& f, const Node& n, uint8_t b) {
  switch (f.state) {
    case kStrOpen:
      if (b != '"') {
        return Step::kReject;
      }
      f.state = kStrBody;
      return Step::kConsumed;
    case kStrBody: {
      // pos counts the continuation bytes the current UTF-8 character still needs, so only
      // valid UTF-8 is produced (a lone continuation byte would decode to U+FFFD).
      const int need = utf8_continuations(b);
      if (n.regex != nullptr) {
        // alive is the pattern's DFA state; its automaton has no '"', '\\' or control bytes.
        if (b == '"') {
          if (n.regex->accepting[f.alive] == 0) {
            return Step::kReject;
          }
        } else {
          const int32_t next = n.regex->next[f.alive][b];
          if (next < 0) {
            return Step::kReject;
          }
          f.alive = static_cast<uint64_t>(next);
        }
      }
      if (f.pos > 0) {
        if (need != -1) {
          return Step::kReject;
        }
        --f.pos;
        return Step::kConsumed;
      }
      if (b == '"') {
        return f.count >= n.min_length ? Step::kPopConsumed : Step::kReject;
      }
      if (b < 0x20 || need < 0) {
        return Step::kReject;  // control characters must be escaped; no stray continuation
      }
      if (n.max_length >= 0 && f.count >= n.max_length) {
        return Step::kReject;
      }
      if (b == '\\') {
        f.state = kStrEscape;
        return Step::kConsumed;
      }
      ++f.count;
      f.pos = static_cast<uint16_t>(need);
      return Step::kConsumed;
    }
    case kStrEscape:
      if (b == 'u') {
        f.state = kStrUnicode;
        f.pos = 0;
        return Step::kConsumed;
      }
      if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
          b == 't') {
        ++f.count;
        f.state = kStrBody;
        return Step::kConsumed;
      }
      return Step::kReject;
    case kStrUnicode:
      if (!is_hex(b)) {
        return Step::kReject;
      }
      if (++f.pos == 4) {
        ++f.count;
        f.pos = 0;
        f.state = kStrBody;
      }
      return Step::kConsumed;
    default:
      return Step::kReject;
  }
}

Matcher::Step Matcher::step_number(Frame& f, const Node& n, uint8_t b) {
  const bool is_integer = n.kind == NodeKind::kInteger;
  if (f.count >= kMaxNumberBytes) {
    return can_end(f) ? Step::kPopReprocess : Step::kReject;
  }
  int next = -1;
  switch (f.state) {
    case kNumStart:
      next = b == '-' ? kNumMinus : b == '0' ? kNumZero : is_digit(b) ? kNumInt : next;
      break;
    case kNumMinus:
      next = b == '0' ? kNumZero : is_digit(b) ? kNumInt : next;
      break;
    case kNumZero:
    case kNumInt:
      if (f.state == kNumInt && is_digit(b)) {
        next = kNumInt;
      } else if (!is_integer && b == '.') {
        next = kNumDot;
      } else if (!is_integer && (b == 'e' || b == 'E')) {
        next = kNumExp;
      }
      break;
    case kNumDot:
    case kNumFrac:
      if (is_digit(b)) {
        next = kNumFrac;
      } else if (f.state == kNumFrac && (b == 'e' || b == 'E')) {
        next = kNumExp;
      }
      break;
    case kNumExp:
      next = (b == '+' || b == '-') ? kNumExpSign : is_digit(b) ? kNumExpDigits : next;
      break;
    case kNumExpSign:
    case kNumExpDigits:
      next = is_digit(b) ? kNumExpDigits : next;
      break;
    default:
      break;
  }
  if (next < 0) {
    // The number ends before b, if it may end here.
    return can_end(f) ? Step::kPopReprocess : Step::kReject;
  }
  f.state = static_cast<uint8_t>(next);
  ++f.count;
  return Step::kConsumed;
}

Matcher::Step Matcher::step_literals(Frame& f, const Node& n, uint8_t b) {
  uint64_t next = 0;
  bool has_complete = false;
  for (uint64_t m = f.alive; m != 0; m &= m - 1) {
    const int i = __builtin_ctzll(m);
    const std::string& lit = n.literals[i];
    if (f.pos < lit.size()) {
      if (static_cast<uint8_t>(lit[f.pos]) == b) {
        next |= uint64_t{1} << i;
      }
    } else {
      has_complete = true;
    }
  }
  if (next != 0) {
    f.alive = next;
    ++f.pos;
    return Step::kConsumed;
  }
  return has_complete ? Step::kPopReprocess : Step::kReject;
}

}  // namespace crescent::engine::guided
