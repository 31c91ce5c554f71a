#include "transfer/ucx/ucx_context.h"

#if CRESCENT_HAVE_UCX
#include <ucp/api/ucp.h>
#endif

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>
#include <vector>

#if CRESCENT_HAVE_UCX

namespace crescent::transfer {

namespace {

Status ucx_status(const std::string& what, ucs_status_t s) {
  std::string msg = what + ": " + ucs_status_string(s);
  switch (s) {
    case UCS_ERR_NO_MEMORY:
      return resource_exhausted(msg);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CANCELED:
      return unavailable(msg);
    case UCS_ERR_TIMED_OUT:
      return deadline_exceeded(msg);
    default:
      return internal_error(msg);
  }
}

ucp_worker_h worker_of(void* w) {
  return static_cast<ucp_worker_h>(w);
}

}  // namespace

struct UcxContext::Thread {
  std::thread thread;
  std::atomic<bool> stop{false};
};

struct UcxEndpoint::State {
  std::atomic<int> error{UCS_OK};
};

Result<std::unique_ptr<UcxContext>> UcxContext::create(const std::string& tls) {
  std::unique_ptr<UcxContext> c(new UcxContext());
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK)
    return ucx_status("ucp_config_read", s);
  if (std::getenv("UCX_TLS") == nullptr && !tls.empty()) {
    s = ucp_config_modify(config, "TLS", tls.c_str());
    if (s != UCS_OK) {
      ucp_config_release(config);
      return ucx_status("UCX_TLS=" + tls, s);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK)
    return ucx_status("ucp_init", s);
  c->context_ = context;

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h worker = nullptr;
  s = ucp_worker_create(context, &wp, &worker);
  if (s != UCS_OK)
    return ucx_status("ucp_worker_create", s);
  c->worker_ = worker;

  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  s = ucp_worker_get_address(worker, &address, &address_bytes);
  if (s != UCS_OK)
    return ucx_status("ucp_worker_get_address", s);
  c->worker_address_.assign(reinterpret_cast<const char*>(address), address_bytes);
  ucp_worker_release_address(worker, address);

  s = ucp_worker_get_efd(worker, &c->event_fd_);
  if (s != UCS_OK)
    return ucx_status("ucp_worker_get_efd", s);
  c->wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->wake_fd_ < 0)
    return internal_error("eventfd failed");
  c->progress_ = std::make_unique<Thread>();
  UcxContext* raw = c.get();
  c->progress_->thread = std::thread([raw] { raw->progress_loop(); });
  return c;
}

// Progresses the worker whenever UCX has work (a peer's put over tcp needs the target's
// progress), sleeping on the worker's event fd in between.
void UcxContext::progress_loop() {
  ucp_worker_h w = worker_of(worker_);
  while (!progress_->stop.load()) {
    while (ucp_worker_progress(w) != 0) {
    }
    ucs_status_t s = ucp_worker_arm(w);
    if (s == UCS_ERR_BUSY)
      continue;
    pollfd fds[2] = {{event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    ::poll(fds, 2, 100);
  }
}

UcxContext::~UcxContext() {
  if (progress_) {
    progress_->stop.store(true);
    uint64_t one = 1;
    (void)::write(wake_fd_, &one, sizeof(one));
    if (progress_->thread.joinable())
      progress_->thread.join();
  }
  if (worker_ != nullptr)
    ucp_worker_destroy(worker_of(worker_));
  if (context_ != nullptr)
    ucp_cleanup(static_cast<ucp_context_h>(context_));
  if (wake_fd_ >= 0)
    ::close(wake_fd_);
}

Result<UcxMapping> UcxContext::map(void* addr, uint64_t bytes) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = addr;
  mp.length = bytes;
  ucp_mem_h memh = nullptr;
  auto context = static_cast<ucp_context_h>(context_);
  ucs_status_t s = ucp_mem_map(context, &mp, &memh);
  if (s != UCS_OK)
    return ucx_status("ucp_mem_map", s);
  void* packed = nullptr;
  size_t packed_bytes = 0;
  s = ucp_rkey_pack(context, memh, &packed, &packed_bytes);
  if (s != UCS_OK) {
    ucp_mem_unmap(context, memh);
    return ucx_status("ucp_rkey_pack", s);
  }
  UcxMapping m;
  m.memh = memh;
  m.packed_rkey.assign(static_cast<const char*>(packed), packed_bytes);
  ucp_rkey_buffer_release(packed);
  return m;
}

void UcxContext::unmap(void* memh) {
  ucp_mem_unmap(static_cast<ucp_context_h>(context_), static_cast<ucp_mem_h>(memh));
}

Result<std::unique_ptr<UcxEndpoint>> UcxContext::connect(const std::string& peer_worker_address) {
  if (peer_worker_address.empty())
    return invalid_argument("empty UCX worker address");
  std::unique_ptr<UcxEndpoint> ep(new UcxEndpoint(this));
  ep->state_ = std::make_shared<UcxEndpoint::State>();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_worker_address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  // The state outlives the endpoint's callbacks: the endpoint is closed before it is freed.
  params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
    static_cast<UcxEndpoint::State*>(arg)->error.store(status);
  };
  params.err_handler.arg = ep->state_.get();
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(worker_of(worker_), &params, &h);
  if (s != UCS_OK)
    return ucx_status("ucp_ep_create", s);
  ep->ep_ = h;
  return ep;
}

