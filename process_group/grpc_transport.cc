#include "process_group/grpc_transport.h"

#include <glog/logging.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "process_group/frame.h"
#include "process_group/grpc_security.h"

#ifdef DRPC_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace drpc {
namespace {

// gRPC orders a reactor's callbacks (what a thread did before starting an operation happens
// before that operation's reaction; every reaction happens before OnDone), but inside
// gRPC, which is not built with ThreadSanitizer: under --config=tsan these declare that
// order to it (tools/sanitizers/tsan.supp). `op` names the operation: a reactor's
// read_buffer_ its reads, the reactor itself its writes (and the outbox's buffer gRPC's
// use of the message), its peer_ its end.
#ifdef DRPC_TSAN
void happens_before(const void* op) { __tsan_release(const_cast<void*>(op)); }
void happens_after(const void* op) { __tsan_acquire(const_cast<void*>(op)); }
#else
inline void happens_before(const void*) {}
inline void happens_after(const void*) {}
#endif
// Declares one reaction: after the start of its operation, before OnDone.
class Reaction {
 public:
  Reaction(const void* op, const void* end) : end_(end) { happens_after(op); }
  ~Reaction() { happens_before(end_); }
  Reaction(const Reaction&) = delete;
  Reaction& operator=(const Reaction&) = delete;

 private:
  const void* end_;
};

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using SendCallback = std::function<void(std::exception_ptr)>;
using Buffer = grpc::ByteBuffer;

constexpr char kExchangeMethod[] = "/drpc.pg.Peer/Exchange";
// How long a leaving rank waits for its peers to acknowledge its goodbye.
constexpr std::chrono::milliseconds kGoodbyeTimeout{2000};

// A frame's pieces as gRPC slices: copied pieces in slices of their own, tensors in place
// (the slice keeps its tensor alive until gRPC has written it).
class Slices final : public FramePieces {
 public:
  explicit Slices(std::vector<grpc::Slice>* slices) : slices_(slices) {}
  void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
    grpc_slice slice = grpc_slice_malloc(size);
    fill(GRPC_SLICE_START_PTR(slice));  // before the move below: a small slice holds its bytes inline
    slices_->emplace_back(slice, grpc::Slice::STEAL_REF);
  }
  void add_tensor(const at::Tensor& t) override {
    slices_->emplace_back(t.data_ptr(), t.nbytes(), [](void* p) { delete static_cast<at::Tensor*>(p); },
                          new at::Tensor(t));
  }

 private:
  std::vector<grpc::Slice>* slices_;
};

// Appends one frame's slices to `slices`.
void encode_frame(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                  std::vector<grpc::Slice>* slices) {
  Slices out(slices);
  drpc::encode_frame(header, tensors, out);
}

// Reads a gRPC message made of one or more frames, without copying tensor bytes.
std::vector<Frame> decode_frames(Buffer& buffer, int source) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Dump(slices.get()).ok()) throw Error(ErrorKind::kProtocol, "unreadable message");
  std::vector<ByteSpan> pieces;
  for (const auto& s : *slices) pieces.push_back(ByteSpan{s.begin(), s.size()});
  return decode_wire_frames(pieces, slices, source);
}

grpc::ChannelArguments channel_arguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Every peer gets its own connection, even with several ranks in one process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024 * 1024);
  return args;
}

// The outgoing side of one peer's stream: a queue of frames, written one gRPC message at
// a time; whatever queued up while a write was in flight goes out together in the next.
class Outbox {
 public:
  // `start_write` starts a write on the stream; it is called with no lock held.
  void attach(std::function<void(Buffer*)> start_write) {
    std::unique_lock<std::mutex> lock(mu_);
    start_write_ = std::move(start_write);
    maybe_start(lock);
  }

