// Which link carries each peer's frames, and the switch (link_router.h).

#include "process_group/link_router.h"

#include <glog/logging.h>

#include "process_group/connection_protocol.h"

namespace drpc {

LinkRouter::LinkRouter(int rank, int size, DataPlane plane, StreamSide& streams, size_t arena_bytes)
    : rank_(rank), size_(size), plane_(plane), streams_(streams), host_id_(this_host_id()) {
  for (int r = 0; r < size; ++r) routes_.push_back(std::make_unique<Route>());
  if (plane != DataPlane::kGrpc && size > 1) {
    std::string why_not;
    links_ = create_ucx_links(rank, size, plane, *this, &why_not, arena_bytes);
    if (!links_) VLOG(1) << "rank " << rank << ": no UCX links, every peer stays on gRPC: " << why_not;
  }
}

LinkRouter::~LinkRouter() { shutdown(); }

std::string LinkRouter::link_to(int peer) const {
  std::shared_lock<std::shared_mutex> lock(routes_.at(peer)->mu);
  if (!routes_[peer]->on_link) return "grpc";
  return routes_[peer]->shared_memory ? "ucx+shm" : "ucx";
}

void LinkRouter::send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                      std::function<void(std::exception_ptr)> on_sent) {
  Route& route = *routes_.at(dst);
  std::shared_lock<std::shared_mutex> lock(route.mu);
  if (route.on_link) {
    links_->send(dst, header, tensors, std::move(on_sent));
  } else {
    streams_.send_on_stream(dst, header, tensors, std::move(on_sent));
  }
}

void LinkRouter::offer_link(int peer) {
  pg::FrameHeader offer = control_header(pg::FrameHeader::LINK_OFFER);
  if (links_) {
    offer.set_link_address(links_->address());
    offer.set_link_secret(links_->inbound_secret(peer));
    offer.set_host_id(host_id_);
  }
  try {
    streams_.send_on_stream(peer, offer, {}, nullptr);
  } catch (const Error&) {
    // The stream is closing; its own failure report covers it.
  }
}

bool LinkRouter::on_control_frame(int peer, const pg::FrameHeader& header, bool on_stream) {
  switch (header.kind()) {
    case pg::FrameHeader::LINK_OFFER:
      if (on_stream) accept_offer(peer, header);
      return true;
    case pg::FrameHeader::LINK_READY:
      if (on_stream) switch_to_link(peer, header.link_shared_memory());
      return true;
    case pg::FrameHeader::SWITCH:
      if (on_stream && links_) links_->open_inbound(peer);
      return true;
    default:
      return false;
  }
}

void LinkRouter::wait_decided(std::chrono::steady_clock::time_point deadline) {
  if (!links_) return;
  std::unique_lock<std::mutex> lock(mu_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!decided_.wait_until(lock, deadline, [&] { return routes_[r]->decided; })) {
      lock.unlock();
      stay_on_stream(r, "it did not answer the UCX probe in time");
      lock.lock();
    }
  }
}

void LinkRouter::place_collective_frame(int src, uint64_t seq, uint32_t step, const at::Tensor& dst) {
  if (links_) links_->place_collective_frame(src, seq, step, dst);
}

void LinkRouter::release_placements(uint64_t seq) {
  if (links_) links_->release_placements(seq);
}

void LinkRouter::fail_peer(int peer, const Error& why) {
  if (links_) links_->fail_peer(peer, why);
}

void LinkRouter::shutdown() {
  if (links_) links_->shutdown();
}

void LinkRouter::accept_offer(int peer, const pg::FrameHeader& offer) {
  if (!links_) return;
  if (offer.link_address().empty()) return stay_on_stream(peer, "it has no UCX link");
  const bool same_host = offer.host_id() == host_id_;
  if (plane_ == DataPlane::kAuto && !same_host) {
    return stay_on_stream(peer, "it runs on another host (" + offer.host_id() + ")");
  }
  try {
    links_->connect(peer, offer.link_address(), offer.link_secret(), same_host);
  } catch (const Error& e) {
    stay_on_stream(peer, e.message());
  }
}

void LinkRouter::switch_to_link(int peer, bool shared_memory) {
  if (!links_) return;
  Route& route = *routes_[peer];
  std::unique_lock<std::shared_mutex> lock(route.mu);
  if (route.on_link) return;
  if (shared_memory) links_->use_shared_memory(peer);
  route.shared_memory = shared_memory;
  try {
    streams_.send_on_stream(peer, control_header(pg::FrameHeader::SWITCH), {}, nullptr);
  } catch (const Error&) {
    return;  // the stream is closing
  }
  route.on_link = true;
  lock.unlock();
  VLOG(1) << "rank " << rank_ << ": frames to rank " << peer << " go over UCX"
          << (shared_memory ? ", large tensors through shared memory" : "");
  mark_decided(peer);
}

void LinkRouter::stay_on_stream(int peer, const std::string& why) {
  VLOG(1) << "rank " << rank_ << ": frames to rank " << peer << " stay on gRPC: " << why;
  mark_decided(peer);
}

void LinkRouter::mark_decided(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  routes_[peer]->decided = true;
  decided_.notify_all();
}

void LinkRouter::on_link_frames(int source, std::vector<Frame> frames) {
  streams_.on_link_frames(source, std::move(frames));
}

void LinkRouter::on_link_probe(int source, bool shared_memory) {
  pg::FrameHeader ready = control_header(pg::FrameHeader::LINK_READY);
  ready.set_link_shared_memory(shared_memory);
  try {
    streams_.send_on_stream(source, ready, {}, nullptr);
  } catch (const Error&) {
    // The stream is closing; its own failure report covers it.
  }
}

void LinkRouter::on_link_failed(int source, const Error& why) { streams_.on_link_failed(source, why); }

}  // namespace drpc
