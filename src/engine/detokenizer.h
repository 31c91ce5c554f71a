#pragma once
// Detokenizer: turns one request's output token ids into text incrementally. push() returns
// the text that became final with this token (it may hold back bytes of an incomplete UTF-8
// character); flush() returns whatever is still held when the request ends. One instance per
// request; not thread-safe.

#include <cstdint>
#include <string>

namespace crescent::engine {

class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  virtual std::string push(int32_t token_id) = 0;
  virtual std::string flush() = 0;
};

}  // namespace crescent::engine
