#pragma once
// The CPU kernels module (crescent::kernels): one signature per op, dispatched at run time to
// the best implementation the CPU has (isa.h). See docs/kernels.md.

#include "kernels/attention.h"  // IWYU pragma: export
#include "kernels/baselines.h"  // IWYU pragma: export
#include "kernels/isa.h"        // IWYU pragma: export
#include "kernels/matmul.h"     // IWYU pragma: export
#include "kernels/ops.h"        // IWYU pragma: export