  // Queues a frame; throws if the stream is closed. See Transport::send.
  void send(std::vector<grpc::Slice> slices, SendCallback on_sent) {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) throw *closed_;
    for (auto& s : slices) queued_slices_.push_back(std::move(s));
    queued_callbacks_.push_back(std::move(on_sent));
    maybe_start(lock);
  }

  // The write started last has finished.
  void on_write_done(bool ok, const std::function<Error()>& why_not) {
    happens_after(&buffer_);  // gRPC is done with the buffer: the next write may replace it
    std::vector<SendCallback> done;
    std::unique_lock<std::mutex> lock(mu_);
    done.swap(in_flight_);
    writing_ = false;
    if (!ok && !closed_) close_locked(why_not());
    std::exception_ptr error = closed_ && !ok ? std::make_exception_ptr(*closed_) : nullptr;
    maybe_start(lock);  // unlocks
    for (auto& cb : done) {
      if (cb) cb(error);
    }
  }

  // No more frames: queued ones fail with `why`. Returns whether a write is still in flight.
  bool close(const Error& why) {
    std::vector<SendCallback> failed;
    bool writing;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) close_locked(why);
      failed.swap(failed_);
      writing = writing_;
    }
    auto error = std::make_exception_ptr(why);
    for (auto& cb : failed) {
      if (cb) cb(error);
    }
    return writing;
  }

  bool writing() {
    std::lock_guard<std::mutex> lock(mu_);
    return writing_;
  }

 private:
  void close_locked(const Error& why) {
    closed_ = why;
    queued_slices_.clear();
    for (auto& cb : queued_callbacks_) failed_.push_back(std::move(cb));
    queued_callbacks_.clear();
  }

  // Starts the next write if the stream is idle and frames wait. Releases the lock.
  void maybe_start(std::unique_lock<std::mutex>& lock) {
    if (writing_ || !start_write_ || queued_callbacks_.empty() || closed_) {
      std::vector<SendCallback> failed;
      failed.swap(failed_);
      const std::optional<Error> why = closed_;
      lock.unlock();
      for (auto& cb : failed) {
        if (cb) cb(std::make_exception_ptr(*why));
      }
      return;
    }
    writing_ = true;
    buffer_ = Buffer(queued_slices_.data(), queued_slices_.size());
    queued_slices_.clear();
    in_flight_.swap(queued_callbacks_);
    auto start = start_write_;
    lock.unlock();
    start(&buffer_);
  }

  std::mutex mu_;
  // Guarded by mu_.
  std::function<void(Buffer*)> start_write_;
  std::vector<grpc::Slice> queued_slices_;
  std::vector<SendCallback> queued_callbacks_;
  std::vector<SendCallback> in_flight_;
  std::vector<SendCallback> failed_;  // to be told, outside the lock
  bool writing_ = false;
  std::optional<Error> closed_;
  Buffer buffer_;  // the message in flight; untouched until its write completes
};

class GrpcTransport;

// The dialling side of a pair's stream (this rank is the lower one).
class ClientPeer final : public grpc::ClientBidiReactor<Buffer, Buffer> {
 public:
  ClientPeer(GrpcTransport& transport, int peer, const std::string& address);
  void start();
  void cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  GrpcTransport& transport_;
  const int peer_;
  grpc::ClientContext context_;
  std::shared_ptr<grpc::Channel> channel_;
  Buffer read_buffer_;
  bool acknowledged_ = false;  // only touched by read callbacks, which never overlap
};

// The answering side of a pair's stream. Deletes itself when the call is done.
class ServerPeer final : public grpc::ServerGenericBidiReactor {
 public:
  explicit ServerPeer(GrpcTransport& transport, grpc::GenericCallbackServerContext* context);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  void finish_once(const grpc::Status& status) {
    if (!finished_.exchange(true)) Finish(status);
  }

  GrpcTransport& transport_;
  grpc::GenericCallbackServerContext* context_;
  Buffer read_buffer_;
  int peer_ = -1;
  std::atomic<bool> finished_{false};
  std::atomic<bool> finish_when_written_{false};
};

