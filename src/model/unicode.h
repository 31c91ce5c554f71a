#pragma once
// UTF-8 and Unicode property helpers for the tokenizer: decoding/validation, the character
// classes the pre-tokenizer regexes use (\p{L}, \p{N}, \s) and NFC/NFKC normalisation (ICU).
// All functions are pure and thread-safe.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace crescent::model::unicode {

// Returns true if `text` is well-formed UTF-8 (no overlongs, surrogates or values > U+10FFFF).
bool is_valid_utf8(std::string_view text);

// Decodes the code point at text[*pos] (text must be valid UTF-8) and advances *pos.
char32_t next_code_point(std::string_view text, size_t* pos);

void append_utf8(char32_t cp, std::string* out);

// Length in bytes of the UTF-8 sequence that starts with `lead` (1..4), 0 for a non-lead byte.
int utf8_sequence_length(unsigned char lead);

bool is_letter(char32_t cp);      // \p{L}
bool is_number(char32_t cp);      // \p{N}
bool is_whitespace(char32_t cp);  // \s as Rust/Oniguruma see it: the White_Space property

// Unicode normalisation; `text` must be valid UTF-8.
std::string nfc(std::string_view text);
std::string nfkc(std::string_view text);

// Appends the decoding of `bytes` the way Rust's String::from_utf8_lossy does (each maximal
// invalid subpart becomes one U+FFFD).
void append_utf8_lossy(std::string_view bytes, std::string* out);

// Number of leading bytes of `bytes` that end in a complete character: a trailing incomplete
// but so-far-valid sequence is excluded, everything before it (valid or not) is included.
size_t complete_prefix_length(std::string_view bytes);

}  // namespace crescent::model::unicode
