#pragma once
// The ucx transport's mover: unpacks each granted region's rkey on the link's endpoint and
// runs the pieces as UCP puts/gets, passing the local region's memory handle when the local
// buffer is registered. Internal to the transfer module.

#include <memory>

#include "transfer/one_sided_link.h"
#include "transfer/ucx/ucx_context.h"

namespace crescent::transfer {

class RegionTable;

std::unique_ptr<Mover> make_ucx_mover(std::unique_ptr<UcxEndpoint> ep,
                                      const RegionTable* local_regions);

}  // namespace crescent::transfer
