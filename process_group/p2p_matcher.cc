// Tagged point-to-point transfers: frames matched to waiting receives by source and tag
// (see p2p_matcher.h).

#include "process_group/p2p_matcher.h"

#include <algorithm>
#include <string>

#include "process_group/group_checks.h"

namespace drpc {

void P2PMatcher::attach(Transport& transport) {
  transport_ = &transport;
  rank_ = transport.rank();
  size_ = transport.size();
}

WorkPtr P2PMatcher::send(const std::vector<at::Tensor>& tensors, int dst_rank, int64_t tag) {
  check_peer(dst_rank, rank_, size_, "send destination");
  std::vector<at::Tensor> contiguous;
  for (const auto& t : tensors) {
    check_dense_cpu(t, "send");
    contiguous.push_back(t.contiguous());
  }
  auto work = std::make_shared<Work>(
      [dst_rank, tag] { return "send to rank " + std::to_string(dst_rank) + " with tag " + std::to_string(tag); });
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_down_) throw shutdown_error(rank_);
    }
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

WorkPtr P2PMatcher::recv(const std::vector<at::Tensor>& tensors, int src_rank, int64_t tag) {
  check_peer(src_rank, rank_, size_, "recv source");
  for (const auto& t : tensors) check_dense_cpu(t, "recv");
  const std::string what = "recv from rank " + std::to_string(src_rank) + " with tag " + std::to_string(tag);
  auto work = std::make_shared<Work>(what);
  Waiter waiter{src_rank, tag, nullptr, nullptr};
  waiter.on_frame = [work, tensors, what](Frame& frame) {
    const auto& metas = frame.tensors;
    auto mismatch = [&](const std::string& detail) {
      work->finish_with_error(std::make_exception_ptr(Error(ErrorKind::kMismatch, what + ": " + detail)));
    };
    if (metas.size() != tensors.size()) {
      return mismatch("expected " + std::to_string(tensors.size()) + " tensors, " + std::to_string(metas.size()) +
                      " arrived");
    }
    size_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (static_cast<int32_t>(tensors[i].scalar_type()) != metas[i].dtype ||
          tensors[i].sizes() != at::IntArrayRef(metas[i].sizes)) {
        return mismatch("tensor " + std::to_string(i) + " is " + describe_meta(meta_of(tensors[i])) + " here but " +
                        describe_meta(metas[i]) + " arrived");
      }
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor dst = tensors[i];
      if (dst.is_contiguous()) {
        frame.copy_body(offset, dst.data_ptr(), dst.nbytes());
      } else {
        dst.copy_(tensor_from_body(frame, metas[i], offset));
      }
      offset += metas[i].nbytes;
    }
    work->finish(tensors, frame.source);
  };
  waiter.on_error = [work](std::exception_ptr e) { work->finish_with_error(e); };
  add_waiter(std::move(waiter));
  return work;
}

WorkPtr P2PMatcher::recv_any(int64_t tag) {
  auto work = std::make_shared<Work>("recv from any rank with tag " + std::to_string(tag));
  Waiter waiter{-1, tag, nullptr, nullptr};
  waiter.on_frame = [work](Frame& frame) {
    std::vector<at::Tensor> out;
    size_t offset = 0;
    for (const auto& meta : frame.tensors) {
      out.push_back(tensor_from_body(frame, meta, offset));
      offset += meta.nbytes;
    }
    work->finish(std::move(out), frame.source);
  };
  waiter.on_error = [work](std::exception_ptr e) { work->finish_with_error(e); };
  add_waiter(std::move(waiter));
  return work;
}

void P2PMatcher::on_frame(Frame frame) {
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
      inbox_.push_back(std::move(frame));
      return;
    }
  }
  on_frame(frame);
}

void P2PMatcher::on_peer_failed(int peer, const Error& reason) {
  std::vector<Waiter> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_.emplace(peer, reason);
    const bool all_dead = static_cast<int>(dead_.size()) == size_ - 1;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->source == peer || (it->source == -1 && all_dead)) {
        failed.push_back(std::move(*it));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& waiter : failed) waiter.on_error(std::make_exception_ptr(peer_error(peer, reason)));
}

void P2PMatcher::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return;
  shut_down_ = true;
  closed_waiters_.swap(waiters_);
}

void P2PMatcher::fail_closed() {
  std::list<Waiter> waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiters.swap(closed_waiters_);
  }
  auto error = std::make_exception_ptr(shutdown_error(rank_));
  for (auto& waiter : waiters) waiter.on_error(error);
}

void P2PMatcher::add_waiter(Waiter waiter) {
  Frame frame;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) {
      waiter.on_error(std::make_exception_ptr(shutdown_error(rank_)));
      return;
    }
    auto it = inbox_.begin();
    for (; it != inbox_.end(); ++it) {
      if (it->header.tag() == waiter.tag && (waiter.source == -1 || it->source == waiter.source)) break;
    }
    if (it == inbox_.end()) {
      auto dead = dead_.find(waiter.source);
      if (dead != dead_.end()) {
        waiter.on_error(std::make_exception_ptr(peer_error(dead->first, dead->second)));
        return;
      }
      waiters_.push_back(std::move(waiter));
      return;
    }
    frame = std::move(*it);
    inbox_.erase(it);
  }
  waiter.on_frame(frame);
}

}  // namespace drpc
