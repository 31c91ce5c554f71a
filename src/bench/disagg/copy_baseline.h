#pragma once
// The memcpy baselines of `crescent bench disagg`, timed in the benchmark's own process between
// requests (under the same machine load as the KV transfers they are set against), and the
// variants that show where a copy into shared memory pays for page faults.

#include <cstdint>
#include <string>

#include "core/status.h"

namespace crescent::bench {

enum class CopyKind {
  kTouched,          // the baseline: one memcpy, both buffers page-touched beforehand
  kTouchedPieces,    // the same in 1 MiB memcpys (how the shm transport cuts a batch)
  kUntouchedShared,  // into shared memory no one has touched: every page allocated on the way
  kSecondMapping,    // into touched shared memory through a fresh second mapping of its memfd:
                     // page-table faults only (P's view of D's KV cache)
};
inline constexpr CopyKind kCopyKinds[] = {CopyKind::kTouched, CopyKind::kTouchedPieces,
                                          CopyKind::kUntouchedShared, CopyKind::kSecondMapping};

// The report's row label and the JSON key of a kind.
const char* copy_kind_name(CopyKind kind);
const char* copy_kind_key(CopyKind kind);

// The report's verdict on transfer / memcpy `ratio` against `target`, which applies to the shm
// transport only: "target <= 2.0: PASS" (with `what` naming the figures compared, e.g.
// "(bests) "), or "(the target <= 2.0 is for shm)".
std::string shm_target_verdict(const std::string& transport, double ratio, double target,
                               const std::string& what = "");

// Seconds for one copy of num_bytes (> 0) from fresh, page-touched shared memory (like a KV
// cache) into a destination prepared as `kind` says. Buffers are new each time, so nothing is
// cache-warm from an earlier copy; the copy is checked to have landed.
Result<double> time_one_copy(uint64_t num_bytes, CopyKind kind);

}  // namespace crescent::bench
