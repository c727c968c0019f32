#include "process_group/collective_process_group.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <glog/logging.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "common/error_wire.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum CollectiveType : int32_t { kBroadcast = 1, kAllreduce = 2, kAllgather = 3, kBarrier = 4 };

const char* collective_name(int32_t type) {
  switch (type) {
    case kBroadcast: return "broadcast";
    case kAllreduce: return "allreduce";
    case kAllgather: return "allgather";
    case kBarrier: return "barrier";
  }
  return "unknown collective";
}

// What every rank must agree on for one collective call.
struct Descriptor {
  int32_t type = 0;
  int32_t reduce_op = 0;
  int32_t root = -1;
  pg::TensorMeta full;

  void write(pg::FrameHeader* header) const {
    header->set_collective(type);
    header->set_reduce_op(reduce_op);
    header->set_root(root);
    *header->mutable_full() = full;
  }

  std::string describe() const {
    std::string out = describe_meta(full);
    if (type == kAllreduce) out += std::string(" ") + reduce_op_name(static_cast<ReduceOp>(reduce_op));
    if (type == kBroadcast) out += " from root " + std::to_string(root);
    return type == kBarrier ? "barrier" : out;
  }

  std::string describe_header(const pg::FrameHeader& h) const {
    Descriptor theirs;
    theirs.type = h.collective();
    theirs.reduce_op = h.reduce_op();
    theirs.root = h.root();
    theirs.full = h.full();
    std::string out = theirs.describe();
    if (theirs.type != type) out = std::string(collective_name(theirs.type)) + " of " + out;
    return out;
  }

  bool matches(const pg::FrameHeader& h) const {
    return h.collective() == type && h.reduce_op() == reduce_op && h.root() == root &&
           h.full().dtype() == full.dtype() &&
           std::equal(h.full().sizes().begin(), h.full().sizes().end(), full.sizes().begin(),
                      full.sizes().end());
  }
};

pg::TensorMeta meta_of(const at::Tensor& t) {
  pg::TensorMeta meta;
  meta.set_dtype(static_cast<int32_t>(t.scalar_type()));
  for (int64_t size : t.sizes()) meta.add_sizes(size);
  meta.set_nbytes(t.nbytes());
  return meta;
}

void check_dense_cpu(const at::Tensor& t, const char* what) {
  if (!t.defined()) throw Error(ErrorKind::kBadArgument, std::string(what) + ": undefined tensor");
  if (!t.device().is_cpu() || t.layout() != c10::kStrided) {
    throw Error(ErrorKind::kBadArgument,
                std::string(what) + ": only dense CPU tensors are supported, got " +
                    t.toString());
  }
}

// acc = acc (op) other, elementwise, in place.
void reduce_into(at::Tensor& acc, const at::Tensor& other, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      acc.add_(other);
      return;
    case ReduceOp::kProduct:
      acc.mul_(other);
      return;
    case ReduceOp::kMin:
      at::minimum_out(acc, acc, other);
      return;
    case ReduceOp::kMax:
      at::maximum_out(acc, acc, other);
      return;
  }
}

void finish_average(at::Tensor& t, int world_size) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.div_(world_size);
  } else {
    t.div_(world_size, "trunc");
  }
}

// A received frame's first tensor as a read-only tensor over the frame's bytes, copying
// only when the bytes arrived in several fragments.
at::Tensor view_body(const Frame& frame, const at::Tensor& like, at::Tensor& scratch) {
  const int64_t numel = like.numel();
  if (frame.body.size() == 1) {
    return at::from_blob(const_cast<uint8_t*>(frame.body[0].data), {numel}, like.options());
  }
  if (scratch.numel() < numel || scratch.scalar_type() != like.scalar_type()) {
    scratch = at::empty({numel}, like.options());
  }
  at::Tensor out = scratch.narrow(0, 0, numel);
  frame.copy_body(0, out.data_ptr(), out.nbytes());
  return out;
}

struct P2PWaiter {
  int source;  // -1: any source
  int64_t tag;
  std::function<void(Frame&)> on_frame;
  std::function<void(std::exception_ptr)> on_error;
};

class CollectiveProcessGroup final : public ProcessGroup, private FrameSink {
 public:
  CollectiveProcessGroup(const TransportFactory& make_transport, const CollectiveOptions& options)
      : options_(options) {
    transport_ = make_transport(*this);
    rank_ = transport_->rank();
    size_ = transport_->size();
    collective_thread_ = std::thread([this] { collective_loop(); });
  }

