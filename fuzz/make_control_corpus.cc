// Writes the seed inputs of control_frame_fuzz: real payloads produced by the encoders in the
// code, each prefixed with the selector byte control_frame_fuzz.cc reads. Usage:
//   build/fuzz/make_control_corpus DIR
// (built by `cmake --build build/fuzz --target make_control_corpus`; its output, minimized with
// the long runs' finds, is fuzz/corpus/control_frame_fuzz)

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bootstrap/wire.h"
#include "disagg/ec_protocol.h"
#include "disagg/protocol.h"
#include "net/auth/auth_token.h"
#include "net/frame.h"
#include "transfer/protocol.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace kv = crescent::disagg::protocol;
namespace ec = crescent::disagg::ec_protocol;
namespace bs = crescent::bootstrap;
namespace tr = crescent::transfer;
using crescent::net::ByteWriter;

namespace {

std::string g_dir;
int g_count = 0;

void put(uint8_t selector, const std::string& payload) {
  std::string path = g_dir + "/seed_" + std::to_string(selector) + "_" + std::to_string(g_count++);
  std::ofstream out(path, std::ios::binary);
  out.put(static_cast<char>(selector));
  out << payload;
}

std::string frame(uint16_t type, const std::string& payload) {
  uint8_t header[crescent::net::kFrameHeaderBytes];
  crescent::net::encode_frame_header({type, payload.size()}, header);
  return std::string(reinterpret_cast<char*>(header), sizeof(header)) + payload;
}

std::string piece(uint64_t id, int64_t region, uint64_t offset, uint64_t length) {
  ByteWriter w;
  w.u64(id);
  w.i64(region);
  w.u64(offset);
  w.u64(length);
  return w.take();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];

  kv::Hello hello;
  hello.compat = {"tiny-llama",           "float32", 2, 2, 16, 16, "block:layer:kv:token:head:dim",
                  "3f9c0a1b2c3d4e5f BF16"};
  hello.compat_hash = hello.compat.hash();
  hello.engine_id = "decode-0";
  hello.segment_descriptor =
      R"({"version":1,"engine_name":"d","transport":"tcp","address":"tcp:127.0.0.1:9","regions":[{"id":1,"length":4096}]})";
  hello.region_id = 1;
  hello.block_bytes = 4096;
  hello.num_blocks = 64;
  hello.heartbeat_interval_ms = 1000;
  put(0, kv::encode(hello));
  put(1, kv::encode(kv::HelloOk{kv::kProtocolVersion, "prefill-0"}));
  put(2, kv::encode(kv::Refused{kv::RefusalKind::kCompatibility, "block_size: 16 here, 32 there"}));
  kv::Ask ask;
  ask.transfer_id = "cmpl-1-abc";
  ask.num_prompt_tokens = 40;
  ask.prompt_hash = 12345;
  ask.first_block = 1;
  ask.block_ids = {7, 8};
  put(3, kv::encode(ask));
  put(4, kv::encode(kv::TransferRef{"cmpl-1-abc"}));
  kv::Done done;
  done.transfer_id = "cmpl-1-abc";
  done.status = crescent::data_loss("peer went away");
  done.num_bytes = 8192;
  done.write_ns = 1000;
  put(5, kv::encode(done));

  ec::Hello ehello;
  ehello.compat = {"siglip", "float32", 1152, "abc123"};
  ehello.consumer_name = "prefill-0";
  ehello.heartbeat_interval_ms = 1000;
  put(6, ec::encode(ehello));
  put(7, ec::encode(ec::HelloOk{ec::kProtocolVersion, "encoder-0", hello.segment_descriptor}));
  put(8, ec::encode(ec::Refused{ec::RefusalKind::kProtocol, "protocol version 2 is not 1"}));
  put(9, ec::encode(ec::Acquire{42, "a1b2c3", 4096}));
  put(10, ec::encode(ec::Acquired{42, 3, 128, 4096}));
  put(11, ec::encode(ec::AcquireFailed{42, ec::AcquireFailure::kExpired, "expired"}));
  ec::Release release;
  release.reservation_id = 42;
  release.mm_hash = "a1b2c3";
  put(12, ec::encode(release));
  release.has_location = true;
  release.instance = 7;
  release.region_id = 3;
  release.offset = 128;
  put(12, ec::encode(release));
  put(12, ec::encode(ec::Released{42, true}));

