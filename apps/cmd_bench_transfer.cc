// `crescent bench transfer`: measures the transfer engine between two processes on this host
// (this one and a forked/exec'd target), and a same-run baseline for the transport: a 1-thread
// memcpy (shm), a plain TCP socket stream on loopback (tcp), raw UCX put (ucx); for ucx also
// `ucx_perftest -t ucp_put_bw` between two child processes on 127.0.0.1, with and without -e.

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "apps/command.h"
#include "apps/flags.h"
#include "core/clock.h"
#include "net/socket.h"
#include "transfer/shared_memory.h"
#include "transfer/transfer_engine.h"
#include "transfer/ucx/ucx_context.h"

namespace crescent::apps {
namespace {

using transfer::OpKind;
using transfer::TransferOp;

std::string hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out(h.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

double seconds_since(TimePoint t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The target process: serves the engine segment, a plain TCP sink and a raw UCX mapping.
int run_target(transfer::TransportKind kind, uint64_t region_bytes) {
  transfer::EngineOptions o;
  o.transport = kind;
  o.name = "bench-target";
  auto engine = transfer::TransferEngine::create(o);
  if (!engine.is_ok()) {
    std::fprintf(stderr, "target: %s\n", engine.status().to_string().c_str());
    return 1;
  }
  auto region = transfer::allocate_shared(region_bytes);
  if (!region.is_ok())
    return 1;
  std::memset(region->data(), 1, region->size());
  if (!(*engine)->register_region(region->data(), region_bytes).is_ok())
    return 1;
  std::printf("DESC %s\n", (*engine)->local_segment().serialize().c_str());

  auto sink = net::listen_tcp("127.0.0.1", 0);
  if (!sink.is_ok())
    return 1;
  std::printf("SINK %d\n", net::local_port(*sink).value());
  std::unique_ptr<transfer::UcxContext> raw;
  void* raw_memh = nullptr;  // unmapped before `raw` is destroyed (ucp_cleanup asserts otherwise)
  if (kind == transfer::TransportKind::kUcx) {
    raw = std::move(transfer::UcxContext::create("").value());
    auto m = raw->map(region->data(), region_bytes).value();
    raw_memh = m.memh;
    std::printf("UCXRAW %s %s %llu\n", hex(raw->worker_address()).c_str(),
                hex(m.packed_rkey).c_str(),
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(region->data())));
  }
  std::fflush(stdout);
  std::atomic<bool> stop{false};
  std::thread sink_thread([&] {
    std::vector<char> buf(4 << 20);
    while (!stop.load()) {
      auto c = net::accept_with_deadline(*sink, Deadline::after_ms(200));
      if (!c.is_ok())
        continue;
      net::tune_tcp_stream(*c);
      for (;;) {
        ssize_t n = ::recv(c->get(), buf.data(), buf.size(), 0);
        if (n > 0)
          continue;
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
          pollfd p{c->get(), POLLIN, 0};
          ::poll(&p, 1, 200);
          continue;
        }
        break;
      }
      char ack = 'k';
      (void)net::write_all(*c, &ack, 1, Deadline::after_ms(1000));
    }
  });
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  stop.store(true);
  sink_thread.join();
  if (raw)
    raw->unmap(raw_memh);
  return 0;
}

struct Target {
  pid_t pid = -1;
  int to_child = -1;
  FILE* from_child = nullptr;
  std::string desc, ucx_worker, ucx_rkey;
  int sink_port = 0;
  uint64_t ucx_addr = 0;
};

Result<Target> spawn_target(const std::string& transport, uint64_t region_bytes) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0)
    return internal_error("pipe");
  std::string bytes = std::to_string(region_bytes);
  pid_t pid = ::fork();
  if (pid < 0)
    return internal_error("fork");
  if (pid == 0) {
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    const char* argv[] = {"crescent",    "bench",       "transfer",        "--role",
                          "target",      "--transport", transport.c_str(), "--region-bytes",
                          bytes.c_str(), nullptr};
    ::execv("/proc/self/exe", const_cast<char**>(argv));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  Target t;
  t.pid = pid;
  t.to_child = in[1];
  t.from_child = ::fdopen(out[0], "r");
  char line[1 << 16];
  int expected = transport == "ucx" ? 3 : 2;
  for (int i = 0; i < expected; ++i) {
    if (std::fgets(line, sizeof(line), t.from_child) == nullptr)
      return unavailable("target died");
    std::string l(line);
    if (!l.empty() && l.back() == '\n')
      l.pop_back();
    if (l.rfind("DESC ", 0) == 0) {
      t.desc = l.substr(5);
    } else if (l.rfind("SINK ", 0) == 0) {
      t.sink_port = std::stoi(l.substr(5));
    } else if (l.rfind("UCXRAW ", 0) == 0) {
      char w[8192], r[8192];
      unsigned long long a = 0;
      if (std::sscanf(l.c_str() + 7, "%8191s %8191s %llu", w, r, &a) != 3)
        return data_loss("UCXRAW");
      t.ucx_worker = unhex(w);
      t.ucx_rkey = unhex(r);
      t.ucx_addr = a;
    }
  }
  return t;
}

// `ucx_perftest -t ucp_put_bw` between a server and a client process on 127.0.0.1, both
// children of this one (the yardstick for the ucx transport). Returns GB/s (1e9 B/s)
// from the client's "overall" bandwidth (UCX prints MB/s of 2^20 bytes). `error_handling` adds
// -e: endpoints with peer-failure handling, as the engine creates them.
Result<double> run_ucx_perftest(int64_t op_bytes, int iterations, bool error_handling) {
  // A free port: bound once by us, then handed to the perftest server.
  int port = 0;
  {
    auto probe = net::listen_tcp("127.0.0.1", 0);
    if (!probe.is_ok())
      return probe.status();
    port = net::local_port(*probe).value();
  }
  std::string port_s = std::to_string(port);
  std::string size_s = std::to_string(op_bytes);
  std::string iters_s = std::to_string(iterations);
  auto spawn = [&](bool is_client, int out_fd) -> pid_t {
    pid_t pid = ::fork();
    if (pid != 0)
      return pid;
    int devnull = ::open("/dev/null", O_RDWR);
    ::dup2(devnull, 0);
    ::dup2(out_fd >= 0 ? out_fd : devnull, 1);
    ::dup2(devnull, 2);
    std::vector<const char*> argv = {"ucx_perftest"};
    if (is_client) {
      for (const char* a : {"127.0.0.1", "-t", "ucp_put_bw", "-f"})
        argv.push_back(a);
      argv.push_back("-s");
      argv.push_back(size_s.c_str());
      argv.push_back("-n");
      argv.push_back(iters_s.c_str());
      argv.push_back("-w");
      argv.push_back("10");
    }
    argv.push_back("-p");
    argv.push_back(port_s.c_str());
    if (error_handling)
      argv.push_back("-e");
    argv.push_back(nullptr);
    ::execvp("ucx_perftest", const_cast<char**>(argv.data()));
    ::_exit(127);
  };
  pid_t server = spawn(false, -1);
  if (server < 0)
    return internal_error("fork");
  // The server needs a moment to listen; the client does not retry by itself.
  std::string out;
  int client_status = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
      break;
    pid_t client = spawn(true, pipe_fds[1]);
    ::close(pipe_fds[1]);
    out.clear();
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0)
      out.append(buf, static_cast<size_t>(n));
    ::close(pipe_fds[0]);
    ::waitpid(client, &client_status, 0);
    if (WIFEXITED(client_status) && WEXITSTATUS(client_status) == 0)
      break;
    int server_status = 0;
    if (::waitpid(server, &server_status, WNOHANG) == server) {
      return unavailable("ucx_perftest server exited (status " + std::to_string(server_status) +
                         "; is ucx_perftest installed?)");
    }
  }
  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
  if (!WIFEXITED(client_status) || WEXITSTATUS(client_status) != 0)
    return unavailable("ucx_perftest client failed: " + out);
  // The final line: iterations, 3 latencies, bandwidth average and overall, 2 message rates.
  double f[8];
  size_t last = out.find_last_not_of(" \n");
  size_t begin = out.rfind('\n', last == std::string::npos ? 0 : last);
  std::string line = out.substr(begin == std::string::npos ? 0 : begin + 1);
  if (std::sscanf(line.c_str(), "%lf %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3],
                  &f[4], &f[5], &f[6], &f[7]) != 8) {
    return data_loss("cannot parse ucx_perftest output: " + line);
  }
  return f[5] * 1048576.0 / 1e9;
}

