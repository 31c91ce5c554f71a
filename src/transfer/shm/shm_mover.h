#pragma once
// The shm transport's mover: maps each granted region's memfd into this process (once per
// region and link) and copies with memcpy, on `num_copy_threads` threads for a batch of more
// than one chunk. Mappings stay alive while a RemoteRegionView holds them. Internal.

#include <memory>

#include "transfer/one_sided_link.h"

namespace crescent::transfer {

std::unique_ptr<Mover> make_shm_mover(int num_copy_threads);

}  // namespace crescent::transfer
