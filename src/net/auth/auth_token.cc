#include "net/auth/auth_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/check.h"
#include "core/logging.h"

namespace crescent::net::auth {

Result<std::string> load_auth_token(const std::string& file, std::string_view flag_name) {
  if (file.empty()) {
    const char* env = std::getenv(std::string(kAuthTokenEnv).c_str());
    std::string token = env == nullptr ? "" : env;
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' '))
      token.pop_back();
    if (env != nullptr && *env != '\0' && token.empty())
      return invalid_argument(std::string(kAuthTokenEnv) + " holds only whitespace");
    return token;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in)
    return invalid_argument(std::string(flag_name) + ": cannot read '" + file + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t'))
    token.pop_back();
  if (token.empty())
    return invalid_argument(std::string(flag_name) + ": '" + file + "' holds no token");
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    CRESCENT_LOG(kWarn) << flag_name << ": '" << file
                        << "' may be read by its group or others; chmod 600 it";
  }
  if (token.size() < 16) {
    CRESCENT_LOG(kWarn) << flag_name << ": the token in '" << file << "' is shorter than 16 bytes";
  }
  return token;
}

Digest hmac_sha256(std::string_view key, std::string_view message) {
  Digest out{};
  unsigned int n = 0;
  const uint8_t* result =
      HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const uint8_t*>(message.data()), message.size(), out.data(), &n);
  CRESCENT_CHECK(result != nullptr && n == kDigestBytes) << "HMAC-SHA256 failed";
  return out;
}

Digest sha256(std::string_view data) {
  Digest out{};
  unsigned int n = 0;
  CRESCENT_CHECK(EVP_Digest(data.data(), data.size(), out.data(), &n, EVP_sha256(), nullptr) == 1 &&
                 n == kDigestBytes)
      << "SHA-256 failed";
  return out;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  CRESCENT_CHECK(RAND_bytes(reinterpret_cast<uint8_t*>(out.data()), static_cast<int>(n)) == 1)
      << "RAND_bytes failed";
  return out;
}

bool digests_equal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string to_hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace crescent::net::auth
