// UCX links beside the gRPC streams (ucx_links.h).

#include "process_group/ucx_links.h"

#include <glog/logging.h>
#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "common/spin_backoff.h"
#include "process_group/frame.h"
#include "process_group/ucx_link_inbound.h"
#include "process_group/ucx_link_pieces.h"
#include "process_group/ucx_link_message.h"
#include "process_group/shm_arena.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using SendCallback = std::function<void(std::exception_ptr)>;

// After activity the progress thread polls this long before it sleeps on the event fd: a
// reply that follows a request closely is picked up without a wake-up, and an idle worker
// costs no CPU. It yields the core between polls, so that on a machine with more threads
// than cores the threads with work (a peer process, the caller) run first; without that,
// polling cost more than the wake-ups it saved (rpc_sync 142 us with a 50 us spin without
// yielding, 42-63 us with 100-200 us yielding, on 2 cores). 1 ms covers a reply that
// waits for a layer's forward or backward on the peer (0.15-0.3 ms for a 256x256 Linear on
// a batch of 32 here): dist_autograd.sh's training step took 0.84 ms (w2) and 2.56 ms (w3)
// with it against 1.09 and 3.36 with 200 us, medians of 6 alternating runs.
// While other work holds the cores it does not spin at all (SpinBackoff).
constexpr auto kSpin = std::chrono::milliseconds(1);
// How long shutdown waits for sends in flight before it closes the links regardless.
constexpr auto kCloseTimeout = std::chrono::milliseconds(500);

std::string ucx_error(const std::string& what, ucs_status_t status) {
  return what + ": " + ucs_status_string(status);
}

class Links;
struct SendOp;

// One UCX send of a message: its head, or one of its bodies.
struct SendPart {
  SendOp* op;
  size_t index;
  void* request = nullptr;  // guarded by Links::mu_: UCX's, while it is in flight
  bool done = false;        // guarded by Links::mu_
};

struct SendOp {
  Links* links;
  uint64_t id;  // the key in Links::pending_
  int peer;
  bool offer_arena = false;  // a probe that offers the sender's arena
  bool may_use_arena = false;  // its bodies may go through the arena
  ShmArena* arena = nullptr;   // where `blocks` are, when its bodies went there
  std::vector<uint64_t> blocks;  // given back if the head is never posted
  LinkPieces pieces;
  std::vector<SendPart> parts;  // the head, then the bodies; sized before the first is posted
  SendCallback on_sent;         // guarded by Links::mu_; null once told
  size_t outstanding = 0;       // guarded by Links::mu_: parts not done
  ucs_status_t status = UCS_OK;  // guarded by Links::mu_: the first part's failure
};

class Links final : public UcxLinks {
 public:
  Links(int rank, int size, UcxLinkSink& sink) : rank_(rank), size_(size), inbound_(rank, size, sink) {
    for (int r = 0; r < size; ++r) peers_.push_back(std::make_unique<Peer>());
  }

  ~Links() override { shutdown(); }