void stop_target(Target& t) {
  ::close(t.to_child);
  int status = 0;
  ::waitpid(t.pid, &status, 0);
  std::fclose(t.from_child);
}

struct Measure {
  double gbps = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  int64_t num_batches = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// Builds the ops of one batch: `batch` ops of `op_bytes` from a contiguous local window to
// shuffled remote slots of the thread's window, so that no two ops are adjacent on both sides
// (coalescing cannot merge them; this measures per-op cost honestly).
std::vector<TransferOp> make_batch(uint8_t* local, transfer::RegionId region, uint64_t remote_base,
                                   uint64_t op_bytes, int batch, std::mt19937_64& rng) {
  std::vector<uint64_t> slots(batch);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  if (batch > 1 && slots[0] == 0 && slots[1] == 1)
    std::swap(slots[0], slots[batch - 1]);
  std::vector<TransferOp> ops(batch);
  for (int i = 0; i < batch; ++i) {
    ops[i] = {OpKind::kWrite, local + i * op_bytes, region, remote_base + slots[i] * op_bytes,
              op_bytes};
  }
  return ops;
}

int run_bench(const std::string& transport, int64_t op_bytes, int batch, int threads, double secs,
              int copy_threads) {
  auto kind = transfer::parse_transport(transport);
  if (!kind.is_ok()) {
    std::fprintf(stderr, "error: %s\n", kind.status().message().c_str());
    return 2;
  }
  uint64_t window = static_cast<uint64_t>(op_bytes) * batch;
  // Each thread cycles over a few windows, so the working set is well beyond the caches.
  int windows_per_thread =
      static_cast<int>(std::max<uint64_t>(1, (256ull << 20) / window / threads));
  uint64_t region_bytes = window * windows_per_thread * threads;
  auto target = spawn_target(transport, region_bytes);
  if (!target.is_ok()) {
    std::fprintf(stderr, "error: %s\n", target.status().to_string().c_str());
    return 1;
  }
  auto desc = transfer::SegmentDescriptor::parse(target->desc).value();
  transfer::EngineOptions o;
  o.transport = *kind;
  o.name = "bench-initiator";
  o.num_copy_threads = copy_threads;
  auto engine = transfer::TransferEngine::create(o).value();
  auto peer = engine->open_segment(desc, Deadline::after_ms(10000));
  if (!peer.is_ok()) {
    std::fprintf(stderr, "error: %s\n", peer.status().to_string().c_str());
    return 1;
  }
  auto src = transfer::allocate_shared(region_bytes).value();
  std::memset(src.data(), 7, src.size());
  if (*kind == transfer::TransportKind::kUcx) {
    (void)engine->register_region(src.data(), src.size());  // local memh for the puts
  }

  // Engine run.
  std::vector<std::vector<double>> lat(threads);
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int th = 0; th < threads; ++th) {
    workers.emplace_back([&, th] {
      std::mt19937_64 rng(th);
      for (int64_t it = 0; seconds_since(t0) < secs; ++it) {
        uint64_t base =
            (static_cast<uint64_t>(th) * windows_per_thread + it % windows_per_thread) * window;
        auto ops = make_batch(src.data() + base, desc.regions[0].id, base, op_bytes, batch, rng);
        auto b0 = Clock::now();
        auto id = engine->submit(*peer, ops, Deadline::after_ms(30000));
        Status s = id.is_ok() ? engine->wait(*id, Deadline::after_ms(30000)) : id.status();
        if (!s.is_ok()) {
          std::fprintf(stderr, "batch failed: %s\n", s.to_string().c_str());
          failed.store(true);
          return;
        }
        engine->release(*id);
        lat[th].push_back(seconds_since(b0) * 1e3);
        bytes.fetch_add(window);
      }
    });
  }
  for (auto& w : workers)
    w.join();
  double elapsed = seconds_since(t0);
  if (failed.load())
    return 1;
  std::vector<double> all;
  for (auto& v : lat)
    all.insert(all.end(), v.begin(), v.end());
  Measure m{bytes.load() / elapsed / 1e9, percentile(all, 0.5), percentile(all, 0.99),
            static_cast<int64_t>(all.size())};

