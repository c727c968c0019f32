// UCX links beside the gRPC streams (ucx_links.h).

#include "process_group/ucx_links.h"

#include <glog/logging.h>
#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "process_group/frame.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using SendCallback = std::function<void(std::exception_ptr)>;

constexpr uint8_t kFramesMessage = 0;
constexpr uint8_t kProbeMessage = 1;
constexpr size_t kPrefixBytes = kLinkSecretBytes + 1;
// Messages this small (with no tensor sent in place) go as one buffer: UCX's fastest path.
constexpr size_t kContiguousBytes = 64 * 1024;
// After activity the progress thread polls this long before it sleeps on the event fd: a
// reply that follows a request closely is picked up without a wake-up, and an idle worker
// costs no CPU.
constexpr auto kSpin = std::chrono::microseconds(50);
// Tensors at least this large are used in place by the receiver when their bytes are
// aligned (tensor_from_body): the sender pads the header so that the first one is.
constexpr size_t kInPlaceBytes = 64 * 1024;
constexpr size_t kAlignment = 64;
// How long shutdown waits for sends in flight before it closes the links regardless.
constexpr auto kCloseTimeout = std::chrono::milliseconds(500);

std::string random_secret() {
  std::random_device device;  // /dev/urandom
  std::string secret(kLinkSecretBytes, '\0');
  for (size_t i = 0; i < secret.size(); i += sizeof(uint32_t)) {
    const uint32_t word = device();
    std::memcpy(&secret[i], &word, sizeof(word));
  }
  return secret;
}

bool same_secret(const uint8_t* data, const std::string& secret) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kLinkSecretBytes; ++i) diff |= data[i] ^ static_cast<uint8_t>(secret[i]);
  return diff == 0;
}

// `header` with padding that puts the bytes of the first tensor of kInPlaceBytes or more
// at a multiple of kAlignment from the message's start (which the receiver aligns).
pg::FrameHeader padded_header(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors) {
  size_t before = 0;
  for (const auto& t : tensors) {
    if (t.nbytes() >= kInPlaceBytes) {
      pg::FrameHeader padded = header;
      for (size_t pad = 0; pad < 2 * kAlignment; ++pad) {
        padded.set_padding(std::string(pad, '\0'));
        const size_t start = kPrefixBytes + sizeof(uint32_t) + padded.ByteSizeLong() + before;
        if (start % kAlignment == 0) return padded;
      }
      return header;
    }
    before += t.nbytes();
  }
  return header;
}

std::string ucx_error(const std::string& what, ucs_status_t status) {
  return what + ": " + ucs_status_string(status);
}

// A message's pieces in wire order: copied pieces owned here, large tensors in place.
class LinkPieces final : public FramePieces {
 public:
  void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
    if (size == 0) return;
    owned_.emplace_back(size);
    fill(owned_.back().data());
    segments_.push_back(ucp_dt_iov_t{owned_.back().data(), size});
    total_ += size;
  }
  void add_tensor(const at::Tensor& tensor) override {
    if (tensor.nbytes() == 0) return;
    tensors_.push_back(tensor);
    segments_.push_back(ucp_dt_iov_t{tensor.data_ptr(), tensor.nbytes()});
    total_ += tensor.nbytes();
  }

  // Copies everything into one buffer when the message is small and holds no tensor in
  // place; returns whether it did.
  bool make_contiguous() {
    if (!tensors_.empty() || total_ > kContiguousBytes) return false;
    contiguous_.resize(total_);
    size_t at = 0;
    for (const auto& s : segments_) {
      std::memcpy(contiguous_.data() + at, s.buffer, s.length);
      at += s.length;
    }
    return true;
  }

  std::deque<std::vector<uint8_t>> owned_;
  std::vector<at::Tensor> tensors_;
  std::vector<ucp_dt_iov_t> segments_;
  std::vector<uint8_t> contiguous_;
  size_t total_ = 0;
};

class Links;

struct SendOp {
  Links* links;
  uint64_t id;  // the key in Links::pending_
  int peer;
  LinkPieces pieces;
  SendCallback on_sent;     // guarded by Links::mu_; null once told
  void* request = nullptr;  // guarded by Links::mu_: UCX's, while it is in flight
};

struct RecvOp {
  Links* links;
  int source;
  std::shared_ptr<uint8_t> buffer;
  size_t size;
  void* request = nullptr;  // UCX's, while in flight (the progress thread's)
  bool done = false;
  bool ok = false;
};

class Links final : public UcxLinks {
 public:
  Links(int rank, int size, UcxLinkSink& sink) : rank_(rank), size_(size), sink_(sink) {
    for (int r = 0; r < size; ++r) {
      peers_.push_back(std::make_unique<Peer>());
      peers_.back()->secret_in = random_secret();
    }
  }

