// transfer_peer: the other process of the transfer engine's multi-process tests. It serves a
// segment of two regions filled with a seeded pattern, prints "DESC <descriptor>" and then
// answers commands on stdin, one per line (and checksum requests sent as notifications):
//   notification "sum OFFSET LENGTH" -> prints "sum <fnv1a-64 hex>" of the buffer's bytes
//   unregister ID       -> "ok" or "error <status>"
//   notes               -> "notes <count> <1 if every peer's notifications came in order>"
//   quit                -> exits
// Flags: --transport shm|tcp|ucx  --bytes N  --seed S  --token T  --listen-host H

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "tests/transfer/transfer_test_util.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"

using namespace crescent;
using namespace crescent::transfer;

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"--transport", "tcp"},
                                              {"--bytes", "16777216"},
                                              {"--seed", "1"},
                                              {"--token", ""},
                                              {"--listen-host", "127.0.0.1"}};
  for (int i = 1; i + 1 < argc; i += 2) {
    flags[argv[i]] = argv[i + 1];
  }
  EngineOptions o;
  o.transport = parse_transport(flags["--transport"]).value();
  o.name = "peer";
  o.token = flags["--token"];
  o.listen_host = flags["--listen-host"];
  std::mutex mu;
  std::map<std::string, int64_t> next_seq;  // per initiator name
  int64_t num_notes = 0;
  bool in_order = true;
  uint8_t* data = nullptr;
  o.on_notification = [&](const std::string& peer, std::string msg) {
    std::lock_guard<std::mutex> lock(mu);
    if (msg.rfind("sum ", 0) == 0) {
      // Checksums are taken on the notification path: the engine orders a peer's completed
      // WRITEs before its later notifications, so this reads what the peer wrote.
      std::istringstream in(msg.substr(4));
      uint64_t off = 0;
      uint64_t len = 0;
      in >> off >> len;
      std::printf("sum %016" PRIx64 "\n", testutil::fnv1a(data + off, len));
      std::fflush(stdout);
      return;
    }
    ++num_notes;
    int64_t seq = std::stoll(msg);
    if (seq != next_seq[peer])
      in_order = false;
    next_seq[peer] = seq + 1;
  };
  auto engine = TransferEngine::create(o);
  if (!engine.is_ok()) {
    std::fprintf(stderr, "peer: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  uint64_t bytes = std::stoull(flags["--bytes"]);
  SharedBuffer buf = allocate_shared(bytes).value();
  testutil::fill_pattern(buf.data(), bytes, std::stoull(flags["--seed"]));
  {
    std::lock_guard<std::mutex> lock(mu);
    data = buf.data();
  }
  (*engine)->register_region(buf.data(), bytes / 2).value();
  (*engine)->register_region(buf.data() + bytes / 2, bytes - bytes / 2).value();
  std::printf("DESC %s\n", (*engine)->local_segment().serialize().c_str());
  std::fflush(stdout);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "unregister") {
      int64_t id = 0;
      in >> id;
      Status s = (*engine)->unregister_region(RegionId(id), Deadline::after_ms(5000));
      std::printf("%s\n", s.is_ok() ? "ok" : ("error " + s.to_string()).c_str());
    } else if (cmd == "notes") {
      std::lock_guard<std::mutex> lock(mu);
      std::printf("notes %" PRId64 " %d\n", num_notes, in_order ? 1 : 0);
    } else if (cmd == "quit") {
      break;
    } else {
      std::printf("error unknown command\n");
    }
    std::fflush(stdout);
  }
  return 0;
}
