#pragma once

// Internal to //process_group: runs one rank's collectives one at a time, in call order,
// on its own thread: the sequence-numbered frames of each collective (checked against
// this rank's call), its deadline, and the abort protocol that tells the peers when a
// collective failed here. What each collective sends is in collective_algorithms.cc.

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "process_group/transport.h"
#include "process_group/work.h"

namespace drpc {

enum CollectiveType : int32_t { kBroadcast = 1, kAllreduce = 2, kAllgather = 3, kBarrier = 4 };

const char* collective_name(int32_t type);

// What every rank must agree on for one collective call (carried by each of its frames).
struct Descriptor {
  int32_t type = 0;
  int32_t reduce_op = 0;
  int32_t root = -1;
  pg::TensorMeta full;

  void write(pg::FrameHeader* header) const;
  std::string describe() const;
  // How `h`, a peer's frame, describes its call, worded for a mismatch error.
  std::string describe_header(const pg::FrameHeader& h) const;
  bool matches(const pg::FrameHeader& h) const;
};

class CollectiveRunner;

// One collective while it runs on the runner's thread; used by that thread only.
class CollectiveCall {
 public:
  CollectiveCall(CollectiveRunner& runner, uint64_t seq, const Descriptor& desc,
                 std::chrono::steady_clock::time_point deadline);
  CollectiveCall(const CollectiveCall&) = delete;
  CollectiveCall& operator=(const CollectiveCall&) = delete;

  int rank() const;
  int size() const;
  // Names the call in errors, e.g. "allreduce #3 (Float[4] SUM)".
  std::string what() const;
  // Every other rank, starting at `first` and wrapping around (spreads the load).
  std::vector<int> peers_from(int first) const;

  // Queues `chunk` (undefined: an empty frame) for `dst`. Its bytes are read until
  // flush() returns, so the caller must not change them before. Throws what the
  // transport throws, naming the call.
  void send(int dst, const at::Tensor& chunk);
  // Asks that the `nth` frame (from 0) this call receives from `src`, which must carry one
  // tensor of dst's bytes, land straight in `dst` (contiguous) when the link can do that; its
  // recv() then returns a frame whose body is dst's memory, and copy_body into dst copies
  // nothing. Until that frame is received or the call ends, the link may write dst at any
  // time: this rank must neither read nor write those bytes meanwhile. A hint; never throws.
  void place(int src, uint32_t nth, const at::Tensor& dst);
  // Waits until every frame sent so far has been written; rethrows a failed write, or
  // kTimeout past the deadline.
  void flush();
  // The next frame of this collective from `src`, checked against this rank's call:
  // throws kMismatch, kTimeout, kPeerUnavailable, kShutdown, or a peer's abort.
  Frame recv(int src);

 private:
  // Shared with the transport's completion callbacks, which may outlive the call.
  struct Sends {
    std::mutex mu;
    std::condition_variable cv;
    int pending = 0;
    std::exception_ptr error;
  };

  CollectiveRunner& runner_;
  const uint64_t seq_;
  const Descriptor desc_;
  const std::chrono::steady_clock::time_point deadline_;
  std::shared_ptr<Sends> sends_ = std::make_shared<Sends>();
  std::vector<uint32_t> sent_to_;  // frames sent to each rank: the next one's step
  bool placed_ = false;            // place() was called: the runner releases the placements
  friend class CollectiveRunner;
};

// Thread-safe. Lifecycle: construct, attach(transport), collectives, close(), join().
class CollectiveRunner {
 public:
  // What a collective does on its call; returns the Work's result. Throwing fails the
  // collective here and aborts it on the peers.
  using Body = std::function<std::vector<at::Tensor>(CollectiveCall&)>;

  // `timeout`: each collective's deadline, counted from when it starts running.
  explicit CollectiveRunner(std::chrono::milliseconds timeout);
  // Joins the thread if join() was not called.
  ~CollectiveRunner();
  CollectiveRunner(const CollectiveRunner&) = delete;
  CollectiveRunner& operator=(const CollectiveRunner&) = delete;

  // Sends through `transport` (borrowed; must outlive join()) and starts the thread. Once.
  void attach(Transport& transport);
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Queues a collective behind the others; the Work completes when `body` returns on the
  // runner's thread, or fails with its error (kShutdown once closed). Never throws.
  WorkPtr enqueue(const Descriptor& desc, Body body);

  // A COLLECTIVE or ABORT frame (transport threads). Never throws.
  void on_frame(Frame frame);
  // `peer` is gone: collectives waiting on it fail. Once per peer (transport threads).
  void on_peer_failed(int peer, const Error& reason);

  // Stops taking collectives and wakes the running one (it fails with kShutdown).
  // Idempotent; does not block.
  void close();
  // After close() and the transport's shutdown: joins the thread and fails the queued
  // collectives with kShutdown. Idempotent.
  void join();

 private:
  friend class CollectiveCall;
  using Clock = std::chrono::steady_clock;

  struct Task {
    uint64_t seq;
    Descriptor desc;
    WorkPtr work;
    Body body;
  };

  void loop();
  void abort_collective(uint64_t seq, const Error& error);
  Frame wait_frame(int src, uint64_t seq, Clock::time_point deadline, const CollectiveCall& call);
  bool is_dead(int peer);

  const std::chrono::milliseconds timeout_;
  Transport* transport_ = nullptr;  // set by attach(), before the thread starts
  // Set by attach(), but the transport's callbacks can run before: atomics.
  std::atomic<int> rank_{-1};
  std::atomic<int> size_{0};
  std::thread thread_;

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  bool shut_down_ = false;
  uint64_t next_seq_ = 0;
  uint64_t finished_seq_ = 0;
  std::deque<Task> tasks_;
  std::map<std::pair<int, uint64_t>, std::deque<Frame>> inbox_;  // (source, seq)
  std::map<uint64_t, Error> aborted_;  // collective seq -> why a peer gave up
  std::map<int, Error> dead_;          // peer rank -> why it is gone
};

}  // namespace drpc
