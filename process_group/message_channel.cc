// The MessagePort over a Transport: sends MESSAGE frames, hands arriving ones to the
// listener in order (see message_channel.h).

#include "process_group/message_channel.h"

#include <string>
#include <vector>

#include "process_group/group_checks.h"

namespace drpc {

void MessageChannel::attach(Transport& transport) {
  transport_ = &transport;
  rank_ = transport.rank();
  size_ = transport.size();
}

WorkPtr MessageChannel::send_message(int dst_rank, const PgMessage& message) {
  check_peer(dst_rank, rank_, size_, "message destination");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) throw shutdown_error(rank_);
  }
  std::vector<at::Tensor> contiguous;
  for (const auto& t : message.tensors) {
    check_dense_cpu(t, "send_message");
    contiguous.push_back(t.contiguous());
  }
  pg::FrameHeader header;  // the tensors' shapes go in the flat header encode_frame writes
  header.set_kind(pg::FrameHeader::MESSAGE);
  header.set_payload(message.header);
  auto work = std::make_shared<Work>([dst_rank] { return "message to rank " + std::to_string(dst_rank); });
  transport_->send(dst_rank, header, contiguous, [work](std::exception_ptr error) {
    if (error) {
      work->finish_with_error(error);
    } else {
      work->finish();
    }
  });
  return work;
}

void MessageChannel::set_message_listener(MessageListener listener) {
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

void MessageChannel::on_frame(Frame frame) {
  PgMessage message;
  message.header = std::move(*frame.header.mutable_payload());
  message.tensors.reserve(frame.tensors.size());
  size_t offset = 0;
  for (const auto& meta : frame.tensors) {
    message.tensors.push_back(tensor_from_body(frame, meta, offset, large_tensors_.get()));
    offset += meta.nbytes;
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

void MessageChannel::on_peer_failed(int peer, const Error& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    dead_.emplace(peer, reason);
  }
  std::lock_guard<std::mutex> deliver(listener_mu_);
  if (listener_.on_peer_failed) listener_.on_peer_failed(peer, reason);
}

void MessageChannel::close() {
  std::lock_guard<std::mutex> lock(mu_);
  shut_down_ = true;
  early_messages_.clear();
}

}  // namespace drpc