  ~Links() override { shutdown(); }

  // Creates the UCX context and worker and starts the progress thread.
  void start(DataPlane plane) {
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
  std::string inbound_secret(int peer) const override { return peers_.at(peer)->secret_in; }

  void connect(int peer, const std::string& address, const std::string& secret) override {
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
    }
    post(peer, std::make_unique<SendOp>(), /*probe=*/true, nullptr);
  }

  void open_inbound(int peer) override {
    Peer& link = *peers_.at(peer);
    std::lock_guard<std::mutex> lock(link.inbound_mu);
    link.inbound_open = true;
    for (auto& frames : link.held) sink_.on_link_frames(peer, std::move(frames));
    link.held.clear();
  }

  void send(int peer, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            SendCallback on_sent) override {
    auto op = std::make_unique<SendOp>();
    post(peer, std::move(op), /*probe=*/false,
         [&](LinkPieces& pieces) { encode_frame(padded_header(header, tensors), tensors, pieces); }, std::move(on_sent));
  }

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
    close_endpoints();
    // What is still in flight now never completes: UCX forgets it (no callback follows), and
    // the senders are told.
    std::vector<SendCallback> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, op] : pending_) {
        if (op->request != nullptr) ucp_request_free(op->request);
        op->request = nullptr;
        if (op->on_sent) failed.push_back(std::move(op->on_sent));
      }
    }
    for (auto& peer : peers_) {
      for (RecvOp* op : peer->receiving) {
        if (!op->done && op->request != nullptr) ucp_request_free(op->request);
      }
    }
    for (RecvOp* op : strays_) {
      if (!op->done && op->request != nullptr) ucp_request_free(op->request);
    }
    const auto error = std::make_exception_ptr(Error(ErrorKind::kShutdown, "the UCX links are shut down"));
    for (auto& cb : failed) cb(error);
    cleanup();
  }

  // --- UCX callbacks (the progress thread) ----------------------------------------------
  void send_done(SendOp* op, ucs_status_t status) {
    SendCallback on_sent;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(op->id);
      on_sent = std::move(op->on_sent);
    }
    if (on_sent) {
      on_sent(status == UCS_OK ? nullptr
                               : std::make_exception_ptr(Error(
                                     ErrorKind::kPeerUnavailable,
                                     ucx_error("sending to rank " + std::to_string(op->peer) + " over UCX", status))));
    }
    delete op;
  }

 private:
  struct Peer {
    std::string secret_in;   // what the peer's messages must carry; const after construction
    std::string secret_out;  // what ours carry; guarded by ep_mu_
    ucp_ep_h ep = nullptr;   // guarded by ep_mu_
    std::optional<Error> failed;  // guarded by mu_
    std::deque<RecvOp*> receiving;  // the progress thread's: in the order UCX matched them
    std::mutex inbound_mu;
    bool inbound_open = false;                // guarded by inbound_mu
    std::vector<std::vector<Frame>> held;     // guarded by inbound_mu
  };

  // Encodes a message for `peer` and posts it. `encode` adds the frames (none for a probe).
  void post(int peer, std::unique_ptr<SendOp> op, bool probe, const std::function<void(LinkPieces&)>& encode,
            SendCallback on_sent = nullptr) {
    if (peer < 0 || peer >= size_) throw Error(ErrorKind::kBadArgument, "no rank " + std::to_string(peer));
    Peer& link = *peers_[peer];
    op->links = this;
    op->peer = peer;
    std::shared_lock<std::shared_mutex> ep_lock(ep_mu_);
    if (link.ep == nullptr) {
      throw Error(ErrorKind::kInternal, "no UCX link to rank " + std::to_string(peer) + " is open");
    }
    const std::string prefix = link_message_prefix(link.secret_out, probe);
    op->pieces.add_bytes(prefix.size(), [&](uint8_t* out) { std::memcpy(out, prefix.data(), prefix.size()); });
    if (encode) encode(op->pieces);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
      auto* op = static_cast<SendOp*>(user_data);
      ucp_request_free(request);
      op->links->send_done(op, status);
    };
    param.user_data = op.get();
    const void* buffer;
    size_t count;
    if (op->pieces.make_contiguous()) {
      buffer = op->pieces.contiguous_.data();
      count = op->pieces.contiguous_.size();
    } else {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
      param.datatype = ucp_dt_make_iov();
      buffer = op->pieces.segments_.data();
      count = op->pieces.segments_.size();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) throw Error(ErrorKind::kShutdown, "the UCX links are shut down");
      if (link.failed) throw *link.failed;
      op->on_sent = std::move(on_sent);
      op->id = next_op_id_++;
      pending_.emplace(op->id, op.get());
    }
    const uint64_t id = op->id;
    SendOp* raw = op.release();
    const ucs_status_ptr_t request = ucp_tag_send_nbx(link.ep, buffer, count, static_cast<ucp_tag_t>(rank_), &param);
    ep_lock.unlock();  // the callback may send again
    if (request == nullptr) {
      send_done(raw, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request)) {
      send_done(raw, UCS_PTR_STATUS(request));
    } else {
      {
        // Unless it completed meanwhile (and `raw` is gone), shutdown may have to release it.
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it != pending_.end()) it->second->request = request;
      }
      ucp_worker_signal(worker_);  // the progress thread drives it from here
    }
  }

  void progress_loop() {
    auto last_activity = Clock::now();
    while (!stop_progress_) {
      if (poll_once()) {
        last_activity = Clock::now();
        continue;
      }
      if (Clock::now() - last_activity < kSpin) continue;
      const ucs_status_t status = ucp_worker_arm(worker_);
      if (status == UCS_ERR_BUSY) continue;  // events arrived meanwhile
      if (status != UCS_OK) {
        LOG(ERROR) << "rank " << rank_ << ": " << ucx_error("arming UCX's wake-up", status);
        return;
      }
      epoll_event event{};
      epoll_wait(epoll_fd_, &event, 1, -1);  // shutdown wakes it with ucp_worker_signal
      last_activity = Clock::now();
    }
  }

  // Progresses the worker, takes in what arrived and hands completed messages on. Returns
  // whether anything happened.
  bool poll_once() {
    bool active = ucp_worker_progress(worker_) != 0;
    ucp_tag_recv_info_t info;
    while (ucp_tag_message_h message = ucp_tag_probe_nb(worker_, 0, 0, /*remove=*/1, &info)) {
      active = true;
      receive(message, info);
    }
    for (int r = 0; r < size_; ++r) {
      if (!peers_[r]->receiving.empty()) drain(r);
    }
    if (!strays_.empty()) drop_strays();
    return active;
  }

  void receive(ucp_tag_message_h message, const ucp_tag_recv_info_t& info) {
    auto* op = new RecvOp;
    op->links = this;
    op->source = info.sender_tag < static_cast<ucp_tag_t>(size_) ? static_cast<int>(info.sender_tag) : -1;
    op->size = info.length;
    // Aligned, so that large tensors can be used where they landed (see padded_header).
    const size_t capacity = (std::max<size_t>(op->size, 1) + kAlignment - 1) / kAlignment * kAlignment;
    auto* memory = capacity >= op->size ? static_cast<uint8_t*>(std::aligned_alloc(kAlignment, capacity)) : nullptr;
    if (memory == nullptr) {
      // A length no one could send honestly: take the message in truncated, and drop it.
      op->source = -1;
      op->size = 1;
      memory = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kAlignment));
    }
    op->buffer.reset(memory, [](uint8_t* p) { std::free(p); });
    if (op->source >= 0 && op->source != rank_) {
      peers_[op->source]->receiving.push_back(op);
    } else {
      strays_.insert(op);  // received only to be dropped
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.recv = [](void* request, ucs_status_t status, const ucp_tag_recv_info_t*, void* user_data) {
      auto* op = static_cast<RecvOp*>(user_data);
      ucp_request_free(request);
      op->ok = status == UCS_OK;
      op->done = true;
    };
    param.user_data = op;
    const ucs_status_ptr_t request = ucp_tag_msg_recv_nbx(worker_, op->buffer.get(), op->size, message, &param);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) {
      op->ok = request == nullptr;
      op->done = true;
    } else {
      op->request = request;  // callbacks run on this thread, in progress: not yet
    }
  }

  // Hands on `source`'s received messages in the order they were matched.
  void drain(int source) {
    Peer& link = *peers_[source];
    while (!link.receiving.empty() && link.receiving.front()->done) {
      std::unique_ptr<RecvOp> op(link.receiving.front());
      link.receiving.pop_front();
      if (!op->ok) continue;
      bool is_probe = false;
      std::vector<Frame> frames;
      std::string problem;
      if (!decode_link_message(op->buffer.get(), op->size, link.secret_in, op->buffer, source, &is_probe, &frames,
                               &problem)) {
        if (op->size >= kPrefixBytes && same_secret(op->buffer.get(), link.secret_in)) {
          sink_.on_link_failed(source, Error(ErrorKind::kProtocol, "rank " + std::to_string(source) +
                                                                       " sent a malformed link message: " + problem));
        } else {
          LOG(WARNING) << "rank " << rank_ << ": dropped a UCX message claiming to be from rank " << source << ": "
                       << problem;
        }
        continue;
      }
      if (is_probe) {
        sink_.on_link_probe(source);
        continue;
      }
      std::lock_guard<std::mutex> lock(link.inbound_mu);
      if (link.inbound_open) {
        sink_.on_link_frames(source, std::move(frames));
      } else {
        link.held.push_back(std::move(frames));
      }
    }
  }

  // Drops messages received from no known peer.
  void drop_strays() {
    for (auto it = strays_.begin(); it != strays_.end();) {
      if (!(*it)->done) {
        ++it;
        continue;
      }
      LOG(WARNING) << "rank " << rank_ << ": dropped a UCX message with an unknown sender";
      delete *it;
      it = strays_.erase(it);
    }
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
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, op] : pending_) delete op;
    pending_.clear();
    for (auto& peer : peers_) {
      for (RecvOp* op : peer->receiving) delete op;
      peer->receiving.clear();
    }
    for (RecvOp* op : strays_) delete op;
    strays_.clear();
  }

  const int rank_;
  const int size_;
  UcxLinkSink& sink_;
  std::vector<std::unique_ptr<Peer>> peers_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  int epoll_fd_ = -1;
  std::thread progress_thread_;
  std::atomic<bool> stop_progress_{false};
  std::unordered_set<RecvOp*> strays_;  // the progress thread's

  // Held while a send uses an endpoint; exclusively while one is created or closed. Never
  // taken inside mu_: UCX's own lock (held while its callbacks take mu_) comes between.
  std::shared_mutex ep_mu_;
  std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<uint64_t, SendOp*> pending_;
  uint64_t next_op_id_ = 0;
  bool stopped_ = false;
};

}  // namespace

