#pragma once

// Internal to //process_group:ucx_links: how a message to one peer is laid out for UCX before
// it is posted (ucx_link_message.h has the wire format).

#include <ATen/core/Tensor.h>
#include <ucp/api/ucp.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "process_group/frame.h"
#include "process_group/ucx_link_message.h"

namespace drpc {

// A message's pieces in wire order: copied pieces owned here, mid-sized tensors in place in
// the head, large tensors as bodies. Not thread-safe; the tensors it is given are kept alive
// until it is destroyed.
class LinkPieces final : public FramePieces {
 public:
  void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override;
  void add_tensor(const at::Tensor& tensor) override;

  // Puts `head` (the prefix and body table) before the frames.
  void add_head(std::string head);

  // Copies the head message into one buffer when it is small and holds no tensor in place;
  // returns whether it did.
  bool make_contiguous();

  // Lets go of the bodies' tensors once their bytes were copied elsewhere (an arena): what
  // they are views of may be a block a peer waits to reuse.
  void drop_body_tensors();

  // A small message costs a few allocations here (it is built for every call): the vector of
  // owned pieces allocates nothing until used, their buffers keep their place when it grows,
  // and the head is kept as given.
  std::vector<std::vector<uint8_t>> owned_;
  std::string head_;
  std::vector<at::Tensor> tensors_;  // in place in the head: kept alive until sent
  std::vector<at::Tensor> body_tensors_;  // kept alive until sent, or dropped once copied
  std::vector<ucp_dt_iov_t> segments_;  // the head's first (once add_head is called), then the frames'
  std::vector<LinkBody> bodies_;  // their tags are set when the message is posted
  std::vector<void*> body_data_;
  std::vector<uint8_t> contiguous_;
  size_t frames_bytes_ = 0;

 private:
  void reserve_head_segment();
};

}  // namespace drpc
