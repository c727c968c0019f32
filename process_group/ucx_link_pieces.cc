// A message's layout for UCX (ucx_link_pieces.h).

#include "process_group/ucx_link_pieces.h"

#include <cstring>

namespace drpc {
namespace {

// Messages this small (with no tensor sent in place) go as one buffer: UCX's fastest path.
constexpr size_t kContiguousBytes = 64 * 1024;
// Tensors at least this large travel as bodies: UCX messages of their own, contiguous, which
// UCX moves with zero copies (cross-memory attach on one host), into a buffer the receiver
// then uses in place as the tensor's storage.
constexpr size_t kBodyBytes = 64 * 1024;

}  // namespace

// Segment 0 is kept for the head, so that add_head does not shift the others.
void LinkPieces::reserve_head_segment() {
  if (!segments_.empty()) return;
  segments_.reserve(4);
  segments_.push_back(ucp_dt_iov_t{nullptr, 0});
}

void LinkPieces::add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) {
  if (size == 0) return;
  reserve_head_segment();
  owned_.emplace_back(size);
  fill(owned_.back().data());
  segments_.push_back(ucp_dt_iov_t{owned_.back().data(), size});
  frames_bytes_ += size;
}

void LinkPieces::add_tensor(const at::Tensor& tensor) {
  if (tensor.nbytes() == 0) return;
  reserve_head_segment();
  if (tensor.nbytes() >= kBodyBytes) {
    body_tensors_.push_back(tensor);
    LinkBody body;
    body.offset = frames_bytes_;
    body.size = tensor.nbytes();
    bodies_.push_back(body);
    body_data_.push_back(tensor.data_ptr());
  } else {
    tensors_.push_back(tensor);
    segments_.push_back(ucp_dt_iov_t{tensor.data_ptr(), tensor.nbytes()});
  }
  frames_bytes_ += tensor.nbytes();
}

void LinkPieces::drop_body_tensors() {
  body_tensors_.clear();
  body_data_.assign(body_data_.size(), nullptr);
}

void LinkPieces::add_head(std::string head) {
  reserve_head_segment();
  head_ = std::move(head);
  segments_[0] = ucp_dt_iov_t{head_.data(), head_.size()};
}

bool LinkPieces::make_contiguous() {
  size_t total = 0;
  for (const auto& s : segments_) total += s.length;
  if (!tensors_.empty() || total > kContiguousBytes) return false;
  contiguous_.resize(total);
  size_t at = 0;
  for (const auto& s : segments_) {
    std::memcpy(contiguous_.data() + at, s.buffer, s.length);
    at += s.length;
  }
  return true;
}

}  // namespace drpc
