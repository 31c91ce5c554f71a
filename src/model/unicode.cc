#include "model/unicode.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "core/check.h"

namespace crescent::model::unicode {
namespace {

// Length of the well-formed prefix of the sequence starting at bytes[i] (Unicode table 3-7):
// returns the full length when valid, otherwise the length of the maximal subpart (>= 1) and
// sets *valid=false. *truncated is set when the input ended inside a valid-so-far sequence.
size_t scan_sequence(std::string_view s, size_t i, bool* valid, bool* truncated) {
  *valid = false;
  *truncated = false;
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *valid = true;
    return 1;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 == 0xE0) {
    need = 2;
    lo = 0xA0;
  } else if (b0 == 0xED) {
    need = 2;
    hi = 0x9F;
  } else if (b0 >= 0xE1 && b0 <= 0xEF) {
    need = 2;
  } else if (b0 == 0xF0) {
    need = 3;
    lo = 0x90;
  } else if (b0 == 0xF4) {
    need = 3;
    hi = 0x8F;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    need = 3;
  } else {
    return 1;
  }
  size_t j = i + 1;
  for (int k = 0; k < need; ++k, ++j) {
    if (j >= s.size()) {
      *truncated = true;
      return j - i;
    }
    const auto b = static_cast<unsigned char>(s[j]);
    const unsigned char l = k == 0 ? lo : 0x80;
    const unsigned char h = k == 0 ? hi : 0xBF;
    if (b < l || b > h) {
      return j - i;
    }
  }
  *valid = true;
  return j - i;
}

// ICU creates its normalizer singletons lazily behind its own once-flag, which ThreadSanitizer
// cannot see into (ICU is not instrumented): two HTTP threads tokenizing their first non-ASCII
// text at once were reported as a race. A C++ static makes the creation's happens-before edge
// visible, and costs nothing after the first call.
const icu::Normalizer2* checked_normalizer(const icu::Normalizer2* n, UErrorCode err) {
  CRESCENT_CHECK(U_SUCCESS(err) && n != nullptr) << "ICU normalizer unavailable";
  return n;
}
// One normaliser, created once behind a C++ static (see above).
template <const icu::Normalizer2* (*kGetInstance)(UErrorCode&)>
const icu::Normalizer2* instance_once() {
  static const icu::Normalizer2* const n = [] {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* made = kGetInstance(err);
    return checked_normalizer(made, err);
  }();
  return n;
}

const icu::Normalizer2* normalizer(bool compat) {
  return compat ? instance_once<&icu::Normalizer2::getNFKCInstance>()
                : instance_once<&icu::Normalizer2::getNFCInstance>();
}

std::string normalize(std::string_view text, bool compat) {
  bool ascii = true;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) {
    return std::string(text);
  }
  const icu::Normalizer2* n = normalizer(compat);
  UErrorCode err = U_ZERO_ERROR;
  icu::UnicodeString src = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (n->isNormalized(src, err) && U_SUCCESS(err)) {
    return std::string(text);
  }
  err = U_ZERO_ERROR;
  icu::UnicodeString dst = n->normalize(src, err);
  CRESCENT_CHECK(U_SUCCESS(err)) << "ICU normalisation failed";
  std::string out;
  dst.toUTF8String(out);
  return out;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    bool valid, truncated;
    const size_t n = scan_sequence(text, i, &valid, &truncated);
    if (!valid) {
      return false;
    }
    i += n;
  }
  return true;
}

int utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80)
    return 1;
  if (lead < 0xC0)
    return 0;
  if (lead < 0xE0)
    return 2;
  if (lead < 0xF0)
    return 3;
  return 4;
}

char32_t next_code_point(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  }
  const int n = utf8_sequence_length(b0);
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  }
  *pos += n;
  return cp;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_letter(char32_t cp) {
  if (cp < 0x80) {
    return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  }
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_L_MASK) != 0;
}

bool is_number(char32_t cp) {
  if (cp < 0x80) {
    return cp >= '0' && cp <= '9';
  }
  return (U_GET_GC_MASK(static_cast<UChar32>(cp)) & U_GC_N_MASK) != 0;
}

bool is_whitespace(char32_t cp) {
  if (cp < 0x80) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  }
  return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE);
}

std::string nfc(std::string_view text) {
  return normalize(text, false);
}
std::string nfkc(std::string_view text) {
  return normalize(text, true);
}

void append_utf8_lossy(std::string_view bytes, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    bool valid, truncated;
    const size_t n = scan_sequence(bytes, i, &valid, &truncated);
    if (valid) {
      out->append(bytes.substr(i, n));
    } else {
      out->append("\xEF\xBF\xBD");
    }
    i += n;
  }
}

size_t complete_prefix_length(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    bool valid, truncated;
    const size_t n = scan_sequence(bytes, i, &valid, &truncated);
    if (truncated) {
      return i;
    }
    i += n;
  }
  return i;
}

}  // namespace crescent::model::unicode