  crescent::disagg::EcTensorRef ref;
  ref.mm_hash = "a1b2c3";
  ref.engine_id = "encoder-0";
  ref.worker_addr = "tcp://127.0.0.1:9100";
  ref.bootstrap_addr = "http://127.0.0.1:8998";
  ref.reservation_id = 42;
  ref.shape = {4, 8};
  ref.num_bytes = 128;
  ref.expires_at_unix_ms = 1700000000000;
  std::vector<crescent::disagg::EcTensorRef> refs{ref};
  ref.has_location = true;
  ref.region_id = 3;
  ref.offset = 256;
  ref.instance = 9;
  ref.stamp = 1;
  refs.push_back(ref);
  put(13, crescent::disagg::ec_transfer_params_to_json(refs).dump());

  bs::WorkerRegistration reg;
  reg.engine_id = "prefill-0";
  reg.addr = "tcp://127.0.0.1:9000";
  reg.lease_ttl_s = 10;
  put(14, bs::registration_json(reg));
  reg.role = "encode";
  put(14, bs::registration_json(reg));
  bs::QueryResult query;
  query[0].engine_id = "prefill-0";
  query[0].epoch = 2;
  query[0].worker_addr[0][0] = "tcp://127.0.0.1:9000";
  put(15, bs::query_json(query));
  put(16, bs::registered_json(bs::Registered{3, 10, false}));
  put(16, R"({"status":"ok"})");
  put(17, bs::encoders_json({{"encoder-0", "tcp://127.0.0.1:9100"}}));
  put(18, bs::error_json("conflicting registration", "invalid_request_error", "400"));

  tr::SegmentDescriptor seg;
  seg.engine_name = "prefill-0";
  seg.address = "tcp:127.0.0.1:9001";
  seg.regions = {{tr::RegionId(1), 4096}};
  put(19, seg.serialize());
  ByteWriter status;
  tr::write_status(status, crescent::invalid_argument("region 9 is not registered"));
  put(19, status.take());
  put(19, frame(tr::wire::kAck, piece(1, 1, 0, 8)));
  put(19, crescent::net::auth::to_hex("transfer-token"));

  // Transfer target streams against regions 1 (256 bytes) and 2 (4096 bytes).
  put(20, frame(tr::wire::kWriteData, piece(1, 1, 0, 8) + "abcdefgh") +
              frame(tr::wire::kReadReq, piece(2, 1, 0, 8)));
  put(20, frame(tr::wire::kReadReq, piece(3, 2, 4000, 200)));  // out of bounds
  {
    ByteWriter w;
    w.u64(5);
    w.u32(2);
    w.i64(1);
    w.u64(0);
    w.u64(4);
    w.i64(2);
    w.u64(100);
    w.u64(4);
    put(20,
        frame(tr::wire::kWriteGroup, w.str() + "wxyz1234") + frame(tr::wire::kReadGroup, w.str()));
  }
  {
    ByteWriter w;
    w.u64(7);
    w.u32(2);
    w.u8(1);
    w.i64(1);
    w.u64(0);
    w.u64(64);
    w.u8(2);
    w.i64(2);
    w.u64(0);
    w.u64(4096);
    ByteWriter rel;
    rel.u64(7);
    put(20, frame(tr::wire::kLease, w.str()) + frame(tr::wire::kRelease, rel.str()));
    put(20, frame(tr::wire::kLease, w.str()));  // released when the connection ends
  }
  std::printf("wrote %d seeds to %s\n", g_count, g_dir.c_str());
  return 0;
}
