// The receiving half of a rank's UCX links (ucx_link_inbound.h).

#include "process_group/ucx_link_inbound.h"

#include <glog/logging.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>

#include "common/wake_batch.h"
#include "process_group/buffer_pool.h"
#include "process_group/shm_arena.h"
#include "process_group/ucx_link_message.h"

namespace drpc {
namespace {

constexpr size_t kAlignment = BufferPool::kAlignment;
constexpr ucp_tag_t kExactTag = ~ucp_tag_t{0};

// How long release_placements waits for a live peer's body to land before it gives up.
constexpr auto kLandingWait = std::chrono::seconds(10);

// A receive into one body's buffer.
struct BodyReceive {
  std::shared_ptr<uint8_t> buffer;
  size_t size = 0;
  ucp_tag_recv_info_t info{};
  void* request = nullptr;  // UCX's, while in flight
  bool done = false;
  bool ok = false;
  std::function<void()> on_end;  // a body received into a placement: tells its link

  // The receive ended: whole, or not (failed, or given up once nothing progresses it).
  void end(bool whole) {
    ok = whole;
    done = true;
    if (on_end) {
      auto tell = std::move(on_end);
      on_end = nullptr;
      tell();
    }
  }
};

// What keeps a received message's bytes alive while any of its tensors is in use.
struct MessageBuffers {
  std::shared_ptr<uint8_t> head;
  std::vector<std::shared_ptr<uint8_t>> bodies;
};

}  // namespace

// A received message: its head, then its bodies.
struct InboundMessage {
  int source;
  std::shared_ptr<uint8_t> buffer;
  size_t size;
  void* request = nullptr;  // UCX's, while in flight
  bool done = false;
  bool ok = false;
  bool parsed = false;  // once the head is done: `valid`, `message`, `problem` and `bodies` are set
  bool valid = false;
  LinkMessage message;
  std::string problem;
  std::vector<BodyReceive> bodies;  // sized before the first is posted

  bool complete() const {
    if (!done || !parsed) return false;
    for (const auto& body : bodies) {
      if (!body.done) return false;
    }
    return true;
  }
  void release_requests() {
    if (!done && request != nullptr) ucp_request_free(request);
    for (auto& body : bodies) {
      if (body.done) continue;
      if (body.request != nullptr) ucp_request_free(body.request);
      body.end(false);  // nothing writes its buffer once the progress thread stopped
    }
  }
};

LinkInbound::LinkInbound(int rank, int size, UcxLinkSink& sink)
    : rank_(rank), size_(size), sink_(sink), pool_(std::make_shared<BufferPool>()) {
  for (int r = 0; r < size; ++r) {
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->secret = random_link_secret();
  }
}

LinkInbound::~LinkInbound() {
  for (auto& peer : peers_) {
    for (InboundMessage* message : peer->receiving) delete message;
  }
  for (InboundMessage* message : strays_) delete message;
}

void LinkInbound::open(int peer) {
  Peer& link = *peers_.at(peer);
  std::lock_guard<std::mutex> lock(link.mu);
  link.open = true;
  for (auto& frames : link.held) sink_.on_link_frames(peer, std::move(frames));
  link.held.clear();
}

bool LinkInbound::poll(ucp_worker_h worker) {
  bool arrived = false;
  ucp_tag_recv_info_t info;
  // Heads only: a body waits, unexpected, until its head asks for it by its tag.
  while (ucp_tag_message_h message = ucp_tag_probe_nb(worker, 0, kLinkBodyTagBit, /*remove=*/1, &info)) {
    arrived = true;
    receive(worker, message, info);
  }
  for (int r = 0; r < size_; ++r) {
    if (!peers_[r]->receiving.empty()) drain(worker, r);
  }
  if (!strays_.empty()) drop_strays();
  return arrived;
}

void LinkInbound::release_requests() {
  for (auto& peer : peers_) {
    for (InboundMessage* message : peer->receiving) message->release_requests();
  }
  for (InboundMessage* message : strays_) message->release_requests();
}

void LinkInbound::receive(ucp_worker_h worker, ucp_tag_message_h message, const ucp_tag_recv_info_t& info) {
  auto* in = new InboundMessage;
  in->source = info.sender_tag < static_cast<ucp_tag_t>(size_) ? static_cast<int>(info.sender_tag) : -1;
  in->size = info.length;
  const size_t capacity = (std::max<size_t>(in->size, 1) + kAlignment - 1) / kAlignment * kAlignment;
  auto* memory = capacity >= in->size ? static_cast<uint8_t*>(std::aligned_alloc(kAlignment, capacity)) : nullptr;
  if (memory == nullptr) {
    // A length no one could send honestly: take the message in truncated, and drop it.
    in->source = -1;
    in->size = 1;
    memory = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, kAlignment));
  }
  in->buffer.reset(memory, [](uint8_t* p) { std::free(p); });
  if (in->source >= 0 && in->source != rank_) {
    peers_[in->source]->receiving.push_back(in);
  } else {
    strays_.insert(in);
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv = [](void* request, ucs_status_t status, const ucp_tag_recv_info_t*, void* user_data) {
    auto* in = static_cast<InboundMessage*>(user_data);
    ucp_request_free(request);
    in->ok = status == UCS_OK;
    in->done = true;
  };
  param.user_data = in;
  const ucs_status_ptr_t request = ucp_tag_msg_recv_nbx(worker, in->buffer.get(), in->size, message, &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    in->ok = request == nullptr;
    in->done = true;
  } else {
    in->request = request;  // callbacks run on this thread, in progress: not yet
  }
}

