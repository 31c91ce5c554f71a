#include "disagg/compat_info.h"

#include <string_view>

#include "core/fnv.h"

namespace crescent::disagg {
namespace {

// Length-prefixed so that ("ab", "c") and ("a", "bc") hash differently.
void mix_string(Fnv1a64* h, std::string_view s) {
  h->text(std::to_string(s.size()) + ":").text(s);
}

void mix_int(Fnv1a64* h, int v) {
  mix_string(h, std::to_string(v));
}

}  // namespace

uint64_t KvCompatInfo::hash() const {
  Fnv1a64 h;
  mix_string(&h, model);
  mix_string(&h, dtype);
  mix_int(&h, num_layers);
  mix_int(&h, num_kv_heads);
  mix_int(&h, head_dim);
  mix_int(&h, block_size);
  mix_string(&h, layout);
  mix_string(&h, weights);
  return h.value();
}

std::string describe_first_difference(const KvCompatInfo& here, const KvCompatInfo& peer) {
  auto text = [](const char* field, const std::string& a, const std::string& b) {
    return std::string(field) + ": \"" + a + "\" here, \"" + b + "\" at the peer";
  };
  auto number = [](const char* field, int a, int b) {
    return std::string(field) + ": " + std::to_string(a) + " here, " + std::to_string(b) +
           " at the peer";
  };
  if (here.model != peer.model)
    return text("model", here.model, peer.model);
  if (here.dtype != peer.dtype)
    return text("dtype", here.dtype, peer.dtype);
  if (here.num_layers != peer.num_layers)
    return number("num_layers", here.num_layers, peer.num_layers);
  if (here.num_kv_heads != peer.num_kv_heads)
    return number("num_kv_heads", here.num_kv_heads, peer.num_kv_heads);
  if (here.head_dim != peer.head_dim)
    return number("head_dim", here.head_dim, peer.head_dim);
  if (here.block_size != peer.block_size)
    return number("block_size", here.block_size, peer.block_size);
  if (here.layout != peer.layout)
    return text("layout", here.layout, peer.layout);
  if (here.weights != peer.weights)
    return text("weights", here.weights, peer.weights) +
           " (another checkpoint or weight format of the same shape, or a crescent build that "
           "stores "
           "the weights in another layout)";
  return "";
}

}  // namespace crescent::disagg