UcxEndpoint::~UcxEndpoint() {
  if (ep_ == nullptr)
    return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(static_cast<ucp_ep_h>(ep_), &param);
  if (UCS_PTR_IS_PTR(req)) {
    Deadline d = Deadline::after_ms(2000);
    while (ucp_request_check_status(req) == UCS_INPROGRESS && !d.is_expired()) {
      ucp_worker_progress(worker_of(context_->worker_));
    }
    ucp_request_free(req);
  }
}

Result<void*> UcxEndpoint::unpack_rkey(const std::string& packed) {
  ucp_rkey_h rkey = nullptr;
  ucs_status_t s = ucp_ep_rkey_unpack(static_cast<ucp_ep_h>(ep_), packed.data(), &rkey);
  if (s != UCS_OK)
    return ucx_status("ucp_ep_rkey_unpack", s);
  return static_cast<void*>(rkey);
}

void UcxEndpoint::destroy_rkey(void* rkey) {
  ucp_rkey_destroy(static_cast<ucp_rkey_h>(rkey));
}

bool UcxEndpoint::is_failed() const {
  return state_->error.load() != UCS_OK;
}

Status UcxEndpoint::run(std::span<const UcxOp> ops, Deadline deadline) {
  if (is_failed()) {
    return ucx_status("UCX endpoint failed", static_cast<ucs_status_t>(state_->error.load()));
  }
  auto ep = static_cast<ucp_ep_h>(ep_);
  ucp_worker_h worker = worker_of(context_->worker_);
  for (const UcxOp& op : ops) {
    ucp_request_param_t param{};
    if (op.local_memh != nullptr) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = static_cast<ucp_mem_h>(op.local_memh);
    }
    auto rkey = static_cast<ucp_rkey_h>(op.rkey);
    ucs_status_ptr_t req = op.is_put
                               ? ucp_put_nbx(ep, op.local, op.length, op.remote_addr, rkey, &param)
                               : ucp_get_nbx(ep, op.local, op.length, op.remote_addr, rkey, &param);
    if (UCS_PTR_IS_ERR(req))
      return ucx_status(op.is_put ? "ucp_put_nbx" : "ucp_get_nbx", UCS_PTR_STATUS(req));
    // Completion is observed through the flush below.
    if (req != nullptr)
      ucp_request_free(req);
  }
  ucp_request_param_t param{};
  ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &param);
  if (UCS_PTR_IS_ERR(flush))
    return ucx_status("ucp_ep_flush_nbx", UCS_PTR_STATUS(flush));
  if (flush == nullptr)
    return Status::ok();
  ucs_status_t s;
  for (;;) {
    s = ucp_request_check_status(flush);
    if (s != UCS_INPROGRESS)
      break;
    if (deadline.is_expired() || is_failed())
      break;
    if (ucp_worker_progress(worker) == 0)
      sched_yield();
  }
  ucp_request_free(flush);
  if (s == UCS_INPROGRESS) {
    if (is_failed()) {
      return ucx_status("UCX endpoint failed", static_cast<ucs_status_t>(state_->error.load()));
    }
    return deadline_exceeded("UCX transfer did not complete before the deadline");
  }
  if (s != UCS_OK)
    return ucx_status("UCX flush", s);
  return Status::ok();
}

}  // namespace crescent::transfer
#else  // !CRESCENT_HAVE_UCX

// Built without UCX (ThreadSanitizer builds: UCX's libucm patches mmap/madvise at load time
// and crashes TSan at the first pthread_create). The ucx transport reports itself unavailable.
namespace crescent::transfer {

namespace {
Status no_ucx() {
  return unimplemented("this build has no UCX (CRESCENT_WITH_UCX=OFF, e.g. a TSan build)");
}
}  // namespace

struct UcxContext::Thread {};
struct UcxEndpoint::State {};

Result<std::unique_ptr<UcxContext>> UcxContext::create(const std::string&) {
  return no_ucx();
}
UcxContext::~UcxContext() = default;
void UcxContext::progress_loop() {}
Result<UcxMapping> UcxContext::map(void*, uint64_t) {
  return no_ucx();
}
void UcxContext::unmap(void*) {}
Result<std::unique_ptr<UcxEndpoint>> UcxContext::connect(const std::string&) {
  return no_ucx();
}
UcxEndpoint::~UcxEndpoint() = default;
Result<void*> UcxEndpoint::unpack_rkey(const std::string&) {
  return no_ucx();
}
void UcxEndpoint::destroy_rkey(void*) {}
Status UcxEndpoint::run(std::span<const UcxOp>, Deadline) {
  return no_ucx();
}
bool UcxEndpoint::is_failed() const {
  return true;
}

}  // namespace crescent::transfer

#endif  // CRESCENT_HAVE_UCX