void LinkInbound::place(int peer, uint64_t seq, uint32_t step, const at::Tensor& dst) {
  if (peer < 0 || peer >= size_ || peer == rank_) return;
  Peer& link = *peers_[peer];
  std::lock_guard<std::mutex> lock(link.placement_mu);
  if (!link.failed) link.placements[{seq, step}] = dst;
}

void LinkInbound::release_placements(uint64_t seq) {
  const auto deadline = std::chrono::steady_clock::now() + kLandingWait;
  for (int r = 0; r < size_; ++r) {
    Peer& peer = *peers_[r];
    std::unique_lock<std::mutex> lock(peer.placement_mu);
    auto& placements = peer.placements;
    placements.erase(placements.begin(), placements.upper_bound({seq, UINT32_MAX}));
    const auto settled = [&] { return peer.failed || peer.landing.empty() || peer.landing.begin()->first > seq; };
    if (!peer.landed.wait_until(lock, deadline, settled)) {
      LOG(WARNING) << "rank " << rank_ << ": a body from rank " << r << " was still landing in a tensor of collective "
                   << peer.landing.begin()->first << " " << kLandingWait.count()
                   << " s after the collective ended; the tensor may still change";
      // Not waited for again: later collectives would each wait as long for it.
      peer.landing.erase(peer.landing.begin(), peer.landing.upper_bound(seq));
    }
  }
}

void LinkInbound::fail(int peer) {
  if (peer < 0 || peer >= size_) return;
  Peer& link = *peers_[peer];
  std::lock_guard<std::mutex> lock(link.placement_mu);
  link.failed = true;
  link.placements.clear();  // a peer declared failed may still be sending: nothing of it lands in place now
  link.landed.notify_all();
}

std::vector<LinkInbound::BodyDestination> LinkInbound::placed_buffers(const InboundMessage& in, Peer& link) {
  std::vector<BodyDestination> buffers(in.message.bodies.size());
  {
    std::lock_guard<std::mutex> lock(link.placement_mu);
    if (link.placements.empty()) return buffers;
  }
  // Bodies whose frames cannot be told from the head go to the pool; decoding then fails them.
  std::vector<LinkBodyOwner> owners;
  if (!link_body_owners(in.message, &owners)) return buffers;
  std::lock_guard<std::mutex> lock(link.placement_mu);
  for (size_t i = 0; i < owners.size(); ++i) {
    const LinkBodyOwner& owner = owners[i];
    if (owner.kind != pg::FrameHeader::COLLECTIVE || owner.tensor != 0) continue;
    auto it = link.placements.find({owner.seq, owner.step});
    if (it == link.placements.end()) continue;
    at::Tensor dst = std::move(it->second);
    link.placements.erase(it);
    if (dst.nbytes() != in.message.bodies[i].size || !dst.is_contiguous()) continue;  // the frame's check fails it
    // The frame's keepalive holds the destination tensor alive, whatever its owner does.
    buffers[i].buffer = std::shared_ptr<uint8_t>(static_cast<uint8_t*>(dst.data_ptr()), [dst](uint8_t*) {});
    ++link.landing[owner.seq];  // here, under the lock that release_placements checks it under
    buffers[i].on_end = [&link, seq = owner.seq] {
      std::lock_guard<std::mutex> lock(link.placement_mu);
      auto it = link.landing.find(seq);
      if (it != link.landing.end() && --it->second == 0) link.landing.erase(it);
      link.landed.notify_all();
    };
  }
  return buffers;
}

void LinkInbound::post_bodies(ucp_worker_h worker, InboundMessage& in, Peer& link) {
  in.parsed = true;
  if (!in.ok) return;
  in.valid = parse_link_message(in.buffer.get(), in.size, link.secret, &in.message, &in.problem);
  if (!in.valid) return;
  if (in.message.type == LinkMessageType::kFramesWithArenaBodies) return take_arena_bodies(in, link);
  in.bodies.resize(in.message.bodies.size());
  std::vector<BodyDestination> placed = placed_buffers(in, link);
  for (size_t i = 0; i < in.bodies.size(); ++i) {
    BodyReceive& body = in.bodies[i];
    body.size = in.message.bodies[i].size;
    body.on_end = std::move(placed[i].on_end);
    body.buffer = placed[i].buffer != nullptr ? std::move(placed[i].buffer) : pool_->take(body.size);
    if (body.buffer == nullptr) {
      // Its bytes stay unexpected in UCX; the peer is failed for a body no one can hold.
      in.valid = false;
      in.problem = "no memory for a body of " + std::to_string(body.size) + " bytes";
      body.done = true;
      continue;
    }
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
    param.cb.recv = [](void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
      auto* body = static_cast<BodyReceive*>(user_data);
      ucp_request_free(request);
      body->info = *info;
      body->end(status == UCS_OK);
    };
    param.user_data = &body;
    param.recv_info.tag_info = &body.info;
    const ucs_status_ptr_t request =
        ucp_tag_recv_nbx(worker, body.buffer.get(), body.size, in.message.bodies[i].tag, kExactTag, &param);
    if (request == nullptr || UCS_PTR_IS_ERR(request)) {
      body.end(request == nullptr);
    } else {
      body.request = request;
    }
  }
}

