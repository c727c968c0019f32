// The outgoing side of one peer's gRPC stream (grpc_outbox.h).

#include "process_group/grpc_outbox.h"

#include "process_group/frame.h"

namespace drpc {
namespace {

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

}  // namespace

void Outbox::attach(std::function<void(grpc::ByteBuffer*)> start_write) {
  std::unique_lock<std::mutex> lock(mu_);
  start_write_ = std::move(start_write);
  maybe_start(lock);
}

void Outbox::send(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors, SendCallback on_sent) {
  std::vector<grpc::Slice> slices;
  Slices out(&slices);
  encode_frame(header, tensors, out);
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) throw *closed_;
  for (auto& s : slices) queued_slices_.push_back(std::move(s));
  queued_callbacks_.push_back(std::move(on_sent));
  maybe_start(lock);
}

void Outbox::on_write_done(bool ok, const std::function<Error()>& why_not) {
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

bool Outbox::close(const Error& why) {
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

bool Outbox::writing() {
  std::lock_guard<std::mutex> lock(mu_);
  return writing_;
}

void Outbox::close_locked(const Error& why) {
  closed_ = why;
  queued_slices_.clear();
  for (auto& cb : queued_callbacks_) failed_.push_back(std::move(cb));
  queued_callbacks_.clear();
}

void Outbox::maybe_start(std::unique_lock<std::mutex>& lock) {
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
  buffer_ = grpc::ByteBuffer(queued_slices_.data(), queued_slices_.size());
  queued_slices_.clear();
  in_flight_.swap(queued_callbacks_);
  auto start = start_write_;
  lock.unlock();
  start(&buffer_);
}

}  // namespace drpc
