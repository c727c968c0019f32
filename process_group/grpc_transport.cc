#include "process_group/grpc_transport.h"

#include <glog/logging.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_callback.h>
#include <grpcpp/support/server_callback.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "common/wake_batch.h"
#include "process_group/connection_protocol.h"
#include "process_group/grpc_outbox.h"
#include "process_group/grpc_security.h"
#include "process_group/link_router.h"

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
// How long start-up waits for the UCX probes to be answered before the silent pairs stay on
// gRPC.
constexpr std::chrono::milliseconds kLinkProbeTimeout{5000};
// Frames with at least this much body flush the wake-ups owed before them (a copy of 1 MiB
// takes about 0.2 ms here).
constexpr size_t kLargeBodyBytes = 1 << 20;

// A gRPC message's slices, and spans over their bytes.
struct Message {
  std::shared_ptr<std::vector<grpc::Slice>> slices = std::make_shared<std::vector<grpc::Slice>>();
  std::vector<ByteSpan> pieces;
};

Message read_message(Buffer& buffer) {
  Message message;
  if (!buffer.Dump(message.slices.get()).ok()) throw Error(ErrorKind::kProtocol, "unreadable message");
  for (const auto& s : *message.slices) message.pieces.push_back(ByteSpan{s.begin(), s.size()});
  return message;
}