  ~CollectiveProcessGroup() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  WorkPtr broadcast(at::Tensor tensor, int root) override {
    check_dense_cpu(tensor, "broadcast");
    check_rank(root, "broadcast root");
    Descriptor desc{kBroadcast, 0, root, meta_of(tensor)};
    return enqueue(desc, [this, tensor, root](Call& call) mutable -> std::vector<at::Tensor> {
      at::Tensor work = tensor.contiguous();
      if (rank_ == root) {
        for (int peer : call.peers_from(rank_ + 1)) call.send(peer, work);
        // The acknowledgements carry each receiver's descriptor: without them a root would
        // never learn that a receiver disagreed on shape or dtype.
        for (int peer : call.peers_from(rank_ + 1)) call.recv(peer);
      } else {
        Frame frame = call.recv(root);
        frame.copy_body(0, work.data_ptr(), work.nbytes());
        if (!work.is_same(tensor)) tensor.copy_(work);
        call.send(root, at::Tensor());
      }
      return {};
    });
  }

  WorkPtr allreduce(at::Tensor tensor, ReduceOp op) override {
    check_dense_cpu(tensor, "allreduce");
    if (op == ReduceOp::kAvg && tensor.scalar_type() == at::kBool) {
      throw Error(ErrorKind::kBadArgument, "allreduce: AVG is not defined for bool tensors");
    }
    Descriptor desc{kAllreduce, static_cast<int32_t>(op), -1, meta_of(tensor)};
    return enqueue(desc, [this, tensor, op](Call& call) mutable -> std::vector<at::Tensor> {
      at::Tensor work = tensor.contiguous();
      if (size_ > 1 && work.numel() > 0) {
        if (static_cast<int64_t>(work.nbytes()) <= options_.ring_threshold_bytes ||
            work.numel() < size_) {
          allreduce_direct(call, work, op);
        } else {
          allreduce_ring(call, work, op);
        }
      }
      if (op == ReduceOp::kAvg) finish_average(work, size_);
      if (!work.is_same(tensor)) tensor.copy_(work);
      return {};
    });
  }

  WorkPtr allgather(const at::Tensor& input) override {
    check_dense_cpu(input, "allgather");
    Descriptor desc{kAllgather, 0, -1, meta_of(input)};
    return enqueue(desc, [this, input](Call& call) -> std::vector<at::Tensor> {
      at::Tensor work = input.contiguous();
      std::vector<at::Tensor> out(size_);
      out[rank_] = work.clone();
      for (int peer : call.peers_from(rank_ + 1)) call.send(peer, work);
      for (int peer : call.peers_from(rank_ + 1)) {
        Frame frame = call.recv(peer);
        out[peer] = at::empty(work.sizes(), work.options());
        frame.copy_body(0, out[peer].data_ptr(), out[peer].nbytes());
      }
      return out;
    });
  }

  WorkPtr barrier() override {
    Descriptor desc{kBarrier, 0, -1, pg::TensorMeta()};
    return enqueue(desc, [this](Call& call) -> std::vector<at::Tensor> {
      for (int peer : call.peers_from(rank_ + 1)) call.send(peer, at::Tensor());
      for (int peer : call.peers_from(rank_ + 1)) call.recv(peer);
      return {};
    });
  }

  WorkPtr send(const std::vector<at::Tensor>& tensors, int dst_rank, int64_t tag) override {
    check_peer(dst_rank, "send destination");
    std::vector<at::Tensor> contiguous;
    for (const auto& t : tensors) {
      check_dense_cpu(t, "send");
      contiguous.push_back(t.contiguous());
    }
    auto work = std::make_shared<Work>("send to rank " + std::to_string(dst_rank) + " with tag " +
                                       std::to_string(tag));
    try {
      check_open();
      pg::FrameHeader header;
      header.set_kind(pg::FrameHeader::P2P);
      header.set_tag(tag);
      describe_tensors(contiguous, &header);
      transport_->send(dst_rank, header, contiguous, [work](std::exception_ptr error) {
        if (error) {
          work->finish_with_error(error);
        } else {
          work->finish();
        }
      });
    } catch (const Error&) {
      work->finish_with_error(std::current_exception());
    }
    return work;
  }

