// Runs a rank's collectives in call order on one thread: frames by sequence number, the
// per-collective deadline, and the abort protocol (see collective_runner.h).

#include "process_group/collective_runner.h"

#include <glog/logging.h>

#include <algorithm>

#include "common/error_wire.h"
#include "process_group/group_checks.h"
#include "process_group/process_group.h"

namespace drpc {

const char* collective_name(int32_t type) {
  switch (type) {
    case kBroadcast: return "broadcast";
    case kAllreduce: return "allreduce";
    case kAllgather: return "allgather";
    case kBarrier: return "barrier";
  }
  return "unknown collective";
}

// --- Descriptor ------------------------------------------------------------------------

void Descriptor::write(pg::FrameHeader* header) const {
  header->set_collective(type);
  header->set_reduce_op(reduce_op);
  header->set_root(root);
  *header->mutable_full() = full;
}

std::string Descriptor::describe() const {
  std::string out = describe_meta(full);
  if (type == kAllreduce) out += std::string(" ") + reduce_op_name(static_cast<ReduceOp>(reduce_op));
  if (type == kBroadcast) out += " from root " + std::to_string(root);
  return type == kBarrier ? "barrier" : out;
}

std::string Descriptor::describe_header(const pg::FrameHeader& h) const {
  Descriptor theirs;
  theirs.type = h.collective();
  theirs.reduce_op = h.reduce_op();
  theirs.root = h.root();
  theirs.full = h.full();
  std::string out = theirs.describe();
  if (theirs.type != type) out = std::string(collective_name(theirs.type)) + " of " + out;
  return out;
}

bool Descriptor::matches(const pg::FrameHeader& h) const {
  return h.collective() == type && h.reduce_op() == reduce_op && h.root() == root &&
         h.full().dtype() == full.dtype() &&
         std::equal(h.full().sizes().begin(), h.full().sizes().end(), full.sizes().begin(),
                    full.sizes().end());
}

// --- CollectiveCall --------------------------------------------------------------------

CollectiveCall::CollectiveCall(CollectiveRunner& runner, uint64_t seq, const Descriptor& desc,
                               std::chrono::steady_clock::time_point deadline)
    : runner_(runner), seq_(seq), desc_(desc), deadline_(deadline), sent_to_(runner.size_, 0) {}

int CollectiveCall::rank() const { return runner_.rank_; }
int CollectiveCall::size() const { return runner_.size_; }

std::string CollectiveCall::what() const {
  return std::string(collective_name(desc_.type)) + " #" + std::to_string(seq_) + " (" + desc_.describe() + ")";
}

std::vector<int> CollectiveCall::peers_from(int first) const {
  std::vector<int> out;
  const int size = runner_.size_;
  for (int i = 0; i < size - 1; ++i) out.push_back((first + i) % size);
  return out;
}

void CollectiveCall::send(int dst, const at::Tensor& chunk) {
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::COLLECTIVE);
  header.set_seq(seq_);
  header.set_step(sent_to_.at(dst)++);  // what the receiver's place() counts
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
    runner_.transport_->send(dst, header, tensors, on_sent);
  } catch (const Error& e) {
    on_sent(nullptr);
    throw Error(e.kind(), what() + ": " + e.message());
  }
}

void CollectiveCall::place(int src, uint32_t nth, const at::Tensor& dst) {
  placed_ = true;
  runner_.transport_->place_collective_frame(src, seq_, nth, dst);
}

void CollectiveCall::flush() {
  std::unique_lock<std::mutex> lock(sends_->mu);
  if (!sends_->cv.wait_until(lock, deadline_, [&] { return sends_->pending == 0; })) {
    throw Error(ErrorKind::kTimeout, what() + ": sending did not finish within " +
                                         std::to_string(runner_.timeout_.count()) + " ms");
  }
  if (sends_->error) {
    try {
      std::rethrow_exception(sends_->error);
    } catch (const Error& e) {
      throw Error(e.kind(), what() + ": " + e.message());
    }
  }
}

Frame CollectiveCall::recv(int src) {
  Frame frame = runner_.wait_frame(src, seq_, deadline_, *this);
  if (!desc_.matches(frame.header)) {
    throw Error(ErrorKind::kMismatch,
                what() + ": rank " + std::to_string(runner_.rank_) + " has " +
                    std::string(collective_name(desc_.type)) + " of " + desc_.describe() + " but rank " +
                    std::to_string(src) + " has " + desc_.describe_header(frame.header));
  }
  return frame;
}

