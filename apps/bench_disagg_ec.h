#pragma once
// `crescent bench disagg --encode`: the EC connector's transfer of one image's embeddings
// (EPD, DESIGN.md §2b) against a memcpy of the same bytes timed in the same run. An EcProducer
// and an EcConsumer, each with its own transfer engine, run in this process: every image is
// published into the producer's pool (the "encoder" writes it), then fetched by the consumer
// (HELLO once per connection; ACQUIRE, READ through the transport, RELEASE per image), which
// is what a prefill worker pays per image. See docs/epd_benchmark.md.

#include <string>
#include <vector>

namespace crescent::apps {

// args: the `crescent bench disagg` arguments without "--encode". Returns the exit code.
int bench_disagg_encode(const std::vector<std::string>& args);

}  // namespace crescent::apps