  // Baseline.
  std::string baseline_name;
  double baseline = 0;
  auto b0 = Clock::now();
  uint64_t base_bytes = 0;
  if (*kind == transfer::TransportKind::kShm) {
    baseline_name = "1-thread memcpy";
    auto dst = transfer::allocate_shared(region_bytes).value();
    std::memset(dst.data(), 0, dst.size());
    b0 = Clock::now();
    for (int64_t it = 0; seconds_since(b0) < secs; ++it) {
      uint64_t base = (it % (windows_per_thread * threads)) * window;
      for (int i = 0; i < batch; ++i) {
        std::memcpy(dst.data() + base + i * op_bytes, src.data() + base + i * op_bytes, op_bytes);
      }
      base_bytes += window;
    }
  } else if (*kind == transfer::TransportKind::kTcp) {
    baseline_name = "plain TCP stream (1 socket)";
    auto fd = net::connect_tcp("127.0.0.1", target->sink_port, Deadline::after_ms(5000)).value();
    net::tune_tcp_stream(fd);
    b0 = Clock::now();
    for (int64_t it = 0; seconds_since(b0) < secs; ++it) {
      uint64_t base = (it % (windows_per_thread * threads)) * window;
      if (!net::write_all(fd, src.data() + base, window, Deadline::after_ms(30000)).is_ok())
        return 1;
      base_bytes += window;
    }
    ::shutdown(fd.get(), SHUT_WR);
    char ack;
    (void)net::read_exact(fd, &ack, 1, Deadline::after_ms(30000));
  } else {
    baseline_name = "raw UCX put + flush";
    auto ctx = transfer::UcxContext::create("").value();
    auto ep = ctx->connect(target->ucx_worker).value();
    void* rkey = ep->unpack_rkey(target->ucx_rkey).value();
    auto local = ctx->map(src.data(), src.size()).value();
    std::mt19937_64 rng(1);
    b0 = Clock::now();
    for (int64_t it = 0; seconds_since(b0) < secs; ++it) {
      uint64_t base = (it % (windows_per_thread * threads)) * window;
      std::vector<transfer::UcxOp> ops(batch);
      for (int i = 0; i < batch; ++i) {
        ops[i] = {true,
                  src.data() + base + i * op_bytes,
                  target->ucx_addr + base + i * op_bytes,
                  static_cast<uint64_t>(op_bytes),
                  rkey,
                  local.memh};
      }
      if (!ep->run(ops, Deadline::after_ms(30000)).is_ok())
        return 1;
      base_bytes += window;
    }
    ep->destroy_rkey(rkey);
    ep.reset();
    ctx->unmap(local.memh);
  }
  baseline = base_bytes / seconds_since(b0) / 1e9;
  stop_target(*target);

