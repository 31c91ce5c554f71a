#pragma once
// Reads the .npy files make_reference.py writes (format 1.0-3.0, C order, little-endian or
// byte-sized dtypes).

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::media::testing {

struct NpyArray {
  std::string dtype;           // numpy descr, e.g. "<f4", "|u1"
  std::vector<int64_t> shape;  // C order
  std::vector<uint8_t> data;   // raw element bytes

  int64_t num_elements() const;
};

Result<NpyArray> read_npy(const std::string& path);

}  // namespace crescent::media::testing