  WorkPtr recv(const std::vector<at::Tensor>& tensors, int src_rank, int64_t tag) override {
    check_peer(src_rank, "recv source");
    for (const auto& t : tensors) check_dense_cpu(t, "recv");
    const std::string what =
        "recv from rank " + std::to_string(src_rank) + " with tag " + std::to_string(tag);
    auto work = std::make_shared<Work>(what);
    P2PWaiter waiter{src_rank, tag, nullptr, nullptr};
    waiter.on_frame = [work, tensors, what](Frame& frame) {
      const auto& metas = frame.header.tensors();
      auto mismatch = [&](const std::string& detail) {
        work->finish_with_error(std::make_exception_ptr(Error(ErrorKind::kMismatch, what + ": " + detail)));
      };
      if (metas.size() != static_cast<int>(tensors.size())) {
        return mismatch("expected " + std::to_string(tensors.size()) + " tensors, " +
                        std::to_string(metas.size()) + " arrived");
      }
      size_t offset = 0;
      for (size_t i = 0; i < tensors.size(); ++i) {
        pg::TensorMeta mine = meta_of(tensors[i]);
        if (mine.dtype() != metas[i].dtype() ||
            !std::equal(mine.sizes().begin(), mine.sizes().end(), metas[i].sizes().begin(),
                        metas[i].sizes().end())) {
          return mismatch("tensor " + std::to_string(i) + " is " + describe_meta(mine) +
                          " here but " + describe_meta(metas[i]) + " arrived");
        }
      }
      for (size_t i = 0; i < tensors.size(); ++i) {
        at::Tensor dst = tensors[i];
        if (dst.is_contiguous()) {
          frame.copy_body(offset, dst.data_ptr(), dst.nbytes());
        } else {
          dst.copy_(tensor_from_body(frame, metas[i], offset));
        }
        offset += metas[i].nbytes();
      }
      work->finish(tensors, frame.source);
    };
    waiter.on_error = [work](std::exception_ptr e) { work->finish_with_error(e); };
    add_waiter(std::move(waiter));
    return work;
  }

  WorkPtr recv_any(int64_t tag) override {
    auto work = std::make_shared<Work>("recv from any rank with tag " + std::to_string(tag));
    P2PWaiter waiter{-1, tag, nullptr, nullptr};
    waiter.on_frame = [work](Frame& frame) {
      std::vector<at::Tensor> out;
      size_t offset = 0;
      for (const auto& meta : frame.header.tensors()) {
        out.push_back(tensor_from_body(frame, meta, offset));
        offset += meta.nbytes();
      }
      work->finish(std::move(out), frame.source);
    };
    waiter.on_error = [work](std::exception_ptr e) { work->finish_with_error(e); };
    add_waiter(std::move(waiter));
    return work;
  }

  WorkPtr send_message(int dst_rank, const PgMessage& message) override {
    check_peer(dst_rank, "message destination");
    check_open();
    std::vector<at::Tensor> contiguous;
    for (const auto& t : message.tensors) {
      check_dense_cpu(t, "send_message");
      contiguous.push_back(t.contiguous());
    }
    pg::FrameHeader header;
    header.set_kind(pg::FrameHeader::MESSAGE);
    header.set_payload(message.header);
    describe_tensors(contiguous, &header);
    auto work = std::make_shared<Work>("message to rank " + std::to_string(dst_rank));
    transport_->send(dst_rank, header, contiguous, [work](std::exception_ptr error) {
      if (error) {
        work->finish_with_error(error);
      } else {
        work->finish();
      }
    });
    return work;
  }

