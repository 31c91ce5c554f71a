#pragma once
// Standard base64 (RFC 4648: the '+' '/' alphabet, '=' padding, no line breaks), as data: URLs
// carry images. Decoding stays with the one reader that needs it (server/image_inputs), whose
// errors speak of data URLs.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace crescent {

std::string base64_encode(std::span<const uint8_t> bytes);
std::string base64_encode(std::string_view bytes);

}  // namespace crescent