  // ucx: the same message size through ucx_perftest, as UCX runs it by default (its own
  // transport choice, memory it allocates itself) and with peer-failure handling (-e).
  Result<double> perftest = unavailable("not run");
  Result<double> perftest_e = unavailable("not run");
  if (*kind == transfer::TransportKind::kUcx) {
    perftest = run_ucx_perftest(op_bytes, 1000, false);
    // Sized from the engine's rate, so that a tcp-bound run stays near --seconds.
    int iters_e = static_cast<int>(
        std::clamp(m.gbps * 1e9 * secs / static_cast<double>(op_bytes), 10.0, 1000.0));
    perftest_e = run_ucx_perftest(op_bytes, iters_e, true);
  }

  std::printf("bench transfer: transport=%s op_size=%lld B batch=%d threads=%d (%s)\n",
              transport.c_str(), static_cast<long long>(op_bytes), batch, threads,
              "two processes, WRITE, non-adjacent ops");
  std::printf("  engine:   %8.2f GB/s   batch latency p50 %.3f ms  p99 %.3f ms  (%lld batches)\n",
              m.gbps, m.p50_ms, m.p99_ms, static_cast<long long>(m.num_batches));
  std::printf("  baseline: %8.2f GB/s   %s, same run\n", baseline, baseline_name.c_str());
  std::printf("  ratio:    %8.2f\n", baseline > 0 ? m.gbps / baseline : 0.0);
  if (*kind == transfer::TransportKind::kUcx) {
    auto report = [&](const char* what, const Result<double>& r) {
      if (r.is_ok()) {
        std::printf("  %s %8.2f GB/s   ratio %.2f\n", what, *r, *r > 0 ? m.gbps / *r : 0.0);
      } else {
        std::printf("  %s not measured: %s\n", what, r.status().to_string().c_str());
      }
    };
    std::printf("  ucx_perftest -t ucp_put_bw -s %lld on 127.0.0.1, same run:\n",
                static_cast<long long>(op_bytes));
    report("  default:                      ", perftest);
    report("  -e (peer-failure handling):   ", perftest_e);
  }
  return 0;
}

