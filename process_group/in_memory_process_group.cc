#include "process_group/in_memory_process_group.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <variant>

#include "process_group/collective_process_group.h"
#include "process_group/frame.h"

namespace drpc {
namespace {

// The queues between ranks. Each rank has a delivery thread, so a sender never runs the
// receiver's code (as with a real network).
class Fabric : public std::enable_shared_from_this<Fabric> {
 public:
  explicit Fabric(int size) : inboxes_(size) {
    for (auto& inbox : inboxes_) inbox = std::make_unique<Inbox>();
  }

  void attach(int rank, FrameSink* sink) {
    Inbox& inbox = *inboxes_[rank];
    std::lock_guard<std::mutex> lock(inbox.mu);
    inbox.sink = sink;
    inbox.alive = true;
    inbox.thread = std::thread([this, rank] { deliver_loop(rank); });
  }

  void post(int from, int to, Frame frame) {
    Inbox& inbox = *inboxes_[to];
    {
      std::lock_guard<std::mutex> lock(inbox.mu);
      if (!inbox.alive) {
        throw Error(ErrorKind::kPeerUnavailable, "rank " + std::to_string(to) + " is gone");
      }
      frame.source = from;
      inbox.items.emplace_back(std::move(frame));
    }
    inbox.cv.notify_all();
  }

  // `rank` leaves: its thread stops, the others learn of it.
  void leave(int rank) {
    Inbox& inbox = *inboxes_[rank];
    {
      std::lock_guard<std::mutex> lock(inbox.mu);
      if (!inbox.alive) return;
      inbox.alive = false;
    }
    inbox.cv.notify_all();
    if (inbox.thread.joinable()) inbox.thread.join();
    for (size_t r = 0; r < inboxes_.size(); ++r) {
      if (static_cast<int>(r) == rank) continue;
      Inbox& other = *inboxes_[r];
      {
        std::lock_guard<std::mutex> lock(other.mu);
        if (!other.alive) continue;
        other.items.emplace_back(rank);
      }
      other.cv.notify_all();
    }
  }

  int size() const { return static_cast<int>(inboxes_.size()); }

  // Transport::place_collective_frame, for `to`'s frames from `from`.
  void place(int to, int from, uint64_t seq, uint32_t step, const at::Tensor& dst) {
    Inbox& inbox = *inboxes_[to];
    std::lock_guard<std::mutex> lock(inbox.mu);
    inbox.placements[{from, seq, step}] = dst;
  }
  void release_placements(int to, uint64_t seq) {
    Inbox& inbox = *inboxes_[to];
    std::lock_guard<std::mutex> lock(inbox.mu);
    for (auto it = inbox.placements.begin(); it != inbox.placements.end();) {
      it = std::get<1>(it->first) <= seq ? inbox.placements.erase(it) : std::next(it);
    }
  }
  // Where the frame `header` from `from` to `to` holding `nbytes` belongs, if `to` said so
  // (undefined otherwise); the placement is used up.
  at::Tensor take_placement(int to, int from, const pg::FrameHeader& header, size_t nbytes) {
    if (header.kind() != pg::FrameHeader::COLLECTIVE || nbytes == 0) return at::Tensor();
    Inbox& inbox = *inboxes_[to];
    std::lock_guard<std::mutex> lock(inbox.mu);
    auto it = inbox.placements.find({from, header.seq(), header.step()});
    if (it == inbox.placements.end()) return at::Tensor();
    at::Tensor dst = std::move(it->second);
    inbox.placements.erase(it);
    return dst.nbytes() == nbytes ? dst : at::Tensor();
  }

 private:
  struct Inbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::variant<Frame, int>> items;  // a frame, or the rank that left
    FrameSink* sink = nullptr;
    bool alive = false;
    std::thread thread;
    std::map<std::tuple<int, uint64_t, uint32_t>, at::Tensor> placements;  // (from, seq, step)
  };

  void deliver_loop(int rank) {
    Inbox& inbox = *inboxes_[rank];
    while (true) {
      std::variant<Frame, int> item;
      {
        std::unique_lock<std::mutex> lock(inbox.mu);
        inbox.cv.wait(lock, [&] { return !inbox.alive || !inbox.items.empty(); });
        if (!inbox.alive) return;
        item = std::move(inbox.items.front());
        inbox.items.pop_front();
      }
      if (auto* frame = std::get_if<Frame>(&item)) {
        inbox.sink->on_frame(std::move(*frame));
      } else {
        const int gone = std::get<int>(item);
        inbox.sink->on_peer_failed(gone,
                                   Error(ErrorKind::kPeerUnavailable, "rank " + std::to_string(gone) + " shut down"));
      }
    }
  }

  std::vector<std::unique_ptr<Inbox>> inboxes_;
};

class InMemoryTransport final : public Transport {
 public:
  InMemoryTransport(std::shared_ptr<Fabric> fabric, int rank, FrameSink& sink)
      : fabric_(std::move(fabric)), rank_(rank) {
    fabric_->attach(rank, &sink);
  }
  ~InMemoryTransport() override { shutdown(); }

  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }

  std::string link_to(int rank) const override {
    check_rank_in_world(rank, size());
    return rank == rank_ ? "self" : "memory";
  }

  void send(int dst, const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors,
            std::function<void(std::exception_ptr)> on_sent) override {
    // Copies, as the wire would: the sender may change its tensors once on_sent runs. A
    // placed frame's tensor is copied into its destination at once, as early as any link
    // could write it there, so that the collectives' tests see a placement used too soon.
    auto copies = std::make_shared<std::vector<at::Tensor>>();
    checked_header_size(header, tensors);  // what the wire refuses, this refuses too
    Frame frame;
    frame.header = header;
    frame.tensors = frame_tensors(tensors);
    at::Tensor placed =
        tensors.size() == 1 ? fabric_->take_placement(dst, rank_, header, tensors[0].nbytes()) : at::Tensor();
    for (const auto& t : tensors) {
      if (placed.defined()) {
        std::memcpy(placed.data_ptr(), t.data_ptr(), t.nbytes());
        copies->push_back(placed);
      } else {
        copies->push_back(t.clone());
      }
      if (t.nbytes() > 0)
        frame.body.push_back(ByteSpan{static_cast<const uint8_t*>(copies->back().data_ptr()), t.nbytes()});
    }
    frame.keepalive = copies;
    fabric_->post(rank_, dst, std::move(frame));
    if (on_sent) on_sent(nullptr);
  }

  void place_collective_frame(int src, uint64_t seq, uint32_t step, const at::Tensor& dst) override {
    fabric_->place(rank_, src, seq, step, dst);
  }
  void release_placements(uint64_t seq) override { fabric_->release_placements(rank_, seq); }

  void shutdown() override { fabric_->leave(rank_); }

 private:
  std::shared_ptr<Fabric> fabric_;
  const int rank_;
};

}  // namespace

std::vector<GroupEndpoints> create_in_memory_process_groups(int size) {
  auto fabric = std::make_shared<Fabric>(size);
  std::vector<GroupEndpoints> groups;
  for (int r = 0; r < size; ++r) {
    groups.push_back(create_collective_process_group(
        [&](FrameSink& sink) { return std::make_unique<InMemoryTransport>(fabric, r, sink); }, CollectiveOptions{}));
  }
  return groups;
}

}  // namespace drpc