// Reads a gRPC message made of one or more frames, without copying tensor bytes.
std::vector<Frame> decode_frames(Buffer& buffer, int source) {
  Message message = read_message(buffer);
  return decode_wire_frames(message.pieces, message.slices, source);
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

class GrpcTransport final : public Transport, private StreamSide {
 public:
  GrpcTransport(Store& store, int rank, int size, const GrpcTransportOptions& options, FrameSink& sink)
      : rank_(rank),
        size_(size),
        options_(options),
        sink_(sink),
        protocol_({rank, size, options.security.token, options.group_name}, options.heartbeat_interval,
                  options.heartbeat_misses),
        service_(*this),
        router_(rank, size, options.data_plane, *this, options.shm_arena_bytes) {
    if (size <= 0) throw Error(ErrorKind::kBadArgument, "world size must be positive, got " + std::to_string(size));
    check_rank_in_world(rank, size);
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

  std::string link_to(int rank) const override {
    check_rank_in_world(rank, size_);
    if (rank == rank_) return "self";
    return router_.link_to(rank);
  }

  void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            SendCallback on_sent) override {
    if (stopping_) throw Error(ErrorKind::kShutdown, "rank " + std::to_string(rank_) + " is shutting down");
    router_.send(dst, header, tensors, std::move(on_sent));
  }

  void place_collective_frame(int src, uint64_t seq, uint32_t step, const at::Tensor& dst) override {
    router_.place_collective_frame(src, seq, step, dst);
  }
  void release_placements(uint64_t seq) override { router_.release_placements(seq); }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    // Say goodbye and wait for each peer's acknowledgement: it proves the peer has read
    // everything sent before, which cancelling the streams could otherwise discard.
    std::vector<int> waiting;
    for (int r : protocol_.connected_peers()) {
      try {
        send(r, control_header(pg::FrameHeader::GOODBYE), {}, nullptr);
        waiting.push_back(r);
      } catch (const Error&) {
      }
    }
    protocol_.wait_goodbyes_acknowledged(waiting, kGoodbyeTimeout);
    stopping_ = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      heartbeat_stop_ = true;
    }
    changed_.notify_all();
    if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
    router_.shutdown();
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

  // Reads a dialling peer's first message: its rank, or why it may not join.
  HelloVerdict accept_hello(Buffer& buffer) {
    try {
      Message message = read_message(buffer);
      return protocol_.accept_hello(message.pieces);
    } catch (const Error& e) {
      return HelloVerdict{-1, e.what()};
    }
  }

  // Queues this rank's hello: the first frame on a stream, either way.
  void send_hello(int peer) { peers_[peer]->outbox.send(hello_header(protocol_.self()), {}, nullptr); }

  // The stream to `peer` is up: offers it our UCX link (link_router.h).
  void mark_connected(int peer, std::string address) {
    protocol_.connected(peer, std::move(address), Clock::now());
    router_.offer_link(peer);
  }

  // Our stream to `peer` ended before the peer answered our hello. Only UNAUTHENTICATED is
  // the peer's own verdict (accept_hello): gRPC ends a stream whose connection broke with
  // UNAVAILABLE ("Socket closed" when the peer's end went away), which says nothing about
  // our credentials.
  void mark_ended_before_answer(int peer, const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      protocol_.refused(peer, status.error_message());
    } else {
      protocol_.ended_before_answer(
          peer, "gRPC status " + std::to_string(status.error_code()) + ": " + status.error_message());
    }
  }

  // Decodes and delivers one message from `peer`; returns false (after reporting the
  // peer lost) if it was malformed.
  bool deliver(int peer, Buffer& buffer) {
    if (protocol_.is_lost(peer)) return false;  // declared failed: nothing more is believed
    protocol_.heard_from(peer, Clock::now());
    std::vector<Frame> frames;
    try {
      frames = decode_frames(buffer, peer);
    } catch (const Error& e) {
      const std::string reason = "rank " + std::to_string(peer) + " sent a malformed frame: " + e.message();
      LOG(ERROR) << "rank " << rank_ << ": " << reason << "; closing the connection";
      lost(peer, Error(ErrorKind::kProtocol, reason));
      return false;
    }
    deliver_frames(peer, std::move(frames), /*on_grpc=*/true);
    return true;
  }

  // Acts on frames from `peer` (from its gRPC stream or its UCX link) in order.
  void deliver_frames(int peer, std::vector<Frame> frames, bool on_grpc) {
    WakeBatch wakes;  // the threads these frames hand work to wake once, at the end
    for (auto& frame : frames) {
      // A large body may be copied where it belongs on delivery (milliseconds): what was
      // delivered before it does not wait for that.
      if (frame.body_size() >= kLargeBodyBytes) WakeBatch::flush();
      if (router_.on_control_frame(peer, frame.header, on_grpc)) continue;
      switch (protocol_.on_frame(peer, frame.header)) {
        case FrameAction::kAcknowledgeGoodbye: {
          try {
            router_.send(peer, control_header(pg::FrameHeader::GOODBYE_ACK), {}, nullptr);
          } catch (const Error&) {
            // We are leaving too; the peer stops waiting when our stream closes.
          }
          break;
        }
        case FrameAction::kIgnore:
          break;
        case FrameAction::kDeliver:
          if (!stopping_) sink_.on_frame(std::move(frame));
      }
    }
  }

  // The stream to `peer` is gone; tells the sink once.
  void lost(int peer, const Error& why) {
    const std::optional<ConnectionProtocol::Loss> loss = protocol_.lose(peer, why);
    if (!loss) return;
    peers_[peer]->outbox.close(loss->error);
    router_.fail_peer(peer, loss->error);
    if (peers_[peer]->client) peers_[peer]->client->cancel();
    if (!stopping_ && loss->was_connected) sink_.on_peer_failed(peer, loss->error);
  }

  Error lost_error(int peer) { return protocol_.lost_error(peer); }

  bool stopping() const { return stopping_; }
  int my_rank() const { return rank_; }
  const SecurityOptions& security() const { return options_.security; }

 private:
  // The network side of one peer; the connection's state is protocol_'s.
  struct Peer {
    Outbox outbox;
    std::unique_ptr<ClientPeer> client;  // when this rank dials the peer
  };

  // --- StreamSide (for the router) ------------------------------------------------------
  void send_on_stream(int peer, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                      SendCallback on_sent) override {
    peers_[peer]->outbox.send(header, tensors, std::move(on_sent));
  }

  void on_link_frames(int source, std::vector<Frame> frames) override {
    if (protocol_.is_lost(source)) return;
    protocol_.heard_from(source, Clock::now());
    deliver_frames(source, std::move(frames), /*on_grpc=*/false);
  }

  void on_link_failed(int source, const Error& why) override {
    LOG(ERROR) << "rank " << rank_ << ": " << why.message() << "; closing the connection";
    lost(source, why);
  }

  // Sends each live peer a heartbeat every interval and declares failed those silent for
  // heartbeat_misses intervals: a stopped or hung process keeps its TCP connection open,
  // so only silence tells.
  void heartbeat_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!changed_.wait_for(lock, options_.heartbeat_interval, [&] { return heartbeat_stop_; })) {
      lock.unlock();
      ConnectionProtocol::HeartbeatRound round = protocol_.check_heartbeats(Clock::now());
      for (const auto& [r, why] : round.lost) {
        LOG(ERROR) << "rank " << rank_ << ": " << why.message();
        lost(r, why);
      }
      for (int r : round.beat) {
        try {
          router_.send(r, control_header(pg::FrameHeader::HEARTBEAT), {}, nullptr);
        } catch (const Error&) {
          // The stream is closing; its own failure report covers it.
        }
      }
      lock.lock();
    }
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
      protocol_.set_address(r, address);
      peers_[r]->client = std::make_unique<ClientPeer>(*this, r, address);
      peers_[r]->client->start();
    }
    protocol_.wait_connected(deadline, options_.connect_timeout);
    router_.wait_decided(std::min(deadline, Clock::now() + kLinkProbeTimeout));
  }

  const int rank_;
  const int size_;
  const GrpcTransportOptions options_;
  FrameSink& sink_;
  ConnectionProtocol protocol_;
  PeerService service_;
  LinkRouter router_;
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
  transport_.send_hello(peer_);
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
  happens_after(transport_.outbox(peer_).message());  // gRPC is done with it: the next write may replace it
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
    const HelloVerdict hello = transport_.accept_hello(read_buffer_);
    if (!hello.problem.empty()) {
      LOG(WARNING) << "rank " << transport_.my_rank() << ": refused a connection from " << context_->peer()
                   << ": " << hello.problem;
      finish_once(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, hello.problem));
      return;
    }
    peer_ = hello.rank;
    transport_.send_hello(peer_);  // the acknowledgement
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
  happens_after(outbox.message());  // gRPC is done with it: the next write may replace it
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
