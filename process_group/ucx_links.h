#pragma once

// Internal to //process_group: UCX links beside the gRPC streams (the data plane). One UCX
// worker per rank, progressed by one thread that sleeps on the worker's event fd; one
// endpoint per peer that switched to UCX. The gRPC transport decides when a pair switches
// and keeps the connection's rules (hello, heartbeats, goodbye); this only moves frames.
//
// Messages carry the secret the receiver handed its peer over the authenticated gRPC stream
// (ucx_link_message.h): UCX checks no token, so a message without the right secret is
// dropped and logged, never decoded. Large tensors travel as messages of their own, which UCX
// moves with zero copies into buffers the receiving tensors then use in place; between
// processes of one host, those of RPC messages and point-to-point sends go through the
// sender's shared-memory arena instead (shm_arena.h), which the receiving tensors use in place.

#include <ATen/core/Tensor.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "process_group/data_plane.h"
#include "process_group/proto/frame.pb.h"
#include "process_group/transport.h"
#include "process_group/ucx_link_message.h"

namespace drpc {

// Where the links deliver what arrives. Called on the progress thread, in order per source;
// must not block for long.
class UcxLinkSink {
 public:
  virtual ~UcxLinkSink() = default;
  // Frames from `source`, validated, in the order it sent them (once open_inbound(source)).
  virtual void on_link_frames(int source, std::vector<Frame> frames) = 0;
  // `source` reached us with a probe: its link to us works. `shared_memory`: it offered its
  // arena and we attached it, so its large tensors may come through shared memory.
  virtual void on_link_probe(int source, bool shared_memory) = 0;
  // `source` sent malformed frames with the right secret (or its link broke): it is lost.
  virtual void on_link_failed(int source, const Error& why) = 0;
};

class UcxLinks {
 public:
  UcxLinks() = default;
  UcxLinks(const UcxLinks&) = delete;
  UcxLinks& operator=(const UcxLinks&) = delete;
  virtual ~UcxLinks() = default;

  // This worker's UCX address, for peers' connect().
  virtual std::string address() const = 0;
  // The secret `peer` must put in every message to us. Random per peer and per process.
  virtual std::string inbound_secret(int peer) const = 0;

  // Opens the link to `peer` (its address and the secret it gave us) and sends it a probe,
  // which offers our arena when `same_host`. Thread-safe. Throws kPeerUnavailable saying why
  // the link cannot be opened.
  virtual void connect(int peer, const std::string& address, const std::string& secret, bool same_host) = 0;

  // `peer` attached our arena (its LINK_READY says so): large tensors of messages to it go
  // through shared memory from now on, while the arena has room. Thread-safe.
  virtual void use_shared_memory(int peer) = 0;

  // Frames from `peer` arriving before this are held, and delivered (in order) by this call:
  // the peer switched after its last frame on the other link. Thread-safe.
  virtual void open_inbound(int peer) = 0;

  // As Transport::send, on the link to `peer` (connect()ed). Thread-safe; frames to one
  // peer arrive in order. Throws kPeerUnavailable once the peer failed, kShutdown after shutdown.
  virtual void send(int peer, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
                    std::function<void(std::exception_ptr)> on_sent) = 0;

  // As Transport::place_collective_frame and release_placements, for frames from `peer`'s
  // link: its bodies are received straight into their destinations. Thread-safe.
  virtual void place_collective_frame(int peer, uint64_t seq, uint32_t step, const at::Tensor& dst) = 0;
  virtual void release_placements(uint64_t seq) = 0;

  // Bytes of our arena that sent messages hold until their receivers let go of the tensors
  // (0 without an arena). Thread-safe.
  virtual size_t shared_memory_in_use() = 0;

  // The peer is gone: sends still in flight to it fail with `why` now, later ones throw it,
  // and release_placements no longer waits for its frames.
  virtual void fail_peer(int peer, const Error& why) = 0;

  // Stops the progress thread, closes the links (waiting briefly for sends in flight) and
  // fails what is left. The sink receives nothing afterwards. Idempotent.
  virtual void shutdown() = 0;
};

// The size of the arena for each peer on this host: memory is taken only as blocks are first
// used, and a message whose tensors do not fit goes the UCX way, so this bounds what a peer's
// received tensors hold of this process's memory, not what it can send.
constexpr size_t kDefaultArenaBytes = size_t{512} << 20;

// Creates the links for `rank` of `size` (`plane` kAuto: shared-memory transports only;
// kUcx: all of UCX's), with an arena of `arena_bytes` per peer on this host (0: none). `sink` must outlive the
// links. Returns null and sets `why_not` when UCX cannot start here.
std::unique_ptr<UcxLinks> create_ucx_links(int rank, int size, DataPlane plane, UcxLinkSink& sink,
                                           std::string* why_not, size_t arena_bytes = kDefaultArenaBytes);

}  // namespace drpc