  void set_message_listener(MessageListener listener) override {
    std::lock_guard<std::mutex> deliver(listener_mu_);
    std::deque<std::pair<int, PgMessage>> early;
    std::map<int, Error> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      listener_ = std::move(listener);
      early.swap(early_messages_);
      failed = dead_;
    }
    for (auto& [source, message] : early) {
      if (listener_.on_message) listener_.on_message(source, std::move(message));
    }
    for (auto& [peer, reason] : failed) {
      if (listener_.on_peer_failed) listener_.on_peer_failed(peer, reason);
    }
  }

  void shutdown() override {
    std::deque<Task> queued;
    std::list<P2PWaiter> waiters;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      shut_down_ = true;
      queued.swap(tasks_);
      waiters.swap(waiters_);
    }
    changed_.notify_all();
    transport_->shutdown();
    if (collective_thread_.joinable()) collective_thread_.join();
    auto error = std::make_exception_ptr(shutdown_error());
    for (auto& task : queued) task.work->finish_with_error(error);
    for (auto& waiter : waiters) waiter.on_error(error);
  }

 private:
  // One collective while it runs on the collective thread.
  class Call {
   public:
    Call(CollectiveProcessGroup& group, uint64_t seq, const Descriptor& desc, Clock::time_point deadline)
        : group_(group), seq_(seq), desc_(desc), deadline_(deadline) {}

    std::string what() const {
      return std::string(collective_name(desc_.type)) + " #" + std::to_string(seq_) + " (" +
             desc_.describe() + ")";
    }

    // Every other rank, starting at `first` and wrapping around (spreads the load).
    std::vector<int> peers_from(int first) const {
      std::vector<int> out;
      for (int i = 0; i < group_.size_ - 1; ++i) out.push_back((first + i) % group_.size_);
      return out;
    }

    // Queues `chunk` (undefined: an empty frame) for `dst`. Its bytes are read until
    // flush() returns, so the caller must not change them before.
    void send(int dst, const at::Tensor& chunk) {
      pg::FrameHeader header;
      header.set_kind(pg::FrameHeader::COLLECTIVE);
      header.set_seq(seq_);
      desc_.write(&header);
      std::vector<at::Tensor> tensors;
      if (chunk.defined()) tensors.push_back(chunk);
      describe_tensors(tensors, &header);
      {
        std::lock_guard<std::mutex> lock(sends_->mu);
        ++sends_->pending;
      }
      auto sends = sends_;
      auto on_sent = [sends](std::exception_ptr error) {
        std::lock_guard<std::mutex> lock(sends->mu);
        --sends->pending;
        if (error && !sends->error) sends->error = error;
        sends->cv.notify_all();
      };
      try {
        group_.transport_->send(dst, header, tensors, on_sent);
      } catch (const Error& e) {
        on_sent(nullptr);
        throw Error(e.kind(), what() + ": " + e.message());
      }
    }

    // Waits until every frame sent so far has been written; rethrows a failed write.
    void flush() {
      std::unique_lock<std::mutex> lock(sends_->mu);
      if (!sends_->cv.wait_until(lock, deadline_, [&] { return sends_->pending == 0; })) {
        throw Error(ErrorKind::kTimeout, what() + ": sending did not finish within " +
                                             std::to_string(group_.options_.timeout.count()) + " ms");
      }
      if (sends_->error) {
        try {
          std::rethrow_exception(sends_->error);
        } catch (const Error& e) {
          throw Error(e.kind(), what() + ": " + e.message());
        }
      }
    }

    // The next frame of this collective from `src`, checked against this rank's call.
    Frame recv(int src) {
      Frame frame = group_.wait_collective_frame(src, seq_, deadline_, *this);
      if (!desc_.matches(frame.header)) {
        throw Error(ErrorKind::kMismatch,
                    what() + ": rank " + std::to_string(group_.rank_) + " has " +
                        std::string(collective_name(desc_.type)) + " of " + desc_.describe() +
                        " but rank " + std::to_string(src) + " has " +
                        desc_.describe_header(frame.header));
      }
      return frame;
    }

    uint64_t seq() const { return seq_; }

   private:
    // Shared with the transport's completion callbacks, which may outlive the call.
    struct Sends {
      std::mutex mu;
      std::condition_variable cv;
      int pending = 0;
      std::exception_ptr error;
    };

    CollectiveProcessGroup& group_;
    const uint64_t seq_;
    const Descriptor desc_;
    const Clock::time_point deadline_;
    std::shared_ptr<Sends> sends_ = std::make_shared<Sends>();
  };

  struct Task {
    uint64_t seq;
    Descriptor desc;
    WorkPtr work;
    std::function<std::vector<at::Tensor>(Call&)> body;
  };

  // One round: every rank sends its tensor to every other, then all reduce the n tensors
  // in rank order, so the result is bitwise the same everywhere.
  void allreduce_direct(Call& call, at::Tensor& work, ReduceOp op) {
    for (int peer : call.peers_from(rank_ + 1)) call.send(peer, work);
    std::vector<Frame> frames(size_);
    for (int peer : call.peers_from(rank_ + 1)) frames[peer] = call.recv(peer);
    at::Tensor acc;
    at::Tensor scratch;
    for (int r = 0; r < size_; ++r) {
      at::Tensor value = r == rank_ ? work.view(-1) : view_body(frames[r], work, scratch);
      if (!acc.defined()) {
        acc = value.clone();
      } else {
        reduce_into(acc, value, op);
      }
    }
    call.flush();  // peers may still be reading `work`
    work.view(-1).copy_(acc);
  }

  // Reduce-scatter then allgather around the ring, each segment moved in chunks. Each
  // segment is reduced by one rank and copied to the others, so all ranks end bitwise equal.
  void allreduce_ring(Call& call, at::Tensor& work, ReduceOp op) {
    at::Tensor flat = work.view(-1);
    const int64_t numel = flat.numel();
    const int64_t chunk_elems =
        std::max<int64_t>(1, options_.chunk_bytes / static_cast<int64_t>(flat.element_size()));
    auto segment = [&](int index) {
      const int i = ((index % size_) + size_) % size_;
      const int64_t begin = numel * i / size_;
      const int64_t end = numel * (i + 1) / size_;
      return flat.narrow(0, begin, end - begin);
    };
    auto chunks_of = [&](const at::Tensor& seg) {
      return (seg.numel() + chunk_elems - 1) / chunk_elems;
    };
    auto chunk = [&](const at::Tensor& seg, int64_t c) {
      const int64_t begin = c * chunk_elems;
      return seg.narrow(0, begin, std::min(chunk_elems, seg.numel() - begin));
    };
    const int next = (rank_ + 1) % size_;
    const int prev = (rank_ + size_ - 1) % size_;
    at::Tensor scratch;
    for (int phase = 0; phase < 2; ++phase) {
      // The allgather overwrites segments that the reduce-scatter sent.
      if (phase == 1) call.flush();
      for (int step = 0; step < size_ - 1; ++step) {
        // Reduce-scatter: send seg r-s, reduce into seg r-s-1. Allgather: send seg r+1-s,
        // overwrite seg r-s with the fully reduced copy.
        at::Tensor out_seg = phase == 0 ? segment(rank_ - step) : segment(rank_ + 1 - step);
        at::Tensor in_seg = phase == 0 ? segment(rank_ - step - 1) : segment(rank_ - step);
        const int64_t n_out = chunks_of(out_seg);
        const int64_t n_in = chunks_of(in_seg);
        for (int64_t c = 0; c < std::max(n_out, n_in); ++c) {
          if (c < n_out) call.send(next, chunk(out_seg, c));
          if (c < n_in) {
            at::Tensor dst = chunk(in_seg, c);
            Frame frame = call.recv(prev);
            if (frame.body_size() != dst.nbytes()) {
              throw Error(ErrorKind::kMismatch, call.what() + ": rank " + std::to_string(prev) +
                                                    " sent a ring chunk of a different size");
            }
            if (phase == 0) {
              reduce_into(dst, view_body(frame, dst, scratch), op);
            } else {
              frame.copy_body(0, dst.data_ptr(), dst.nbytes());
            }
          }
        }
      }
    }
    call.flush();  // the caller may change `work` (AVG divides it) once this returns
  }

  WorkPtr enqueue(const Descriptor& desc, std::function<std::vector<at::Tensor>(Call&)> body) {
    auto work = std::make_shared<Work>(std::string(collective_name(desc.type)));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!shut_down_) {
        tasks_.push_back(Task{++next_seq_, desc, work, std::move(body)});
        changed_.notify_all();
        return work;
      }
    }
    work->finish_with_error(std::make_exception_ptr(shutdown_error()));
    return work;
  }

  void collective_loop() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] { return shut_down_ || !tasks_.empty(); });
        if (shut_down_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      Call call(*this, task.seq, task.desc, Clock::now() + options_.timeout);
      try {
        std::vector<at::Tensor> result = task.body(call);
        call.flush();  // the caller may reuse its tensors once the work completes
        task.work->finish(std::move(result));
      } catch (const Error& e) {
        abort_collective(task.seq, e);
        task.work->finish_with_error(std::current_exception());
      } catch (const std::exception& e) {
        Error error(ErrorKind::kBadArgument, call.what() + ": " + e.what());
        abort_collective(task.seq, error);
        task.work->finish_with_error(std::make_exception_ptr(error));
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = collective_inbox_.begin(); it != collective_inbox_.end();) {
        it = it->first.second <= task.seq ? collective_inbox_.erase(it) : std::next(it);
      }
      finished_seq_ = task.seq;
    }
  }

  // Tells every live peer that collective `seq` failed here, so none waits for its timeout.
  void abort_collective(uint64_t seq, const Error& error) {
    if (error.kind() == ErrorKind::kShutdown) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_.count(seq)) return;  // the abort came from a peer: it told the others
    }
    pg::FrameHeader header;
    header.set_kind(pg::FrameHeader::ABORT);
    header.set_seq(seq);
    header.set_error_kind(to_wire(error.kind()));
    header.set_payload(error.message());
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || is_dead(peer)) continue;
      try {
        transport_->send(peer, header, {}, nullptr);
      } catch (const Error&) {
        // That peer is gone too; it learns nothing more from us.
      }
    }
  }

  Frame wait_collective_frame(int src, uint64_t seq, Clock::time_point deadline, const Call& call) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto key = std::make_pair(src, seq);
    while (true) {
      if (shut_down_) throw Error(ErrorKind::kShutdown, call.what() + ": " + shutdown_error().message());
      // A peer's abort wins over frames already here, so that every rank that learns of
      // it in time reports the same failure instead of completing half the job.
      auto aborted = aborted_.find(seq);
      if (aborted != aborted_.end()) {
        throw Error(aborted->second.kind(), call.what() + " failed on " + aborted->second.message());
      }
      auto it = collective_inbox_.find(key);
      if (it != collective_inbox_.end() && !it->second.empty()) {
        Frame frame = std::move(it->second.front());
        it->second.pop_front();
        return frame;
      }
      // Only the peer waited on matters: a rank that finished this collective may already
      // have left, and a rank that died elsewhere makes its neighbours abort this one.
      auto dead = dead_.find(src);
      if (dead != dead_.end()) {
        throw Error(ErrorKind::kPeerUnavailable,
                    call.what() + ": rank " + std::to_string(src) + " is gone (" + dead->second.message() + ")");
      }
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
          Clock::now() >= deadline) {
        throw Error(ErrorKind::kTimeout, call.what() + " on rank " + std::to_string(rank_) +
                                             " timed out after " +
                                             std::to_string(options_.timeout.count()) +
                                             " ms waiting for rank " + std::to_string(src));
      }
    }
  }

  // --- FrameSink (transport threads) -------------------------------------------------
  void on_frame(Frame frame) override {
    switch (frame.header.kind()) {
      case pg::FrameHeader::COLLECTIVE: {
        std::lock_guard<std::mutex> lock(mu_);
        if (shut_down_ || frame.header.seq() <= finished_seq_) return;  // a failed collective's late frame
        collective_inbox_[{frame.source, frame.header.seq()}].push_back(std::move(frame));
        changed_.notify_all();
        return;
      }
      case pg::FrameHeader::ABORT: {
        std::lock_guard<std::mutex> lock(mu_);
        const uint64_t seq = frame.header.seq();
        if (seq <= finished_seq_ || aborted_.count(seq)) return;
        aborted_.emplace(seq, Error(from_wire(frame.header.error_kind()),
                                    "rank " + std::to_string(frame.source) + ": " + frame.header.payload()));
        changed_.notify_all();
        return;
      }
      case pg::FrameHeader::P2P:
        deliver_p2p(std::move(frame));
        return;
      case pg::FrameHeader::MESSAGE:
        deliver_message(std::move(frame));
        return;
      default:
        LOG(WARNING) << "rank " << rank_ << ": dropping a frame of unexpected kind "
                     << frame.header.kind() << " from rank " << frame.source;
    }
  }

  void on_peer_failed(int peer, const Error& reason) override {
    std::vector<P2PWaiter> failed;
    bool all_dead;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_ || dead_.count(peer)) return;
      dead_.emplace(peer, reason);
      all_dead = static_cast<int>(dead_.size()) == size_ - 1;
      for (auto it = waiters_.begin(); it != waiters_.end();) {
        if (it->source == peer || (it->source == -1 && all_dead)) {
          failed.push_back(std::move(*it));
          it = waiters_.erase(it);
        } else {
          ++it;
        }
      }
    }
    changed_.notify_all();
    LOG(WARNING) << "rank " << rank_ << ": lost rank " << peer << ": " << reason.message();
    for (auto& waiter : failed) waiter.on_error(std::make_exception_ptr(peer_error(peer, reason)));
    std::lock_guard<std::mutex> deliver(listener_mu_);
    if (listener_.on_peer_failed) listener_.on_peer_failed(peer, reason);
  }

  void deliver_p2p(Frame frame) {
    std::function<void(Frame&)> on_frame;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
        if (it->tag == frame.header.tag() && (it->source == -1 || it->source == frame.source)) {
          on_frame = std::move(it->on_frame);
          waiters_.erase(it);
          break;
        }
      }
      if (!on_frame) {
        p2p_inbox_.push_back(std::move(frame));
        return;
      }
    }
    on_frame(frame);
  }

  void add_waiter(P2PWaiter waiter) {
    Frame frame;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) {
        waiter.on_error(std::make_exception_ptr(shutdown_error()));
        return;
      }
      auto it = p2p_inbox_.begin();
      for (; it != p2p_inbox_.end(); ++it) {
        if (it->header.tag() == waiter.tag && (waiter.source == -1 || it->source == waiter.source)) break;
      }
      if (it == p2p_inbox_.end()) {
        auto dead = dead_.find(waiter.source);
        if (dead != dead_.end()) {
          waiter.on_error(std::make_exception_ptr(peer_error(dead->first, dead->second)));
          return;
        }
        waiters_.push_back(std::move(waiter));
        return;
      }
      frame = std::move(*it);
      p2p_inbox_.erase(it);
    }
    waiter.on_frame(frame);
  }

  void deliver_message(Frame frame) {
    PgMessage message;
    message.header = frame.header.payload();
    size_t offset = 0;
    for (const auto& meta : frame.header.tensors()) {
      message.tensors.push_back(tensor_from_body(frame, meta, offset));
      offset += meta.nbytes();
    }
    std::lock_guard<std::mutex> deliver(listener_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) return;
      if (!listener_.on_message) {
        early_messages_.emplace_back(frame.source, std::move(message));
        return;
      }
    }
    listener_.on_message(frame.source, std::move(message));
  }

  // --- helpers -----------------------------------------------------------------------
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size_) {
      throw Error(ErrorKind::kBadArgument, std::string(what) + " " + std::to_string(r) +
                                               " is out of range for a group of size " +
                                               std::to_string(size_));
    }
  }
  void check_peer(int r, const char* what) const {
    check_rank(r, what);
    if (r == rank_) throw Error(ErrorKind::kBadArgument, std::string(what) + " is this rank itself");
  }
  void check_open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw shutdown_error();
  }
  bool is_dead(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return dead_.count(peer) > 0;
  }
  Error shutdown_error() const {
    return Error(ErrorKind::kShutdown, "rank " + std::to_string(rank_) + "'s process group is shut down");
  }
  static Error peer_error(int peer, const Error& reason) {
    return Error(ErrorKind::kPeerUnavailable, "rank " + std::to_string(peer) + " is gone (" + reason.message() + ")");
  }

  const CollectiveOptions options_;
  std::unique_ptr<Transport> transport_;
  // Set once the transport exists, but its callbacks (on_frame, on_peer_failed) can run
  // during its construction, on its threads: atomics.
  std::atomic<int> rank_{-1};
  std::atomic<int> size_{0};
  std::thread collective_thread_;

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  bool shut_down_ = false;
  uint64_t next_seq_ = 0;
  uint64_t finished_seq_ = 0;
  std::deque<Task> tasks_;
  std::map<std::pair<int, uint64_t>, std::deque<Frame>> collective_inbox_;  // (source, seq)
  std::map<uint64_t, Error> aborted_;  // collective seq -> why a peer gave up
  std::map<int, Error> dead_;          // peer rank -> why it is gone
  std::list<Frame> p2p_inbox_;
  std::list<P2PWaiter> waiters_;
  std::deque<std::pair<int, PgMessage>> early_messages_;

  // Held while calling the listener, so messages reach it one at a time and in order.
  std::mutex listener_mu_;
  MessageListener listener_;  // written under both listener_mu_ and mu_
};

}  // namespace

std::unique_ptr<ProcessGroup> create_collective_process_group(const TransportFactory& make_transport,
                                                              const CollectiveOptions& options) {
  return std::make_unique<CollectiveProcessGroup>(make_transport, options);
}

}  // namespace drpc