// --- CollectiveRunner ------------------------------------------------------------------

CollectiveRunner::CollectiveRunner(std::chrono::milliseconds timeout) : timeout_(timeout) {}

CollectiveRunner::~CollectiveRunner() {
  close();
  join();
}

void CollectiveRunner::attach(Transport& transport) {
  transport_ = &transport;
  rank_ = transport.rank();
  size_ = transport.size();
  thread_ = std::thread([this] { loop(); });
}

WorkPtr CollectiveRunner::enqueue(const Descriptor& desc, Body body) {
  auto work = std::make_shared<Work>(std::string(collective_name(desc.type)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shut_down_) {
      tasks_.push_back(Task{++next_seq_, desc, work, std::move(body)});
      changed_.notify_all();
      return work;
    }
  }
  work->finish_with_error(std::make_exception_ptr(shutdown_error(rank_)));
  return work;
}

void CollectiveRunner::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  changed_.notify_all();
}

void CollectiveRunner::join() {
  if (thread_.joinable()) thread_.join();
  std::deque<Task> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(tasks_);
  }
  auto error = std::make_exception_ptr(shutdown_error(rank_));
  for (auto& task : queued) task.work->finish_with_error(error);
}

void CollectiveRunner::loop() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return shut_down_ || !tasks_.empty(); });
      if (shut_down_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    CollectiveCall call(*this, task.seq, task.desc, Clock::now() + timeout_);
    std::vector<at::Tensor> result;
    std::exception_ptr failure;
    try {
      result = task.body(call);
      call.flush();  // the caller may reuse its tensors once the work completes
    } catch (const Error& e) {
      abort_collective(task.seq, e);
      failure = std::current_exception();
    } catch (const std::exception& e) {
      Error error(ErrorKind::kBadArgument, call.what() + ": " + e.what());
      abort_collective(task.seq, error);
      failure = std::make_exception_ptr(error);
    }
    // Before the work completes: a frame still landing in a tensor of a failed collective
    // would otherwise write it after the caller has it back.
    if (call.placed_) transport_->release_placements(task.seq);
    if (failure) {
      task.work->finish_with_error(failure);
    } else {
      task.work->finish(std::move(result));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = inbox_.begin(); it != inbox_.end();) {
      it = it->first.second <= task.seq ? inbox_.erase(it) : std::next(it);
    }
    finished_seq_ = task.seq;
  }
}

// Tells every live peer that collective `seq` failed here, so none waits for its timeout.
void CollectiveRunner::abort_collective(uint64_t seq, const Error& error) {
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

Frame CollectiveRunner::wait_frame(int src, uint64_t seq, Clock::time_point deadline, const CollectiveCall& call) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_pair(src, seq);
  while (true) {
    if (shut_down_) throw Error(ErrorKind::kShutdown, call.what() + ": " + shutdown_error(rank_).message());
    // A peer's abort wins over frames already here, so that every rank that learns of
    // it in time reports the same failure instead of completing half the job.
    auto aborted = aborted_.find(seq);
    if (aborted != aborted_.end()) {
      throw Error(aborted->second.kind(), call.what() + " failed on " + aborted->second.message());
    }
    auto it = inbox_.find(key);
    if (it != inbox_.end() && !it->second.empty()) {
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
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && Clock::now() >= deadline) {
      throw Error(ErrorKind::kTimeout, call.what() + " on rank " + std::to_string(rank_) + " timed out after " +
                                           std::to_string(timeout_.count()) + " ms waiting for rank " +
                                           std::to_string(src));
    }
  }
}

void CollectiveRunner::on_frame(Frame frame) {
  std::lock_guard<std::mutex> lock(mu_);
  if (frame.header.kind() == pg::FrameHeader::ABORT) {
    const uint64_t seq = frame.header.seq();
    if (seq <= finished_seq_ || aborted_.count(seq)) return;
    aborted_.emplace(seq, Error(from_wire(frame.header.error_kind()),
                                "rank " + std::to_string(frame.source) + ": " + frame.header.payload()));
    changed_.notify_all();
    return;
  }
  if (shut_down_ || frame.header.seq() <= finished_seq_) return;  // a failed collective's late frame
  inbox_[{frame.source, frame.header.seq()}].push_back(std::move(frame));
  changed_.notify_all();
}

void CollectiveRunner::on_peer_failed(int peer, const Error& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_.emplace(peer, reason);
  }
  changed_.notify_all();
}

bool CollectiveRunner::is_dead(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return dead_.count(peer) > 0;
}

}  // namespace drpc
