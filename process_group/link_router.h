#pragma once

// Internal to //process_group: which link carries each peer's frames, and the switch from a
// pair's gRPC stream to its UCX link (ucx_links.h). No gRPC here: the transport hands in its
// streams as a StreamSide.
//
// The switch, per direction: when a pair's stream is up, each side offers its link
// (LINK_OFFER: UCX address, a secret for this peer, host id) on the stream. The receiver of
// an offer connects and probes (offering its shared-memory arena when both are on one host);
// the probed side answers LINK_READY on the stream (saying whether it attached the arena); the prober
// then queues SWITCH as its last frame on the stream and sends the rest on the link, while
// the other side holds the link's frames until the SWITCH arrives. If any step fails the
// pair stays on gRPC and says why at --v=1.

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "process_group/proto/frame.pb.h"
#include "process_group/transport.h"
#include "process_group/ucx_links.h"

namespace drpc {

// The transport's side of the router: each peer's stream, and what arrives on links.
class StreamSide {
 public:
  virtual ~StreamSide() = default;
  // Queues a frame on `peer`'s stream. Throws once the stream is closing.
  virtual void send_on_stream(int peer, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                              std::function<void(std::exception_ptr)> on_sent) = 0;
  // Frames from `source`'s link, in order (the links' progress thread; must not block long).
  virtual void on_link_frames(int source, std::vector<Frame> frames) = 0;
  // `source` sent malformed frames with the pair's secret: it is lost.
  virtual void on_link_failed(int source, const Error& why) = 0;
};

class LinkRouter final : private UcxLinkSink {
 public:
  // `streams` must outlive this. Without links (`plane` kGrpc, a world of one, or UCX not
  // starting here: said at --v=1) every peer stays on its stream.
  LinkRouter(int rank, int size, DataPlane plane, StreamSide& streams, size_t arena_bytes = kDefaultArenaBytes);
  ~LinkRouter() override;
  LinkRouter(const LinkRouter&) = delete;
  LinkRouter& operator=(const LinkRouter&) = delete;

  // "ucx+shm" (UCX, large tensors through our arena), "ucx" or "grpc": where frames to
  // `peer` go now. Thread-safe.
  std::string link_to(int peer) const;

  // Sends on `dst`'s stream or, once switched, its link; in order across the switch.
  // Thread-safe; throws what the stream or link throws.
  void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            std::function<void(std::exception_ptr)> on_sent);

  // `peer`'s stream is up: offers it our link, or an empty offer (we have none) so that it
  // need not wait for one. Thread-safe.
  void offer_link(int peer);

  // Acts on a data-plane frame (LINK_OFFER, LINK_READY, SWITCH) from `peer`, trusted only
  // when it came `on_stream`; returns false for every other frame. In order per peer.
  bool on_control_frame(int peer, const pg::FrameHeader& header, bool on_stream);

  // Waits until every pair chose its link, or `deadline`; the silent ones stay on gRPC.
  void wait_decided(std::chrono::steady_clock::time_point deadline);

  // Transport::place_collective_frame and release_placements: frames that arrive on `src`'s
  // link can land in place; those on its stream are delivered as usual. Thread-safe.
  void place_collective_frame(int src, uint64_t seq, uint32_t step, const at::Tensor& dst);
  void release_placements(uint64_t seq);

  // `peer` is gone: link sends to it fail with `why`. Thread-safe.
  void fail_peer(int peer, const Error& why);

  // Closes the links (after the goodbyes). Idempotent.
  void shutdown();

 private:
  struct Route {
    // Sends hold mu shared; the switch holds it alone, so no frame passes the SWITCH.
    mutable std::shared_mutex mu;
    bool on_link = false;  // guarded by mu
    bool shared_memory = false;  // guarded by mu: the peer attached our arena
    bool decided = false;  // guarded by LinkRouter::mu_: on UCX, or staying on gRPC
  };

  void accept_offer(int peer, const pg::FrameHeader& offer);
  void switch_to_link(int peer, bool shared_memory);
  void stay_on_stream(int peer, const std::string& why);
  void mark_decided(int peer);
  void send_control(int peer, pg::FrameHeader::Kind kind);

  // UcxLinkSink (the links' progress thread).
  void on_link_frames(int source, std::vector<Frame> frames) override;
  void on_link_probe(int source, bool shared_memory) override;
  void on_link_failed(int source, const Error& why) override;

  const int rank_;
  const int size_;
  const DataPlane plane_;
  StreamSide& streams_;
  const std::string host_id_;
  std::vector<std::unique_ptr<Route>> routes_;
  std::unique_ptr<UcxLinks> links_;  // null: gRPC only
  std::mutex mu_;
  std::condition_variable decided_;
};

}  // namespace drpc