DataPlane parse_data_plane(const std::string& name) {
  if (name == "auto") return DataPlane::kAuto;
  if (name == "ucx") return DataPlane::kUcx;
  if (name == "grpc") return DataPlane::kGrpc;
  throw Error(ErrorKind::kBadArgument, "unknown data plane '" + name + "' (expected auto, ucx or grpc)");
}

const char* data_plane_name(DataPlane plane) {
  switch (plane) {
    case DataPlane::kAuto:
      return "auto";
    case DataPlane::kUcx:
      return "ucx";
    case DataPlane::kGrpc:
      return "grpc";
  }
  return "?";
}

std::string this_host_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  // Processes in other network namespaces (other containers) count as other hosts: they
  // usually cannot share memory with us, and are meant to be reached over their network.
  char net[64] = {};
  const ssize_t n = readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  return std::string(host) + "/" + boot_id + "/" + (n > 0 ? std::string(net, n) : std::string());
}

std::string link_message_prefix(const std::string& secret, bool probe) {
  std::string prefix = secret;
  prefix.resize(kLinkSecretBytes);
  prefix.push_back(static_cast<char>(probe ? kProbeMessage : kFramesMessage));
  return prefix;
}

bool decode_link_message(const uint8_t* data, size_t size, const std::string& secret, std::shared_ptr<void> keepalive,
                         int source, bool* is_probe, std::vector<Frame>* frames, std::string* problem) {
  if (size < kPrefixBytes) {
    *problem = "a message of " + std::to_string(size) + " bytes is shorter than its prefix";
    return false;
  }
  if (secret.size() != kLinkSecretBytes || !same_secret(data, secret)) {
    *problem = "the message does not carry the pair's secret";
    return false;
  }
  const uint8_t type = data[kLinkSecretBytes];
  if (type == kProbeMessage) {
    *is_probe = true;
    if (size == kPrefixBytes) return true;
    *problem = "a probe carries " + std::to_string(size - kPrefixBytes) + " bytes";
    return false;
  }
  *is_probe = false;
  if (type != kFramesMessage) {
    *problem = "unknown message type " + std::to_string(type);
    return false;
  }
  try {
    *frames = decode_wire_frames({ByteSpan{data + kPrefixBytes, size - kPrefixBytes}}, std::move(keepalive), source);
  } catch (const Error& e) {
    *problem = e.message();
    return false;
  }
  if (frames->empty()) {
    *problem = "a message without frames";
    return false;
  }
  return true;
}

std::unique_ptr<UcxLinks> create_ucx_links(int rank, int size, DataPlane plane, UcxLinkSink& sink,
                                           std::string* why_not) {
  auto links = std::make_unique<Links>(rank, size, sink);
  try {
    links->start(plane);
  } catch (const Error& e) {
    *why_not = e.message();
    return nullptr;
  }
  return links;
}

}  // namespace drpc