class PeerService final : public grpc::CallbackGenericService {
 public:
  explicit PeerService(GrpcTransport& transport) : transport_(transport) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context) override;

 private:
  GrpcTransport& transport_;
};

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(Store& store, int rank, int size, const GrpcTransportOptions& options, FrameSink& sink)
      : rank_(rank), size_(size), options_(options), sink_(sink), service_(*this) {
    if (size <= 0) throw Error(ErrorKind::kBadArgument, "world size must be positive, got " + std::to_string(size));
    if (rank < 0 || rank >= size) {
      throw Error(ErrorKind::kBadArgument, "rank " + std::to_string(rank) +
                                               " is out of range for world size " + std::to_string(size));
    }
    for (int r = 0; r < size; ++r) peers_.push_back(std::make_unique<Peer>());
    try {
      start_server();
      rendezvous(store);
    } catch (...) {
      shutdown();
      throw;
    }
    if (options_.heartbeat_interval.count() > 0 && size_ > 1) {
      heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
    }
  }

  ~GrpcTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            SendCallback on_sent) override {
    if (stopping_) throw Error(ErrorKind::kShutdown, "rank " + std::to_string(rank_) + " is shutting down");
    std::vector<grpc::Slice> slices;
    encode_frame(header, tensors, &slices);
    peers_.at(dst)->outbox.send(std::move(slices), std::move(on_sent));
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    // Say goodbye and wait for each peer's acknowledgement: it proves the peer has read
    // everything sent before, which cancelling the streams could otherwise discard.
    pg::FrameHeader goodbye;
    goodbye.set_kind(pg::FrameHeader::GOODBYE);
    std::vector<int> waiting;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || !is_connected(r)) continue;
      try {
        send(r, goodbye, {}, nullptr);
        waiting.push_back(r);
      } catch (const Error&) {
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait_for(lock, kGoodbyeTimeout, [&] {
        for (int r : waiting) {
          if (!peers_[r]->acked_goodbye && !peers_[r]->lost) return false;
        }
        return true;
      });
    }
    stopping_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      heartbeat_stop_ = true;
    }
    changed_.notify_all();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    for (auto& peer : peers_) {
      peer->outbox.close(Error(ErrorKind::kShutdown, "rank " + std::to_string(rank_) + " is shutting down"));
      if (peer->client) peer->client->cancel();
    }
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
    }
    // Reactors refer to this object until their OnDone.
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return live_reactors_ == 0; });
  }

  // --- called by the reactors (gRPC threads) ------------------------------------------
  void reactor_started() {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_reactors_;
  }
  void reactor_done() {
    std::lock_guard<std::mutex> lock(mu_);
    --live_reactors_;
    changed_.notify_all();
  }

  Outbox& outbox(int peer) { return peers_[peer]->outbox; }

  // Empty if `hello` may join this rank's group, else why not.
  std::string check_hello(const pg::FrameHeader& hello) {
    if (hello.kind() != pg::FrameHeader::HELLO) return "first frame is not a hello";
    if (!token_matches(hello.token(), options_.security.token)) return "wrong or missing job token";
    if (hello.group() != options_.group_name) {
      return "peer belongs to group '" + hello.group() + "', not '" + options_.group_name + "'";
    }
    if (hello.world_size() != size_) {
      return "peer has world size " + std::to_string(hello.world_size()) + ", this rank has " +
             std::to_string(size_);
    }
    if (hello.rank() < 0 || hello.rank() >= rank_) {
      return "peer claims rank " + std::to_string(hello.rank()) + ", which does not dial rank " +
             std::to_string(rank_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_[hello.rank()]->connected || peers_[hello.rank()]->server_attached) {
      return "rank " + std::to_string(hello.rank()) + " is already connected";
    }
    peers_[hello.rank()]->server_attached = true;
    return "";
  }

  std::vector<grpc::Slice> hello_frame() const {
    pg::FrameHeader hello;
    hello.set_kind(pg::FrameHeader::HELLO);
    hello.set_rank(rank_);
    hello.set_world_size(size_);
    hello.set_token(options_.security.token);
    hello.set_group(options_.group_name);
    std::vector<grpc::Slice> slices;
    encode_frame(hello, {}, &slices);
    return slices;
  }

  void mark_connected(int peer, std::string address) {
    heard_from(peer);
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[peer]->connected = true;
      peers_[peer]->address = std::move(address);
    }
    changed_.notify_all();
  }

  // Our stream to `peer` ended before the peer answered our hello. Only UNAUTHENTICATED is
  // the peer's own verdict (check_hello): gRPC ends a stream whose connection broke with
  // UNAVAILABLE ("Socket closed" when the peer's end went away), which says nothing about
  // our credentials.
  void mark_ended_before_answer(int peer, const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Peer& p = *peers_[peer];
      if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        p.refusal = status.error_message().empty() ? "no reason given" : status.error_message();
      } else {
        p.failure = "the connection to rank " + std::to_string(peer) + " (" + p.address + ") ended before rank " +
                    std::to_string(peer) + " answered rank " + std::to_string(rank_) + "'s hello (gRPC status " +
                    std::to_string(status.error_code()) + ": " + status.error_message() + ")";
      }
    }
    changed_.notify_all();
  }

  // Decodes and delivers one message from `peer`; returns false (after reporting the
  // peer lost) if it was malformed.
  bool deliver(int peer, Buffer& buffer) {
    if (peers_[peer]->lost.load()) return false;  // declared failed: nothing more is believed
    heard_from(peer);
    std::vector<Frame> frames;
    try {
      frames = decode_frames(buffer, peer);
    } catch (const Error& e) {
      const std::string reason = "rank " + std::to_string(peer) + " sent a malformed frame: " + e.message();
      LOG(ERROR) << "rank " << rank_ << ": " << reason << "; closing the connection";
      lost(peer, Error(ErrorKind::kProtocol, reason));
      return false;
    }
    for (auto& frame : frames) {
      switch (frame.header.kind()) {
        case pg::FrameHeader::GOODBYE: {
          {
            std::lock_guard<std::mutex> lock(mu_);
            peers_[peer]->said_goodbye = true;
          }
          pg::FrameHeader ack;
          ack.set_kind(pg::FrameHeader::GOODBYE_ACK);
          std::vector<grpc::Slice> slices;
          encode_frame(ack, {}, &slices);
          try {
            peers_[peer]->outbox.send(std::move(slices), nullptr);
          } catch (const Error&) {
            // We are leaving too; the peer stops waiting when our stream closes.
          }
          break;
        }
        case pg::FrameHeader::GOODBYE_ACK: {
          std::lock_guard<std::mutex> lock(mu_);
          peers_[peer]->acked_goodbye = true;
          changed_.notify_all();
          break;
        }
        case pg::FrameHeader::HELLO:
        case pg::FrameHeader::HEARTBEAT:
          break;
        default:
          if (!stopping_) sink_.on_frame(std::move(frame));
      }
    }
    return true;
  }

  // The stream to `peer` is gone; tells the sink once.
  void lost(int peer, const Error& why) {
    std::string reason = why.message();
    bool was_connected;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Peer& p = *peers_[peer];
      if (p.lost) return;
      p.lost = true;
      was_connected = p.connected;
      if (p.said_goodbye) reason = "rank " + std::to_string(peer) + " shut down";
    }
    changed_.notify_all();  // a leaving rank stops waiting for this peer's goodbye
    const Error error(why.kind(), reason);
    peers_[peer]->outbox.close(error);
    if (peers_[peer]->client) peers_[peer]->client->cancel();
    if (!stopping_ && was_connected) sink_.on_peer_failed(peer, error);
  }

  Error lost_error(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return Error(ErrorKind::kPeerUnavailable, "connection to rank " + std::to_string(peer) + " (" +
                                                  peers_[peer]->address + ") was lost");
  }

  bool stopping() const { return stopping_; }
  int my_rank() const { return rank_; }
  const SecurityOptions& security() const { return options_.security; }

 private:
  struct Peer {
    Outbox outbox;
    std::unique_ptr<ClientPeer> client;  // when this rank dials the peer
    // Guarded by GrpcTransport::mu_.
    std::string address;
    bool connected = false;
    bool server_attached = false;
    bool said_goodbye = false;
    bool acked_goodbye = false;
    std::atomic<bool> lost{false};  // written under mu_
    std::string refusal;  // why the peer refused our hello
    std::string failure;  // how our stream ended before the peer answered, if not refused
    std::atomic<int64_t> last_heard_ns{0};  // steady clock; when anything last arrived
  };

  void heard_from(int peer) {
    peers_[peer]->last_heard_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
  }

  // Sends each live peer a heartbeat every interval and declares failed those silent for
  // heartbeat_misses intervals: a stopped or hung process keeps its TCP connection open,
  // so only silence tells.
  void heartbeat_loop() {
    const auto interval = options_.heartbeat_interval;
    const auto window = interval * options_.heartbeat_misses;
    pg::FrameHeader beat;
    beat.set_kind(pg::FrameHeader::HEARTBEAT);
    std::unique_lock<std::mutex> lock(mu_);
    while (!changed_.wait_for(lock, interval, [&] { return heartbeat_stop_; })) {
      std::vector<int> live;
      for (int r = 0; r < size_; ++r) {
        const Peer& p = *peers_[r];
        if (r != rank_ && p.connected && !p.lost && !p.said_goodbye) live.push_back(r);
      }
      lock.unlock();
      const int64_t now = Clock::now().time_since_epoch().count();
      for (int r : live) {
        const auto silent = std::chrono::duration_cast<milliseconds>(
            std::chrono::nanoseconds(now - peers_[r]->last_heard_ns.load(std::memory_order_relaxed)));
        if (silent > window) {
          const std::string reason = "rank " + std::to_string(r) + " (" + peer_address(r) + ") sent nothing for " +
                                     std::to_string(silent.count()) + " ms (" +
                                     std::to_string(options_.heartbeat_misses) + " heartbeats of " +
                                     std::to_string(interval.count()) + " ms missed): declared failed";
          LOG(ERROR) << "rank " << rank_ << ": " << reason;
          lost(r, Error(ErrorKind::kPeerUnavailable, reason));
          continue;
        }
        std::vector<grpc::Slice> slices;
        encode_frame(beat, {}, &slices);
        try {
          peers_[r]->outbox.send(std::move(slices), nullptr);
        } catch (const Error&) {
          // The stream is closing; its own failure report covers it.
        }
      }
      lock.lock();
    }
  }

  std::string peer_address(int r) {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_[r]->address;
  }

  bool is_connected(int r) {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_[r]->connected && !peers_[r]->lost;
  }

  void start_server() {
    grpc::ServerBuilder builder;
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024 * 1024);
    const std::string listen = options_.listen_host + ":" + std::to_string(options_.listen_port);
    builder.AddListeningPort(listen, server_credentials(options_.security), &port_);
    builder.RegisterCallbackGenericService(&service_);
    happens_before(this);  // everything so far happens before any ServerPeer's creation
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw Error(ErrorKind::kBadArgument, "rank " + std::to_string(rank_) + " cannot listen on " + listen);
    }
  }

  void rendezvous(Store& store) {
    const auto deadline = Clock::now() + options_.connect_timeout;
    const std::string host = options_.advertise_host.empty() ? options_.listen_host : options_.advertise_host;
    if (store.add("claim/" + std::to_string(rank_), 1) != 1) {
      throw Error(ErrorKind::kBadArgument, "rank " + std::to_string(rank_) + " joined the group twice");
    }
    store.set("addr/" + std::to_string(rank_), host + ":" + std::to_string(port_));
    for (int r = rank_ + 1; r < size_; ++r) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      const std::string address = store.get("addr/" + std::to_string(r), std::max(left, milliseconds(1)));
      {
        std::lock_guard<std::mutex> lock(mu_);
        peers_[r]->address = address;
      }
      peers_[r]->client = std::make_unique<ClientPeer>(*this, r, address);
      peers_[r]->client->start();
    }
    std::unique_lock<std::mutex> lock(mu_);
    std::string refused, failed;
    auto all_connected = [&] {
      bool all = true;
      for (int r = 0; r < size_; ++r) {
        if (!peers_[r]->refusal.empty()) {
          refused = "rank " + std::to_string(r) + " refused rank " + std::to_string(rank_) + ": " +
                    peers_[r]->refusal;
          return true;
        }
        if (!peers_[r]->failure.empty()) {
          failed = "rank " + std::to_string(rank_) + ": " + peers_[r]->failure;
          return true;
        }
        if (r != rank_ && !peers_[r]->connected) all = false;
      }
      return all;
    };
    const bool done = changed_.wait_until(lock, deadline, all_connected);
    if (!refused.empty()) throw Error(ErrorKind::kUnauthenticated, refused);
    if (!failed.empty()) throw Error(ErrorKind::kPeerUnavailable, failed);
    if (!done) {
      std::string missing;
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && !peers_[r]->connected) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error(ErrorKind::kTimeout, "rank " + std::to_string(rank_) + ": ranks " + missing +
                                           " did not connect within " +
                                           std::to_string(options_.connect_timeout.count()) + " ms");
    }
  }

  const int rank_;
  const int size_;
  const GrpcTransportOptions options_;
  FrameSink& sink_;
  PeerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::atomic<bool> stopping_{false};
  std::thread heartbeat_thread_;

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  bool shut_down_ = false;
  bool heartbeat_stop_ = false;
  int live_reactors_ = 0;
};

