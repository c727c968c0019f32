#include "process_group/grpc_transport.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/method_handler.h>
#include <grpcpp/impl/codegen/rpc_method.h>
#include <grpcpp/impl/codegen/rpc_service_method.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kExchangeMethod[] = "/drpc.pg.Peer/Exchange";
// Tensors this small are copied next to the header: one slice is cheaper than a
// zero-copy slice with its own release callback.
constexpr size_t kInlineBytes = 16 * 1024;
constexpr uint32_t kMaxHeaderBytes = 16 << 20;

using Stream = grpc::internal::ReaderInterface<grpc::ByteBuffer>;

// [u32 header length][header][small tensors] as one slice, then one slice per large
// tensor pointing at its storage, kept alive until gRPC releases the slice.
grpc::ByteBuffer encode_frame(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors) {
  const size_t header_size = header.ByteSizeLong();
  size_t inline_size = 0;
  for (const auto& t : tensors) {
    if (t.nbytes() <= kInlineBytes) inline_size += t.nbytes();
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(tensors.size() + 1);
  {
    grpc_slice head = grpc_slice_malloc(4 + header_size + inline_size);
    uint8_t* out = GRPC_SLICE_START_PTR(head);
    const uint32_t len = static_cast<uint32_t>(header_size);
    std::memcpy(out, &len, 4);  // little-endian hosts only (x86_64, aarch64)
    header.SerializeWithCachedSizesToArray(out + 4);
    out += 4 + header_size;
    for (const auto& t : tensors) {
      if (t.nbytes() <= kInlineBytes && t.nbytes() > 0) {
        std::memcpy(out, t.data_ptr(), t.nbytes());
        out += t.nbytes();
      }
    }
    slices.emplace_back(head, grpc::Slice::STEAL_REF);
  }
  // Small tensors sit in the head slice in order; large ones follow it. Their relative
  // order must match the metas, so large tensors are only allowed after all small ones
  // when both kinds are present: otherwise everything is inlined.
  bool large_seen = false;
  bool order_ok = true;
  for (const auto& t : tensors) {
    if (t.nbytes() > kInlineBytes) {
      large_seen = true;
    } else if (large_seen && t.nbytes() > 0) {
      order_ok = false;
    }
  }
  if (!order_ok) {
    // Rare: fall back to one copied slice per tensor, in order.
    slices.resize(1);
    grpc_slice head = grpc_slice_malloc(4 + header_size);
    uint8_t* out = GRPC_SLICE_START_PTR(head);
    const uint32_t len = static_cast<uint32_t>(header_size);
    std::memcpy(out, &len, 4);
    header.SerializeWithCachedSizesToArray(out + 4);
    slices[0] = grpc::Slice(head, grpc::Slice::STEAL_REF);
    for (const auto& t : tensors) {
      if (t.nbytes() > 0) slices.emplace_back(t.data_ptr(), t.nbytes());
    }
    return grpc::ByteBuffer(slices.data(), slices.size());
  }
  for (const auto& t : tensors) {
    if (t.nbytes() <= kInlineBytes) continue;
    auto* owner = new at::Tensor(t);
    slices.emplace_back(t.data_ptr(), t.nbytes(),
                        [](void* p) { delete static_cast<at::Tensor*>(p); }, owner);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Splits a received buffer into header and body without copying the body.
Frame decode_frame(grpc::ByteBuffer& buffer, int source) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (!buffer.Dump(slices.get()).ok()) throw Error(ErrorKind::kProtocol, "unreadable frame");
  Frame frame;
  frame.source = source;
  for (const auto& s : *slices) {
    if (s.size() > 0) frame.body.push_back(ByteSpan{s.begin(), s.size()});
  }
  frame.keepalive = slices;
  const size_t total = frame.body_size();
  if (total < 4) throw Error(ErrorKind::kProtocol, "frame shorter than its length prefix");
  uint32_t header_size = 0;
  frame.copy_body(0, &header_size, 4);
  if (header_size > kMaxHeaderBytes || header_size > total - 4) {
    throw Error(ErrorKind::kProtocol, "frame header length " + std::to_string(header_size) +
                                          " exceeds the frame (" + std::to_string(total) + " bytes)");
  }
  std::string header_bytes(header_size, '\0');
  frame.copy_body(4, header_bytes.data(), header_size);
  if (!frame.header.ParseFromString(header_bytes)) {
    throw Error(ErrorKind::kProtocol, "frame header is not a valid FrameHeader");
  }
  // Drop the prefix and header from the body spans.
  size_t skip = 4 + header_size;
  std::vector<ByteSpan> body;
  for (const auto& span : frame.body) {
    if (skip >= span.size) {
      skip -= span.size;
      continue;
    }
    body.push_back(ByteSpan{span.data + skip, span.size - skip});
    skip = 0;
  }
  frame.body = std::move(body);
  validate_frame(frame.header, frame.body_size());
  return frame;
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
  args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 4 * 1024 * 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  return args;
}

class GrpcTransport;

// The hand-written service: one bidirectional stream of raw ByteBuffers, so tensor bytes
// are never copied into a protobuf.
class PeerService final : public grpc::Service {
 public:
  explicit PeerService(GrpcTransport* transport);
};

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(Store& store, int rank, int size, const GrpcTransportOptions& options, FrameSink& sink)
      : rank_(rank), size_(size), options_(options), sink_(sink), service_(this), peers_(size) {
    if (size <= 0) throw Error(ErrorKind::kBadArgument, "world size must be positive, got " + std::to_string(size));
    if (rank < 0 || rank >= size) {
      throw Error(ErrorKind::kBadArgument, "rank " + std::to_string(rank) +
                                               " is out of range for world size " + std::to_string(size));
    }
    for (auto& peer : peers_) peer = std::make_unique<Peer>();
    try {
      start_server();
      rendezvous(store);
    } catch (...) {
      shutdown();
      throw;
    }
  }

  ~GrpcTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors) override {
    Peer& peer = *peers_.at(dst);
    grpc::ByteBuffer buffer = encode_frame(header, tensors);
    std::lock_guard<std::mutex> lock(peer.write_mu);
    if (stopping_) throw Error(ErrorKind::kShutdown, "rank " + std::to_string(rank_) + " is shutting down");
    if (!peer.writer) {
      throw Error(ErrorKind::kPeerUnavailable, "no connection to rank " + std::to_string(dst) + " (" +
                                                   peer.address + ")");
    }
    if (!peer.writer(buffer)) {
      peer.writer = nullptr;
      throw Error(ErrorKind::kPeerUnavailable, "connection to rank " + std::to_string(dst) + " (" +
                                                   peer.address + ") broke while sending");
    }
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    // Say goodbye first, so peers report an orderly leave rather than a broken link.
    pg::FrameHeader goodbye;
    goodbye.set_kind(pg::FrameHeader::GOODBYE);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      try {
        send(r, goodbye, {});
      } catch (const Error&) {
      }
    }
    stopping_ = true;
    // TryCancel is thread-safe; no lock, since a writer may be blocked holding write_mu.
    for (auto& peer : peers_) {
      if (peer->client_context) peer->client_context->TryCancel();
    }
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now());
      server_->Wait();
    }
    for (auto& peer : peers_) {
      if (peer->reader.joinable()) peer->reader.join();
    }
  }

  // Runs on a gRPC server thread for as long as a lower rank's stream lives.
  grpc::Status serve(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
    grpc::ByteBuffer buffer;
    if (!stream->Read(&buffer)) return grpc::Status(grpc::StatusCode::CANCELLED, "no hello");
    int peer_rank = -1;
    try {
      Frame hello = decode_frame(buffer, -1);
      const std::string problem = check_hello(hello.header);
      if (!problem.empty()) {
        LOG(WARNING) << "rank " << rank_ << ": refused a connection from " << context->peer() << ": "
                     << problem;
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, problem);
      }
      peer_rank = hello.header.rank();
    } catch (const Error& e) {
      LOG(WARNING) << "rank " << rank_ << ": refused a connection from " << context->peer() << ": "
                   << e.what();
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what());
    }
    Peer& peer = *peers_[peer_rank];
    {
      std::lock_guard<std::mutex> lock(peer.write_mu);
      if (!stream->Write(encode_frame(hello_header(), {}))) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "hello reply failed");
      }
      peer.address = context->peer();
      peer.writer = [stream](const grpc::ByteBuffer& b) { return stream->Write(b); };
    }
    mark_connected(peer_rank);
    read_loop(peer_rank, [stream](grpc::ByteBuffer* b) { return stream->Read(b); });
    std::lock_guard<std::mutex> lock(peer.write_mu);
    peer.writer = nullptr;  // the stream dies when this handler returns
    return grpc::Status::OK;
  }

 private:
  struct Peer {
    std::mutex write_mu;
    // Guarded by write_mu: writes one frame; null when not connected.
    std::function<bool(const grpc::ByteBuffer&)> writer;
    std::string address;
    // Client side (this rank is the lower one).
    std::unique_ptr<grpc::ClientContext> client_context;
    std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> client_stream;
    std::shared_ptr<grpc::Channel> channel;
    std::thread reader;
    // Guarded by GrpcTransport::mu_.
    bool connected = false;
    bool said_goodbye = false;
    std::string refusal;  // why the peer refused our hello
  };

  pg::FrameHeader hello_header() const {
    pg::FrameHeader hello;
    hello.set_kind(pg::FrameHeader::HELLO);
    hello.set_rank(rank_);
    hello.set_world_size(size_);
    hello.set_token(options_.token);
    hello.set_group(options_.group_name);
    return hello;
  }

  // Empty if `hello` may join this rank's group, else why not.
  std::string check_hello(const pg::FrameHeader& hello) {
    if (hello.kind() != pg::FrameHeader::HELLO) return "first frame is not a hello";
    if (hello.token() != options_.token) return "wrong or missing job token";
    if (hello.group() != options_.group_name) {
      return "peer belongs to group '" + hello.group() + "', not '" + options_.group_name + "'";
    }
    if (hello.world_size() != size_) {
      return "peer has world size " + std::to_string(hello.world_size()) + ", this rank has " +
             std::to_string(size_);
    }
    if (hello.rank() < 0 || hello.rank() >= rank_) {
      return "peer claims rank " + std::to_string(hello.rank()) + ", which does not connect to rank " +
             std::to_string(rank_);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (peers_[hello.rank()]->connected) return "rank " + std::to_string(hello.rank()) + " is already connected";
    return "";
  }

  void start_server() {
    grpc::ServerBuilder builder;
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 * 1024 * 1024 - 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 * 1024 * 1024);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 4 * 1024 * 1024);
    const std::string listen = options_.listen_host + ":" + std::to_string(options_.listen_port);
    builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
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
      connect_to(r, store.get("addr/" + std::to_string(r), std::max(left, milliseconds(1))));
    }
    std::unique_lock<std::mutex> lock(mu_);
    std::string refused;
    auto all_connected = [&] {
      bool all = true;
      for (int r = 0; r < size_; ++r) {
        if (!peers_[r]->refusal.empty()) {
          refused = "rank " + std::to_string(r) + " refused rank " + std::to_string(rank_) + ": " +
                    peers_[r]->refusal;
          return true;
        }
        if (r != rank_ && !peers_[r]->connected) all = false;
      }
      return all;
    };
    const bool done = connected_cv_.wait_until(lock, deadline, all_connected);
    if (!refused.empty()) throw Error(ErrorKind::kUnauthenticated, refused);
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

  void connect_to(int r, const std::string& address) {
    Peer& peer = *peers_[r];
    peer.address = address;
    peer.channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_arguments());
    peer.client_context = std::make_unique<grpc::ClientContext>();
    peer.client_context->set_wait_for_ready(true);
    const grpc::internal::RpcMethod method(kExchangeMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
    peer.client_stream.reset(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            peer.channel.get(), method, peer.client_context.get()));
    auto* stream = peer.client_stream.get();
    if (!stream->Write(encode_frame(hello_header(), {}))) {
      throw Error(ErrorKind::kPeerUnavailable, "rank " + std::to_string(rank_) + " cannot reach rank " +
                                                   std::to_string(r) + " at " + address);
    }
    peer.reader = std::thread([this, r, stream] {
      grpc::ByteBuffer buffer;
      if (!stream->Read(&buffer)) {
        const grpc::Status status = stream->Finish();
        {
          std::lock_guard<std::mutex> lock(mu_);
          peers_[r]->refusal = status.error_message().empty() ? "connection failed" : status.error_message();
        }
        connected_cv_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(peers_[r]->write_mu);
        peers_[r]->writer = [stream](const grpc::ByteBuffer& b) { return stream->Write(b); };
      }
      mark_connected(r);
      read_loop(r, [stream](grpc::ByteBuffer* b) { return stream->Read(b); });
      std::lock_guard<std::mutex> lock(peers_[r]->write_mu);
      peers_[r]->writer = nullptr;
    });
  }

  void mark_connected(int r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[r]->connected = true;
    }
    connected_cv_.notify_all();
  }

  // Delivers frames from peer `r` until its stream ends, then reports why it ended.
  void read_loop(int r, const std::function<bool(grpc::ByteBuffer*)>& read) {
    Peer& peer = *peers_[r];
    std::string reason = "connection to rank " + std::to_string(r) + " (" + peer.address + ") was lost";
    ErrorKind kind = ErrorKind::kPeerUnavailable;
    grpc::ByteBuffer buffer;
    while (read(&buffer)) {
      Frame frame;
      try {
        frame = decode_frame(buffer, r);
      } catch (const Error& e) {
        reason = "rank " + std::to_string(r) + " sent a malformed frame: " + e.message();
        kind = ErrorKind::kProtocol;
        LOG(ERROR) << "rank " << rank_ << ": " << reason << "; closing the connection";
        if (peer.client_context) peer.client_context->TryCancel();
        break;  // a server-side stream ends when serve() returns
      }
      if (frame.header.kind() == pg::FrameHeader::GOODBYE) {
        std::lock_guard<std::mutex> lock(mu_);
        peer.said_goodbye = true;
        continue;
      }
      if (frame.header.kind() == pg::FrameHeader::HELLO) continue;
      sink_.on_frame(std::move(frame));
    }
    if (stopping_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (peer.said_goodbye) reason = "rank " + std::to_string(r) + " shut down";
    }
    sink_.on_peer_failed(r, Error(kind, reason));
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

  std::mutex mu_;
  std::condition_variable connected_cv_;
  bool shut_down_ = false;  // guarded by mu_
};

PeerService::PeerService(GrpcTransport* transport) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kExchangeMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
      new grpc::internal::BidiStreamingHandler<GrpcTransport, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](GrpcTransport* t, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
            return t->serve(context, stream);
          },
          transport)));
}

}  // namespace

std::unique_ptr<Transport> create_grpc_transport(Store& store, int rank, int size,
                                                 const GrpcTransportOptions& options, FrameSink& sink) {
  return std::make_unique<GrpcTransport>(store, rank, size, options, sink);
}

}  // namespace drpc