void LinkInbound::take_arena_bodies(InboundMessage& in, Peer& link) {
  in.bodies.resize(in.message.bodies.size());
  // Each body must be one whole tensor of its frame: the sender can still write its arena,
  // so no header may be read from there.
  std::vector<LinkBodyOwner> owners;
  if (!link_body_owners(in.message, &owners)) {
    in.valid = false;
    in.problem = "its arena bodies are not whole tensors of its frames";
  }
  for (size_t i = 0; i < in.bodies.size(); ++i) {
    BodyReceive& body = in.bodies[i];
    body.size = in.message.bodies[i].size;
    body.info.length = body.size;
    std::string problem = "its probe offered no arena";
    if (link.arena != nullptr && in.valid) body.buffer = link.arena->take(in.message.bodies[i].tag, body.size, &problem);
    if (body.buffer == nullptr && in.valid) {
      in.valid = false;
      in.problem = "body " + std::to_string(i) + " is not in the sender's arena: " + problem;
    }
    body.end(body.buffer != nullptr);
  }
}

bool LinkInbound::attach_arena(int source, const uint8_t* offer) {
  Peer& link = *peers_[source];
  if (link.arena != nullptr) return true;
  std::string why_not;
  link.arena = ArenaMapping::attach(offer, kArenaOfferBytes, &why_not);
  if (link.arena == nullptr) {
    VLOG(1) << "rank " << rank_ << ": large tensors from rank " << source << " stay off shared memory: " << why_not;
  }
  return link.arena != nullptr;
}

void LinkInbound::drain(ucp_worker_h worker, int source) {
  Peer& link = *peers_[source];
  for (InboundMessage* in : link.receiving) {
    if (in->done && !in->parsed) post_bodies(worker, *in, link);
  }
  // The threads these messages hand work to wake once, when they all are delivered; a
  // body still being copied in (which can take milliseconds) is outside the batch.
  WakeBatch wakes;
  while (!link.receiving.empty() && link.receiving.front()->complete()) {
    std::unique_ptr<InboundMessage> in(link.receiving.front());
    link.receiving.pop_front();
    if (in->ok) hand_on(source, *in);
  }
}

void LinkInbound::hand_on(int source, InboundMessage& in) {
  Peer& link = *peers_[source];
  if (!in.valid) {
    if (in.size >= kLinkPrefixBytes && starts_with_link_secret(in.buffer.get(), link.secret)) {
      fail_source(source, in.problem);
    } else {
      LOG(WARNING) << "rank " << rank_ << ": dropped a UCX message claiming to be from rank " << source << ": "
                   << in.problem;
    }
    return;
  }
  if (in.message.type == LinkMessageType::kProbe) {
    sink_.on_link_probe(source, in.message.arena_offer != nullptr && attach_arena(source, in.message.arena_offer));
    return;
  }
  auto buffers = std::make_shared<MessageBuffers>();
  buffers->head = in.buffer;
  std::vector<ByteSpan> bodies;
  std::string problem;
  for (size_t i = 0; i < in.bodies.size() && problem.empty(); ++i) {
    const BodyReceive& body = in.bodies[i];
    if (!body.ok || body.info.length != body.size) problem = "body " + std::to_string(i) + " did not arrive whole";
    bodies.push_back(ByteSpan{body.buffer.get(), body.size});
    buffers->bodies.push_back(body.buffer);
  }
  std::vector<Frame> frames;
  if (!problem.empty() || !link_message_frames(in.message, bodies, buffers, source, &frames, &problem)) {
    fail_source(source, problem);
    return;
  }
  std::lock_guard<std::mutex> lock(link.mu);
  if (link.open) {
    sink_.on_link_frames(source, std::move(frames));
  } else {
    link.held.push_back(std::move(frames));
  }
}

void LinkInbound::fail_source(int source, const std::string& problem) {
  sink_.on_link_failed(source, Error(ErrorKind::kProtocol,
                                     "rank " + std::to_string(source) + " sent a malformed link message: " + problem));
}

void LinkInbound::drop_strays() {
  for (auto it = strays_.begin(); it != strays_.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    LOG(WARNING) << "rank " << rank_ << ": dropped a UCX message with an unknown sender";
    delete *it;
    it = strays_.erase(it);
  }
}

}  // namespace drpc