  // Creates the UCX context and worker and starts the progress thread.
  void start(DataPlane plane, size_t arena_bytes) {
    arena_bytes_ = arena_bytes;
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) throw Error(ErrorKind::kInternal, ucx_error("reading UCX's configuration", status));
    // `auto` links peers on this host only: shared memory and cross-memory attach.
    if (plane == DataPlane::kAuto) status = ucp_config_modify(config, "TLS", "sm,self");
    if (status == UCS_OK) {
      ucp_params_t params{};
      params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
      params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
      params.estimated_num_eps = size_;
      status = ucp_init(&params, config, &context_);
    }
    ucp_config_release(config);
    if (status != UCS_OK) throw Error(ErrorKind::kInternal, ucx_error("starting UCX", status));
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_MULTI;  // senders post from their own threads
    status = ucp_worker_create(context_, &worker_params, &worker_);
    if (status != UCS_OK) throw Error(ErrorKind::kInternal, ucx_error("creating a UCX worker", status));
    ucp_address_t* address = nullptr;
    size_t length = 0;
    status = ucp_worker_get_address(worker_, &address, &length);
    if (status != UCS_OK) throw Error(ErrorKind::kInternal, ucx_error("reading the UCX address", status));
    address_.assign(reinterpret_cast<const char*>(address), length);
    ucp_worker_release_address(worker_, address);
    int event_fd = -1;
    status = ucp_worker_get_efd(worker_, &event_fd);
    if (status != UCS_OK) throw Error(ErrorKind::kInternal, ucx_error("UCX's wake-up event", status));
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event event{};
    event.events = EPOLLIN;
    if (epoll_fd_ < 0 || epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd, &event) != 0) {
      throw Error(ErrorKind::kInternal, std::string("epoll on UCX's event fd: ") + std::strerror(errno));
    }
    progress_thread_ = std::thread([this] { progress_loop(); });
  }

  std::string address() const override { return address_; }
  std::string inbound_secret(int peer) const override { return inbound_.secret(peer); }

  void connect(int peer, const std::string& address, const std::string& secret, bool same_host) override {
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw Error(ErrorKind::kBadArgument, "no UCX link to rank " + std::to_string(peer));
    }
    if (secret.size() != kLinkSecretBytes) {
      throw Error(ErrorKind::kProtocol, "rank " + std::to_string(peer) + " offered a malformed link secret");
    }
    {
      std::unique_lock<std::shared_mutex> lock(ep_mu_);
      if (stopped_) throw Error(ErrorKind::kShutdown, "the UCX links are shut down");
      Peer& link = *peers_[peer];
      if (link.ep != nullptr) throw Error(ErrorKind::kProtocol, "rank " + std::to_string(peer) + " offered twice");
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.address = reinterpret_cast<const ucp_address_t*>(address.data());
      // Peer failure handling would rule out UCX's shared-memory transports (1.13); the
      // gRPC stream and the heartbeats detect a lost peer instead.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      const ucs_status_t status = ucp_ep_create(worker_, &params, &link.ep);
      if (status != UCS_OK) {
        link.ep = nullptr;
        throw Error(ErrorKind::kPeerUnavailable,
                    ucx_error("UCX cannot reach rank " + std::to_string(peer), status));
      }
      link.secret_out = secret;
      // An arena per peer, so that no peer can read or change what is sent to another.
      if (same_host && arena_bytes_ > 0) {
        std::string why_not;
        link.arena = ShmArena::create(arena_bytes_, &why_not);
        if (!link.arena) {
          VLOG(1) << "rank " << rank_ << ": large tensors to rank " << peer << " stay off shared memory: " << why_not;
        }
      }
    }
    auto probe = std::make_unique<SendOp>();
    probe->offer_arena = peers_[peer]->arena != nullptr;  // set above, under ep_mu_; never reset
    post(peer, std::move(probe), LinkMessageType::kProbe, nullptr);
  }

  void use_shared_memory(int peer) override {
    if (peer < 0 || peer >= size_) return;
    std::shared_lock<std::shared_mutex> lock(ep_mu_);
    // Only an arena we offered: a LINK_READY that claims more is ignored.
    if (peers_[peer]->arena != nullptr) peers_[peer]->arena_in_use = true;
  }

  size_t shared_memory_in_use() override {
    std::shared_lock<std::shared_mutex> lock(ep_mu_);
    size_t total = 0;
    for (const auto& link : peers_) total += link->arena ? link->arena->bytes_in_use() : 0;
    return total;
  }

  void open_inbound(int peer) override {
    inbound_.open(peer);
  }

  void send(int peer, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            SendCallback on_sent) override {
    auto op = std::make_unique<SendOp>();
    // A collective's chunks land in their destinations (place_collective_frame), with one
    // copy that two busy cores share; through the arena they would take two.
    op->may_use_arena = header.kind() != pg::FrameHeader::COLLECTIVE;
    post(peer, std::move(op), LinkMessageType::kFrames,
         [&](LinkPieces& pieces) { encode_frame(header, tensors, pieces); }, std::move(on_sent));
  }

  void place_collective_frame(int peer, uint64_t seq, uint32_t step, const at::Tensor& dst) override {
    inbound_.place(peer, seq, step, dst);
  }
  void release_placements(uint64_t seq) override { inbound_.release_placements(seq); }

  void fail_peer(int peer, const Error& why) override {
    std::vector<SendCallback> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (peers_.at(peer)->failed) return;
      peers_[peer]->failed = why;
      for (auto& [id, op] : pending_) {
        if (op->peer == peer && op->on_sent) failed.push_back(std::move(op->on_sent));
      }
    }
    inbound_.fail(peer);
    const auto error = std::make_exception_ptr(why);
    for (auto& cb : failed) cb(error);
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    if (worker_ == nullptr) {
      cleanup();
      return;
    }
    stop_progress_ = true;
    ucp_worker_signal(worker_);
    if (progress_thread_.joinable()) progress_thread_.join();
    post_deferred();  // sent before shutdown: closing the endpoints flushes them like the rest
    close_endpoints();
    // What is still in flight now never completes: UCX forgets it (no callback follows), and
    // the senders are told.
    std::vector<SendCallback> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, op] : pending_) {
        for (auto& part : op->parts) {
          if (part.request != nullptr && !part.done) ucp_request_free(part.request);
          part.request = nullptr;
        }
        if (op->on_sent) failed.push_back(std::move(op->on_sent));
      }
    }
    inbound_.release_requests();
    const auto error = std::make_exception_ptr(Error(ErrorKind::kShutdown, "the UCX links are shut down"));
    for (auto& cb : failed) cb(error);
    cleanup();
  }

  // --- UCX callbacks (the progress thread, or the sender when UCX completes at once) ----
  void part_done(SendOp* op, size_t index, ucs_status_t status) {
    SendCallback on_sent;
    ucs_status_t final_status = UCS_OK;
    {
      std::lock_guard<std::mutex> lock(mu_);
      op->parts[index].done = true;
      op->parts[index].request = nullptr;
      if (status != UCS_OK && op->status == UCS_OK) op->status = status;
      if (--op->outstanding > 0) return;
      pending_.erase(op->id);
      on_sent = std::move(op->on_sent);
      final_status = op->status;
    }
    if (on_sent) {
      on_sent(final_status == UCS_OK
                  ? nullptr
                  : std::make_exception_ptr(Error(ErrorKind::kPeerUnavailable,
                                                  ucx_error("sending to rank " + std::to_string(op->peer) +
                                                                " over UCX",
                                                            final_status))));
    }
    delete op;
  }

 private:
  struct Peer {
    std::string secret_out;  // what ours carry; guarded by ep_mu_
    ucp_ep_h ep = nullptr;   // guarded by ep_mu_
    std::atomic<uint64_t> bodies_sent{0};  // numbers the bodies' tags
    std::unique_ptr<ShmArena> arena;       // offered to it in our probe; set under ep_mu_ (held alone)
    std::atomic<bool> arena_in_use{false};  // it attached the arena
    std::optional<Error> failed;  // guarded by mu_
    int deferred = 0;             // guarded by defer_mu_: its messages in deferred_ or being posted from it
  };

  // Encodes a message of `type` for `peer` and posts its head and bodies. `encode` adds the
  // frames (none for a probe).
  void post(int peer, std::unique_ptr<SendOp> op, LinkMessageType type,
            const std::function<void(LinkPieces&)>& encode, SendCallback on_sent = nullptr) {
    if (peer < 0 || peer >= size_) throw Error(ErrorKind::kBadArgument, "no rank " + std::to_string(peer));
    Peer& link = *peers_[peer];
    op->links = this;
    op->peer = peer;
    std::shared_lock<std::shared_mutex> ep_lock(ep_mu_);
    if (link.ep == nullptr) {
      throw Error(ErrorKind::kInternal, "no UCX link to rank " + std::to_string(peer) + " is open");
    }
    LinkPieces& pieces = op->pieces;
    if (encode) encode(pieces);
    if (op->may_use_arena && !pieces.bodies_.empty() && link.arena_in_use && !refusal(link)) {
      op->arena = link.arena.get();
      op->blocks = to_arena(pieces, *op->arena);
      if (!op->blocks.empty()) pieces.drop_body_tensors();
    }
    const bool ucx_bodies = !pieces.bodies_.empty() && op->blocks.empty();
    try {
      if (!op->blocks.empty()) {
        type = LinkMessageType::kFramesWithArenaBodies;
        for (size_t i = 0; i < op->blocks.size(); ++i) pieces.bodies_[i].tag = op->blocks[i];
      } else if (ucx_bodies) {
        type = LinkMessageType::kFramesWithBodies;
        for (auto& body : pieces.bodies_) body.tag = link_body_tag(link.secret_out, link.bodies_sent++);
      }
      pieces.add_head(op->offer_arena ? link_probe_with_arena(link.secret_out, link.arena->offer())
                                      : link_message_head(link.secret_out, type, pieces.bodies_));
      for (size_t i = 0; i <= (ucx_bodies ? pieces.bodies_.size() : 0); ++i) op->parts.push_back(SendPart{op.get(), i});
      std::lock_guard<std::mutex> lock(mu_);
      if (auto refused = refusal_locked(link)) throw *refused;
      op->on_sent = std::move(on_sent);
      op->id = next_op_id_++;
      op->outstanding = op->parts.size();
      pending_.emplace(op->id, op.get());
    } catch (...) {
      give_back_blocks(*op);  // nothing named them
      throw;
    }
    SendOp* raw = op.release();  // part_done deletes it after its last part
    bool deferred = false;
    {
      std::lock_guard<std::mutex> lock(defer_mu_);
      // A message with bodies is posted by the progress thread. That thread holds UCX's worker
      // lock while it copies a body in (cross-memory attach: about a millisecond per 4 MiB),
      // and a caller posting meanwhile spins on the lock for the whole copy: 8% of all CPU
      // time in a 4-rank allreduce on 2 cores. A peer's later messages queue behind it, so
      // that they keep their order.
      if (ucx_bodies || link.deferred > 0) {
        ++link.deferred;
        deferred_.push_back(raw);
        has_deferred_ = true;
        deferred = true;
      }
    }
    const bool in_flight = deferred || post_parts(raw, link);
    ep_lock.unlock();
    // The progress thread drives what is in flight from here; a thread that polls will see
    // it without a wake-up (a system call, and on a busy machine a context switch).
    if (in_flight && progress_sleeping_) ucp_worker_signal(worker_);
  }

  // Why a message to `link` cannot be sent now, if it cannot.
  std::optional<Error> refusal(const Peer& link) {
    std::lock_guard<std::mutex> lock(mu_);
    return refusal_locked(link);
  }
  std::optional<Error> refusal_locked(const Peer& link) {  // mu_ held
    if (stopped_) return Error(ErrorKind::kShutdown, "the UCX links are shut down");
    return link.failed;
  }

  // Copies `pieces`' bodies into blocks of `arena` and returns the blocks' offsets, one per
  // body; or none, having copied nothing, when they do not all fit.
  std::vector<uint64_t> to_arena(const LinkPieces& pieces, ShmArena& arena) {
    std::vector<uint64_t> blocks;
    for (const LinkBody& body : pieces.bodies_) {
      const auto block = arena.allocate(body.size);
      if (!block) {
        for (uint64_t b : blocks) arena.unallocate(b);
        return {};
      }
      blocks.push_back(*block);
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      copier_.copy(arena.data(blocks[i]), static_cast<const uint8_t*>(pieces.body_data_[i]), pieces.bodies_[i].size);
    }
    return blocks;
  }

  // An arena message whose head was never posted: no peer can take its blocks.
  static void give_back_blocks(SendOp& op) {
    for (uint64_t block : op.blocks) op.arena->unallocate(block);
    op.blocks.clear();
  }

  // Posts `op`'s head and bodies on `link` (ep_mu_ held shared), or cancels them all when
  // `cancel` is set or the link is closed. Returns whether any is still in flight; after the
  // last post `op` may be gone (completed on the progress thread).
  bool post_parts(SendOp* op, Peer& link, bool cancel = false) {
    LinkPieces& pieces = op->pieces;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
    param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      auto* part = static_cast<SendPart*>(user_data);
      ucp_request_free(request);
      part->op->links->part_done(part->op, part->index, status);
    };
    const uint64_t id = op->id;
    const size_t parts = op->parts.size();
    bool head_failed = cancel || link.ep == nullptr;  // closed: nothing can be posted
    bool in_flight = false;
    for (size_t i = 0; i < parts; ++i) {
      if (head_failed) {  // the peer would never ask for the bodies
        if (i == 0) give_back_blocks(*op);
        part_done(op, i, UCS_ERR_CANCELED);
        continue;
      }
      param.user_data = &op->parts[i];
      const void* buffer;
      size_t count;
      ucp_tag_t tag;
      if (i > 0) {
        param.datatype = ucp_dt_make_contig(1);
        buffer = pieces.body_data_[i - 1];
        count = pieces.bodies_[i - 1].size;
        tag = pieces.bodies_[i - 1].tag;
      } else if (pieces.make_contiguous()) {
        param.datatype = ucp_dt_make_contig(1);
        buffer = pieces.contiguous_.data();
        count = pieces.contiguous_.size();
        tag = static_cast<ucp_tag_t>(rank_);
      } else {
        param.datatype = ucp_dt_make_iov();
        buffer = pieces.segments_.data();
        count = pieces.segments_.size();
        tag = static_cast<ucp_tag_t>(rank_);
      }
      const ucs_status_ptr_t request = ucp_tag_send_nbx(link.ep, buffer, count, tag, &param);
      if (request == nullptr) {
        part_done(op, i, UCS_OK);
      } else if (UCS_PTR_IS_ERR(request)) {
        head_failed = i == 0;
        if (head_failed) give_back_blocks(*op);  // refused at once: not sent
        part_done(op, i, UCS_PTR_STATUS(request));
      } else {
        in_flight = true;
        // Unless it completed meanwhile, shutdown may have to release it.
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it != pending_.end() && !it->second->parts[i].done) it->second->parts[i].request = request;
      }
    }
    return in_flight;
  }

  // The progress thread: posts the messages post() queued, in order. Returns whether there were any.
  bool post_deferred() {
    if (!has_deferred_) return false;  // the common case, without the lock: this runs on every poll
    std::deque<SendOp*> batch;
    {
      std::lock_guard<std::mutex> lock(defer_mu_);
      batch.swap(deferred_);
      has_deferred_ = false;
    }
    if (batch.empty()) return false;
    std::shared_lock<std::shared_mutex> ep_lock(ep_mu_);
    for (SendOp* op : batch) {
      Peer& link = *peers_[op->peer];
      bool failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed = link.failed.has_value();  // its sender was told; posting could wait forever
      }
      post_parts(op, link, /*cancel=*/failed);
      std::lock_guard<std::mutex> lock(defer_mu_);
      --link.deferred;
    }
    return true;
  }

  void progress_loop() {
    SpinBackoff backoff;
    while (!stop_progress_) {
      // Polls for kSpin after the last activity (or wake-up), then sleeps.
      if (backoff.poll(Clock::now() + kSpin, [this] { return poll_once() || stop_progress_; })) continue;
      // Senders signal once this is set; a send posted before it is seen by this last poll.
      progress_sleeping_ = true;
      if (poll_once()) {
        progress_sleeping_ = false;
        continue;
      }
      const ucs_status_t status = ucp_worker_arm(worker_);
      if (status == UCS_ERR_BUSY) {  // events arrived meanwhile
        progress_sleeping_ = false;
        continue;
      }
      if (status != UCS_OK) {
        LOG(ERROR) << "rank " << rank_ << ": " << ucx_error("arming UCX's wake-up", status);
        return;
      }
      epoll_event event{};
      epoll_wait(epoll_fd_, &event, 1, -1);  // shutdown wakes it with ucp_worker_signal
      progress_sleeping_ = false;
    }
  }

  // Progresses the worker, takes in what arrived and hands completed messages on. Returns
  // whether anything happened.
  bool poll_once() {
    const bool posted = post_deferred();
    const bool progressed = ucp_worker_progress(worker_) != 0 || posted;
    return inbound_.poll(worker_) || progressed;
  }

  // Closes the links to live peers, waiting up to kCloseTimeout for what is in flight.
  void close_endpoints() {
    std::vector<ucp_ep_h> live;
    {
      std::unique_lock<std::shared_mutex> ep_lock(ep_mu_);
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& link : peers_) {
        // A failed peer's link is released with the worker: flushing it could wait forever.
        if (link->ep != nullptr && !link->failed) live.push_back(link->ep);
        link->ep = nullptr;
      }
    }
    std::vector<ucs_status_ptr_t> closing;
    for (ucp_ep_h ep : live) {
      ucp_request_param_t param{};
      const ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) closing.push_back(request);
    }
    const auto deadline = Clock::now() + kCloseTimeout;
    while (Clock::now() < deadline) {
      bool waiting = false;
      for (auto request : closing) waiting |= ucp_request_check_status(request) == UCS_INPROGRESS;
      if (!waiting) break;
      ucp_worker_progress(worker_);
    }
    for (auto request : closing) ucp_request_free(request);  // done, or given up on
  }

  void cleanup() {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
    if (epoll_fd_ >= 0) close(epoll_fd_);
    epoll_fd_ = -1;
    {
      std::lock_guard<std::mutex> lock(defer_mu_);
      deferred_.clear();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, op] : pending_) delete op;
    pending_.clear();
  }

  const int rank_;
  const int size_;
  std::vector<std::unique_ptr<Peer>> peers_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int epoll_fd_ = -1;
  std::thread progress_thread_;
  std::atomic<bool> stop_progress_{false};
  std::atomic<bool> progress_sleeping_{false};  // from just before its last poll until it wakes
  LinkInbound inbound_;  // the progress thread's, but for secrets and open()
  size_t arena_bytes_ = 0;  // of each peer's arena (0: none); const once started
  ParallelCopier copier_;  // into the peers' arenas

  // Held while a send uses an endpoint; exclusively while one is created or closed. Never
  // taken inside mu_: UCX's own lock (held while its callbacks take mu_) comes between.
  std::shared_mutex ep_mu_;
  std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<uint64_t, SendOp*> pending_;
  uint64_t next_op_id_ = 0;
  bool stopped_ = false;
  // Messages for the progress thread to post (see post()); guarded by defer_mu_. Each is also
  // in pending_, which owns it, so shutdown fails them like the others.
  std::mutex defer_mu_;
  std::deque<SendOp*> deferred_;
  // Whether deferred_ may hold any. Set after a push and read by the progress thread after it
  // sets progress_sleeping_ (both sequentially consistent), so a push is either seen by that
  // last poll or signalled.
  std::atomic<bool> has_deferred_{false};
};

}  // namespace

std::unique_ptr<UcxLinks> create_ucx_links(int rank, int size, DataPlane plane, UcxLinkSink& sink,
                                           std::string* why_not, size_t arena_bytes) {
  auto links = std::make_unique<Links>(rank, size, sink);
  try {
    links->start(plane, arena_bytes);
  } catch (const Error& e) {
    *why_not = e.message();
    return nullptr;
  }
  return links;
}

}  // namespace drpc
