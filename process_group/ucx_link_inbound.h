#pragma once

// Internal to //process_group:ucx_links: the receiving half of one rank's UCX links. It
// takes in each head (probed, so that its buffer fits), checks it carries the sender's
// secret, posts the receives of its bodies into pooled buffers the tensors then use in
// place (or, from a peer on this host, takes them from its arena), and hands complete messages
// on in the order UCX matched their heads, holding a peer's frames until open() (the peer's
// SWITCH).

#include <ATen/core/Tensor.h>
#include <ucp/api/ucp.h>

#include <cstdint>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "process_group/transport.h"
#include "process_group/ucx_links.h"

namespace drpc {

struct InboundMessage;
class BufferPool;
class ArenaMapping;

class LinkInbound {
 public:
  // `sink` must outlive this.
  LinkInbound(int rank, int size, UcxLinkSink& sink);
  // Deletes what is left; release_requests() first while the worker lives.
  ~LinkInbound();
  LinkInbound(const LinkInbound&) = delete;
  LinkInbound& operator=(const LinkInbound&) = delete;

  // What `peer`'s messages must carry. Random per peer and process; thread-safe.
  const std::string& secret(int peer) const { return peers_.at(peer)->secret; }

  // Delivers `peer`'s held frames and those that follow. Thread-safe.
  void open(int peer);

  // UcxLinks::place_collective_frame and release_placements. Thread-safe; release waits
  // for the progress thread, so it must not be called there.
  void place(int peer, uint64_t seq, uint32_t step, const at::Tensor& dst);
  void release_placements(uint64_t seq);

  // `peer` failed: release_placements stops waiting for its bodies. Thread-safe.
  void fail(int peer);

  // Takes in the heads that arrived on `worker` and hands complete messages on. Returns
  // whether a head arrived. The progress thread only, like everything below.
  bool poll(ucp_worker_h worker);

  // Releases the UCX requests still in flight: they never complete once the progress thread
  // stopped, and the worker must not be destroyed with them.
  void release_requests();

 private:
  struct Peer {
    std::string secret;                    // const after construction
    std::deque<InboundMessage*> receiving;  // in the order UCX matched them
    std::shared_ptr<ArenaMapping> arena;    // the peer's, once its probe offered it
    std::mutex mu;
    bool open = false;                     // guarded by mu
    std::vector<std::vector<Frame>> held;  // guarded by mu
    std::mutex placement_mu;
    // Guarded by placement_mu: where collective frames' bodies go, by (seq, step); the bodies
    // being received into a placement, by seq; whether the peer failed.
    std::map<std::pair<uint64_t, uint32_t>, at::Tensor> placements;
    std::map<uint64_t, int> landing;
    bool failed = false;
    std::condition_variable landed;  // a placed body's receive ended, or the peer failed
  };

  // A body's destination: a placement, with what to run once its receive ends; or null for
  // the pool.
  struct BodyDestination {
    std::shared_ptr<uint8_t> buffer;
    std::function<void()> on_end;
  };

  void receive(ucp_worker_h worker, ucp_tag_message_h message, const ucp_tag_recv_info_t& info);
  void post_bodies(ucp_worker_h worker, InboundMessage& message, Peer& link);
  // A kFramesWithArenaBodies message's bodies: blocks of the peer's arena, used in place.
  void take_arena_bodies(InboundMessage& message, Peer& link);
  // Attaches the arena a probe offers, unless one is attached; returns whether one is.
  bool attach_arena(int source, const uint8_t* offer);
  // Where `message`'s bodies land: their placements where the frames were placed (each
  // counted in link.landing until its on_end runs), null for the others.
  std::vector<BodyDestination> placed_buffers(const InboundMessage& message, Peer& link);
  void drain(ucp_worker_h worker, int source);
  void hand_on(int source, InboundMessage& message);
  void fail_source(int source, const std::string& problem);
  void drop_strays();

  const int rank_;
  const int size_;
  UcxLinkSink& sink_;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::unordered_set<InboundMessage*> strays_;  // from no known peer, received only to be dropped
  const std::shared_ptr<BufferPool> pool_;
};

}  // namespace drpc
