#pragma once
// The shared secret of a crescent deployment and the few primitives built on it: loading the
// token (`--auth-token-file FILE`, else the CRESCENT_AUTH_TOKEN environment variable),
// HMAC-SHA256 and SHA-256 (OpenSSL), random nonces, and a constant-time digest compare.
// The token never appears in a message or a log line. Thread-safety: stateless functions.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace crescent::net::auth {

inline constexpr std::string_view kAuthTokenEnv = "CRESCENT_AUTH_TOKEN";
inline constexpr size_t kDigestBytes = 32;
using Digest = std::array<uint8_t, kDigestBytes>;

// Reads the token from `file` (trailing newlines and spaces stripped) when `file` is not empty,
// else from the environment variable; an empty result means "no authentication". An
// unreadable file, or one that holds no token, is InvalidArgument naming the file (and
// `flag_name`); a file that its group or others may read is accepted with a warning.
Result<std::string> load_auth_token(const std::string& file,
                                    std::string_view flag_name = "--auth-token-file");

Digest hmac_sha256(std::string_view key, std::string_view message);
Digest sha256(std::string_view data);
// Cryptographically random bytes (RAND_bytes); CHECK-fails if the generator cannot be seeded.
std::string random_bytes(size_t n);
// Equal in length and content; the time does not depend on where they differ.
bool digests_equal(std::string_view a, std::string_view b);

std::string to_hex(std::string_view bytes);
inline std::string_view as_view(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

}  // namespace crescent::net::auth
