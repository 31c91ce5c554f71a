#pragma once
// A thin RAII layer over UCX (UCP) for the ucx transport and the raw-UCX benchmark baseline:
// one context and one worker per engine (thread mode MULTI), a progress thread that sleeps on
// the worker's event fd, memory mapping with packed remote keys, and endpoints that run a list
// of RMA puts/gets to completion (flush) under a deadline. UCX errors become Status here.
// Thread-safety: all methods are thread-safe (the worker is created with UCS_THREAD_MODE_MULTI).

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/status.h"

namespace crescent::transfer {

struct UcxMapping {
  void* memh = nullptr;
  std::string packed_rkey;
};

// One RMA op: put (local -> remote) or get (remote -> local).
struct UcxOp {
  bool is_put = true;
  void* local = nullptr;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
  void* rkey = nullptr;        // from UcxEndpoint::unpack_rkey
  void* local_memh = nullptr;  // optional: the local buffer's UcxMapping::memh
};

class UcxEndpoint;

class UcxContext {
 public:
  // tls: the UCX_TLS value used when the environment sets none (e.g. "tcp,sm,self"); empty:
  // UCX's default, every transport it finds.
  static Result<std::unique_ptr<UcxContext>> create(const std::string& tls);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  // This worker's address, to be sent to peers.
  const std::string& worker_address() const { return worker_address_; }
  Result<UcxMapping> map(void* addr, uint64_t bytes);
  void unmap(void* memh);
  Result<std::unique_ptr<UcxEndpoint>> connect(const std::string& peer_worker_address);

 private:
  friend class UcxEndpoint;
  UcxContext() = default;
  void progress_loop();

  void* context_ = nullptr;  // ucp_context_h
  void* worker_ = nullptr;   // ucp_worker_h
  std::string worker_address_;
  int event_fd_ = -1;
  int wake_fd_ = -1;
  struct Thread;
  std::unique_ptr<Thread> progress_;
};

class UcxEndpoint {
 public:
  ~UcxEndpoint();
  Result<void*> unpack_rkey(const std::string& packed);
  void destroy_rkey(void* rkey);
  // Posts every op, then flushes the endpoint; returns when all are complete, at the first
  // failure, or DeadlineExceeded (after which the endpoint is unusable).
  Status run(std::span<const UcxOp> ops, Deadline deadline);
  bool is_failed() const;

 private:
  friend class UcxContext;
  struct State;
  explicit UcxEndpoint(UcxContext* context) : context_(context) {}
  UcxContext* context_;
  void* ep_ = nullptr;
  std::shared_ptr<State> state_;
};

}  // namespace crescent::transfer
