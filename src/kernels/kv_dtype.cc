#include "kernels/kv_dtype.h"

#include <string>

#include "kernels/isa.h"

namespace crescent::kernels {

std::string_view kv_dtype_name(KvDtype dtype) {
  return dtype == KvDtype::kBf16 ? "bf16" : "float32";
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
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half" || name == "fp8" ||
      name == "fp8_e4m3" || name == "fp8_e5m2" || name == "q8_0") {
    return invalid_argument("--kv-cache-dtype " + std::string(name) +
                            " is not implemented yet; use auto, float32 or bf16");
  }
  return invalid_argument("--kv-cache-dtype must be auto, float32 or bf16, got '" +
                          std::string(name) + "'");
}

}  // namespace crescent::kernels
