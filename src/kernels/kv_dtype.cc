#include "kernels/kv_dtype.h"

#include <string>

#include "kernels/isa.h"

namespace crescent::kernels {

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return "float32";
    case KvDtype::kBf16:
      return "bf16";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kFp8E4m3:
      return "fp8_e4m3";
    case KvDtype::kQ8_0:
      return "q8_0";
  }
  return "?";
}

KvDtype auto_kv_dtype() {
  return active_isa() >= Isa::kAvx2 ? KvDtype::kBf16 : KvDtype::kFloat32;
}

Result<KvDtype> parse_kv_dtype(std::string_view name) {
  if (name == "auto")
    return auto_kv_dtype();
  if (name == "float32" || name == "fp32" || name == "f32")
    return KvDtype::kFloat32;
  if (name == "bf16" || name == "bfloat16")
    return KvDtype::kBf16;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half")
    return KvDtype::kF16;
  if (name == "fp8_e4m3" || name == "fp8")
    return KvDtype::kFp8E4m3;
  if (name == "q8_0")
    return KvDtype::kQ8_0;
  if (name == "fp8_e5m2") {
    return invalid_argument(
        "--kv-cache-dtype fp8_e5m2 is not implemented; use auto, float32, bf16, f16, fp8_e4m3 "
        "or q8_0");
  }
  return invalid_argument(
      "--kv-cache-dtype must be auto, float32, bf16, f16, fp8_e4m3 or q8_0, got '" +
      std::string(name) + "'");
}

Status check_kv_dtype(KvDtype dtype, int64_t head_dim) {
  if (dtype == KvDtype::kQ8_0 && head_dim % 32 != 0) {
    return invalid_argument(
        "--kv-cache-dtype q8_0 needs head_dim to be a multiple of 32 "
        "(ggml's Q8_0 blocks of 32 along the head dimension); this model's "
        "head_dim is " +
        std::to_string(head_dim));
  }
  return Status::ok();
}

}  // namespace crescent::kernels