// --- ClientPeer ------------------------------------------------------------------------

ClientPeer::ClientPeer(GrpcTransport& transport, int peer, const std::string& address)
    : transport_(transport), peer_(peer) {
  grpc::ChannelArguments args = channel_arguments();
  auto credentials = channel_credentials(transport.security(), &args);
  channel_ = grpc::CreateCustomChannel(address, credentials, args);
  context_.set_wait_for_ready(true);
}

void ClientPeer::start() {
  transport_.reactor_started();
  grpc::GenericStub(channel_).PrepareBidiStreamingCall(&context_, kExchangeMethod, grpc::StubOptions(), this);
  // Hold the call open until OnDone even when no read or write is pending.
  AddHold();
  transport_.outbox(peer_).send(transport_.hello_frame(), nullptr);
  transport_.outbox(peer_).attach([this](Buffer* b) {
    happens_before(this);
    StartWrite(b);
    happens_before(b);  // gRPC read the buffer inside StartWrite (see on_write_done)
  });
  happens_before(&read_buffer_);
  StartRead(&read_buffer_);
  StartCall();
}

void ClientPeer::OnReadDone(bool ok) {
  Reaction reaction(&read_buffer_, &peer_);
  if (!ok) {
    // Ended before the handshake completed: OnDone records the peer's status. (Treating
    // it as a lost peer would cancel the call and replace that status with CANCELLED.)
    if (acknowledged_) transport_.lost(peer_, transport_.lost_error(peer_));
    RemoveHold();
    return;
  }
  if (!acknowledged_) {
    acknowledged_ = true;  // the first message is the peer's hello: it accepted us
    transport_.mark_connected(peer_, context_.peer());
  } else if (!transport_.deliver(peer_, read_buffer_)) {
    context_.TryCancel();
    RemoveHold();
    return;
  }
  happens_before(&read_buffer_);
  StartRead(&read_buffer_);
}

