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

void LinkPieces::add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) {
  if (size == 0) return;
  owned_.emplace_back(size);
  fill(owned_.back().data());
  segments_.push_back(ucp_dt_iov_t{owned_.back().data(), size});
  frames_bytes_ += size;
}

void LinkPieces::add_tensor(const at::Tensor& tensor) {
  if (tensor.nbytes() == 0) return;
  tensors_.push_back(tensor);
  if (tensor.nbytes() >= kBodyBytes) {
    LinkBody body;
    body.offset = frames_bytes_;
    body.size = tensor.nbytes();
    bodies_.push_back(body);
    body_data_.push_back(tensor.data_ptr());
  } else {
    segments_.push_back(ucp_dt_iov_t{tensor.data_ptr(), tensor.nbytes()});
  }
  frames_bytes_ += tensor.nbytes();
}

void LinkPieces::add_head(const std::string& head) {
  owned_.emplace_front(head.begin(), head.end());
  segments_.insert(segments_.begin(), ucp_dt_iov_t{owned_.front().data(), head.size()});
}

bool LinkPieces::make_contiguous() {
  size_t total = 0;
  for (const auto& s : segments_) total += s.length;
  if (tensors_.size() != bodies_.size() || total > kContiguousBytes) return false;
  contiguous_.resize(total);
  size_t at = 0;
  for (const auto& s : segments_) {
    std::memcpy(contiguous_.data() + at, s.buffer, s.length);
    at += s.length;
  }
  return true;
}

}  // namespace drpc
