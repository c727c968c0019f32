// The demultiplexer of one rank's transport: owns it, routes frames by kind to the
// collectives, point-to-point and messages, fans out peer failures and shutdown, and
// hands out the ProcessGroup and MessagePort that share it.

#include "process_group/collective_process_group.h"

#include <glog/logging.h>

#include <atomic>
#include <mutex>
#include <set>

#include "process_group/collective_algorithms.h"
#include "process_group/collective_runner.h"
#include "process_group/message_channel.h"
#include "process_group/p2p_matcher.h"

namespace drpc {
namespace {

// Shared by the ProcessGroup and the MessagePort handed out; lives while either does.
class Demux final : private FrameSink {
 public:
  Demux(const TransportFactory& make_transport, const CollectiveOptions& options)
      : runner_(options.timeout), tuning_{options.ring_threshold_bytes, options.chunk_bytes} {
    transport_ = make_transport(*this);
    rank_ = transport_->rank();
    p2p_.attach(*transport_);
    messages_.attach(*transport_);
    runner_.attach(*transport_);
  }

  ~Demux() override { shutdown(); }

  CollectiveRunner& runner() { return runner_; }
  Transport& transport() { return *transport_; }
  const AllreduceTuning& tuning() const { return tuning_; }
  P2PMatcher& p2p() { return p2p_; }
  MessageChannel& messages() { return messages_; }

  // Pending work fails with kShutdown, the transport closes. Idempotent.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
    }
    runner_.close();
    p2p_.close();
    messages_.close();
    transport_->shutdown();
    runner_.join();
    p2p_.fail_closed();
  }

 private:
  // --- FrameSink (transport threads) -------------------------------------------------
  void on_frame(Frame frame) override {
    switch (frame.header.kind()) {
      case pg::FrameHeader::COLLECTIVE:
      case pg::FrameHeader::ABORT:
        runner_.on_frame(std::move(frame));
        return;
      case pg::FrameHeader::P2P:
        p2p_.on_frame(std::move(frame));
        return;
      case pg::FrameHeader::MESSAGE:
        messages_.on_frame(std::move(frame));
        return;
      default:
        LOG(WARNING) << "rank " << rank_ << ": dropping a frame of unexpected kind " << frame.header.kind()
                     << " from rank " << frame.source;
    }
  }

  void on_peer_failed(int peer, const Error& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_ || !failed_.insert(peer).second) return;
    }
    runner_.on_peer_failed(peer, reason);
    p2p_.on_peer_failed(peer, reason);
    LOG(WARNING) << "rank " << rank_ << ": lost rank " << peer << ": " << reason.message();
    messages_.on_peer_failed(peer, reason);
  }

  // Built before the transport, whose callbacks may reach them during its construction.
  CollectiveRunner runner_;
  const AllreduceTuning tuning_;
  P2PMatcher p2p_;
  MessageChannel messages_;
  std::unique_ptr<Transport> transport_;
  std::atomic<int> rank_{-1};  // set once the transport exists; read by its threads

  std::mutex mu_;
  bool shut_down_ = false;  // guarded by mu_
  std::set<int> failed_;    // guarded by mu_: peers already reported gone
};

class CollectiveProcessGroup final : public ProcessGroup {
 public:
  explicit CollectiveProcessGroup(std::shared_ptr<Demux> demux) : demux_(std::move(demux)) {}
  ~CollectiveProcessGroup() override { shutdown(); }

  int rank() const override { return demux_->runner().rank(); }
  int size() const override { return demux_->runner().size(); }

  WorkPtr broadcast(at::Tensor tensor, int root) override {
    return run_broadcast(demux_->runner(), std::move(tensor), root);
  }
  WorkPtr allreduce(at::Tensor tensor, ReduceOp op) override {
    return run_allreduce(demux_->runner(), demux_->tuning(), std::move(tensor), op);
  }
  WorkPtr allgather(const at::Tensor& input) override { return run_allgather(demux_->runner(), input); }
  WorkPtr barrier() override { return run_barrier(demux_->runner()); }

  WorkPtr send(const std::vector<at::Tensor>& tensors, int dst_rank, int64_t tag) override {
    return demux_->p2p().send(tensors, dst_rank, tag);
  }
  WorkPtr recv(const std::vector<at::Tensor>& tensors, int src_rank, int64_t tag) override {
    return demux_->p2p().recv(tensors, src_rank, tag);
  }
  WorkPtr recv_any(int64_t tag) override { return demux_->p2p().recv_any(tag); }

  void shutdown() override { demux_->shutdown(); }

  std::string link_to(int rank) const override { return demux_->transport().link_to(rank); }

 private:
  std::shared_ptr<Demux> demux_;
};

// The port handed out: forwards to the demux's channel and keeps the transport alive.
class SharedMessagePort final : public MessagePort {
 public:
  explicit SharedMessagePort(std::shared_ptr<Demux> demux) : demux_(std::move(demux)) {}
  // Nothing more is delivered through a port that is gone.
  ~SharedMessagePort() override { demux_->messages().close(); }

  int rank() const override { return demux_->messages().rank(); }
  int size() const override { return demux_->messages().size(); }
  WorkPtr send_message(int dst_rank, const PgMessage& message) override {
    return demux_->messages().send_message(dst_rank, message);
  }
  void set_message_listener(MessageListener listener) override {
    demux_->messages().set_message_listener(std::move(listener));
  }

 private:
  std::shared_ptr<Demux> demux_;
};

}  // namespace

GroupEndpoints create_collective_process_group(const TransportFactory& make_transport,
                                               const CollectiveOptions& options) {
  auto demux = std::make_shared<Demux>(make_transport, options);
  GroupEndpoints endpoints;
  endpoints.group = std::make_unique<CollectiveProcessGroup>(demux);
  endpoints.messages = std::make_unique<SharedMessagePort>(demux);
  return endpoints;
}

}  // namespace drpc