int bench_transfer(const std::vector<std::string>& args) {
  std::string transport = "tcp";
  int64_t op_bytes = 4 << 20;
  int batch = 16;
  int threads = 1;
  int copy_threads = 1;
  double seconds = 2.0;
  std::string role = "initiator";
  int64_t region_bytes = 0;
  FlagParser flags(
      "crescent bench transfer --transport shm|tcp|ucx [--op-size BYTES] [--batch N] "
      "[--threads N]",
      "Measures the transfer engine between this process and a target process it "
      "starts, against a same-run baseline for the transport (ucx: raw UCX put, and "
      "ucx_perftest -t ucp_put_bw with the same message size between two child processes "
      "on 127.0.0.1, by default and with -e, peer-failure handling as the engine uses).");
  flags.add("transport", &transport, "shm, tcp or ucx");
  flags.add("op-size", &op_bytes, "bytes per op");
  flags.add("batch", &batch, "ops per batch");
  flags.add("threads", &threads, "submitting threads");
  flags.add("copy-threads", &copy_threads, "shm: threads that copy one batch");
  flags.add("seconds", &seconds, "duration of each measurement");
  flags.add("role", &role, "internal: initiator or target");
  flags.add("region-bytes", &region_bytes, "internal: the target's region size");
  int rc = flags.parse_or_exit_code(args);
  if (rc >= 0)
    return rc;
  auto kind = transfer::parse_transport(transport);
  if (!kind.is_ok() || op_bytes <= 0 || batch <= 0 || threads <= 0 || threads > 64) {
    std::fprintf(stderr, "error: bad flags (see --help)\n");
    return 2;
  }
  if (role == "target")
    return run_target(*kind, static_cast<uint64_t>(region_bytes));
  return run_bench(transport, op_bytes, batch, threads, seconds, copy_threads);
}

}  // namespace
}  // namespace crescent::apps

CRESCENT_REGISTER_COMMAND(bench_transfer, "bench transfer",
                          "transfer engine throughput/latency between two processes",
                          crescent::apps::bench_transfer)