void ClientPeer::OnWriteDone(bool ok) {
  Reaction reaction(this, &peer_);
  transport_.outbox(peer_).on_write_done(ok, [this] { return transport_.lost_error(peer_); });
}

void ClientPeer::OnDone(const grpc::Status& status) {
  happens_after(&read_buffer_);
  happens_after(this);
  happens_after(&peer_);
  if (!acknowledged_) transport_.mark_ended_before_answer(peer_, status);
  transport_.outbox(peer_).attach(nullptr);
  transport_.reactor_done();
}

// --- ServerPeer ------------------------------------------------------------------------

ServerPeer::ServerPeer(GrpcTransport& transport, grpc::GenericCallbackServerContext* context)
    : transport_(transport), context_(context) {
  transport_.reactor_started();
  happens_before(&read_buffer_);
  StartRead(&read_buffer_);
}

void ServerPeer::OnReadDone(bool ok) {
  Reaction reaction(&read_buffer_, &peer_);
  if (!ok) {
    if (peer_ >= 0) {
      transport_.lost(peer_, transport_.lost_error(peer_));
      // Finish only once no write is in flight; OnWriteDone finishes otherwise.
      finish_when_written_ = true;
      if (!transport_.outbox(peer_).writing()) finish_once(grpc::Status::OK);
    } else {
      finish_once(grpc::Status(grpc::StatusCode::CANCELLED, "closed before hello"));
    }
    return;
  }
  if (peer_ < 0) {
    std::string problem;
    int rank = -1;
    try {
      auto frames = decode_frames(read_buffer_, -1);
      problem = frames.size() == 1 ? transport_.check_hello(frames[0].header) : "expected one hello frame";
      if (problem.empty()) rank = frames[0].header.rank();
    } catch (const Error& e) {
      problem = e.what();
    }
    if (!problem.empty()) {
      LOG(WARNING) << "rank " << transport_.my_rank() << ": refused a connection from " << context_->peer()
                   << ": " << problem;
      finish_once(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, problem));
      return;
    }
    peer_ = rank;
    transport_.outbox(peer_).send(transport_.hello_frame(), nullptr);  // the acknowledgement
    transport_.outbox(peer_).attach([this](Buffer* b) {
      happens_before(this);
      StartWrite(b);
      happens_before(b);  // gRPC read the buffer inside StartWrite (see on_write_done)
    });
    transport_.mark_connected(peer_, context_->peer());
  } else if (!transport_.deliver(peer_, read_buffer_)) {
    finish_when_written_ = true;
    if (!transport_.outbox(peer_).writing()) {
      finish_once(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed frame"));
    }
    return;
  }
  happens_before(&read_buffer_);
  StartRead(&read_buffer_);
}

void ServerPeer::OnWriteDone(bool ok) {
  Reaction reaction(this, &peer_);
  Outbox& outbox = transport_.outbox(peer_);
  outbox.on_write_done(ok, [this] { return transport_.lost_error(peer_); });
  if (finish_when_written_ && !outbox.writing()) finish_once(grpc::Status::OK);
}

void ServerPeer::OnDone() {
  happens_after(&read_buffer_);
  happens_after(this);
  happens_after(&peer_);
  if (peer_ >= 0) transport_.outbox(peer_).attach(nullptr);
  GrpcTransport& transport = transport_;
  delete this;
  transport.reactor_done();
}

grpc::ServerGenericBidiReactor* PeerService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  if (context->method() != kExchangeMethod) {
    return grpc::CallbackGenericService::CreateReactor(context);  // UNIMPLEMENTED
  }
  happens_after(&transport_);
  return new ServerPeer(transport_, context);
}

}  // namespace

std::unique_ptr<Transport> create_grpc_transport(Store& store, int rank, int size,
                                                 const GrpcTransportOptions& options, FrameSink& sink) {
  return std::make_unique<GrpcTransport>(store, rank, size, options, sink);
}

}  // namespace drpc
