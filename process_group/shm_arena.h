#pragma once

// Internal to //process_group: shared memory for large tensors between the processes of one
// host (the UCX links' arena bodies, ucx_link_message.h).
//
// A sender copies a tensor's bytes into a block of its arena for that peer, a System V
// segment the peer attaches, and names the block in the message's head. The receiver uses the
// block in place as the received tensor's storage and marks it released when the message's
// tensors are all gone; the sender then reuses it. One arena per peer: no peer can read or
// change what is sent to another. A 64 MiB tensor so costs one memcpy (two threads) instead of UCX's
// rendezvous and a cross-memory copy on one thread: process_vm_readv moved 3.7-4.3 GB/s here,
// memcpy into an arena 12-20 GB/s on two threads.
//
// The segment is marked for removal as soon as it is created: the kernel frees it once the
// last process that attached it detaches or exits, whatever happens to the job. Pages, once
// used, stay in memory until then. Any process of the same user may attach a segment (mode
// 0600); a receiver checks a random nonce the sender sent over the authenticated link before
// it trusts a segment to be its peer's. A process forked from a receiver shares the blocks of
// the tensors it inherited, and never gives them back (only the receiver does).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "process_group/ucx_link_message.h"  // kArenaOfferBytes

namespace drpc {

// How long ShmArena::allocate may wait for a block the receiver holds rather than use pages
// never used before: per MiB of the block and at most, in one call (one block); and per MiB of
// the block in all the calls that waited since the arena last took new pages. Each is capped
// at an hour. New pages cost about 0.9 ms per MiB here (both processes fault on each): the
// waits together stay under half of that, so a receiver that always lets go late costs a few
// waits, then new pages once.
struct ArenaReuseWait {
  std::chrono::microseconds per_mib{100};
  std::chrono::microseconds most{5000};
  std::chrono::microseconds in_all_per_mib{400};
};

// A sender's arena. allocate and the destructor are thread-safe with respect to one another
// only through the caller (the links hold it for their lifetime).
class ShmArena {
 public:
  using ReuseWait = ArenaReuseWait;

  // A segment of `size` bytes, or null with `why_not` set (no System V shared memory here, or
  // none that large).
  static std::unique_ptr<ShmArena> create(size_t size, std::string* why_not, ReuseWait reuse_wait = {});
  // Detaches. Blocks still used by receivers stay valid in their mappings.
  ~ShmArena();
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;

  // kArenaOfferBytes for a peer's ArenaMapping::attach.
  const std::string& offer() const { return offer_; }

  // The offset of a block of at least `size` bytes, or nullopt when the arena has no room for
  // it (blocks receivers still hold are not reused). The block is marked sent at once: a
  // receiver takes only blocks a message names, and the sender fills them before it sends.
  // Thread-safe. Blocks whose pages were used before come first: when only pages never used
  // would do and the receiver holds a block, this waits for a release (ReuseWait) before it
  // takes new pages. New pages cost both processes a page fault each, about 0.9 ms per MiB
  // here: a 64 MiB echo pays 60 ms for them when its reply comes back before the receiver let
  // go of the request's block, against 3 ms for the copy. Blocks sent and not yet taken are
  // not waited for: they are usually the same message's.
  std::optional<uint64_t> allocate(size_t size);
  // Gives back a block allocate() returned that was never sent; one a receiver took stays
  // theirs. Thread-safe.
  void unallocate(uint64_t offset);
  // The block at `offset` (from allocate), for the sender to fill.
  uint8_t* data(uint64_t offset) const { return base_ + offset; }

  // Bytes in blocks that are sent and not yet released (the sender's view). Thread-safe.
  size_t bytes_in_use();

 private:
  ShmArena(uint8_t* base, size_t size, std::string offer, ReuseWait reuse_wait);
  // Takes back the blocks receivers released. mu_ held.
  void reclaim();
  // Whether a receiver holds a block it may soon release. mu_ held.
  bool receiver_holds_a_block() const;

  uint8_t* const base_;
  const size_t size_;
  const std::string offer_;
  const ReuseWait reuse_wait_;
  std::mutex mu_;
  uint64_t used_end_;                  // guarded by mu_: the end of the blocks ever allocated
  std::chrono::nanoseconds waited_{0};  // guarded by mu_: in allocate, since used_end_ last grew
  std::map<uint64_t, uint64_t> free_;  // block start -> length, guarded by mu_
  std::map<uint64_t, uint64_t> sent_;  // block start -> length, guarded by mu_
};

// A receiver's view of one peer's arena. The blocks it hands out keep it attached.
class ArenaMapping : public std::enable_shared_from_this<ArenaMapping> {
 public:
  // Attaches the arena `offer` describes (kArenaOfferBytes, from the peer's probe). Returns
  // null with `why_not` set when it cannot be attached (another IPC namespace, another user) or
  // is not the one offered (its nonce differs).
  static std::shared_ptr<ArenaMapping> attach(const uint8_t* offer, size_t size, std::string* why_not);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  // The `size` bytes at `offset`, a block the peer sent: destroying the buffer marks the block
  // released. Null, with `problem` set, when no sent block holds them (the arena's bounds, the
  // block's state and its size are checked). Thread-safe.
  std::shared_ptr<uint8_t> take(uint64_t offset, uint64_t size, std::string* problem);

 private:
  ArenaMapping(uint8_t* base, size_t size) : base_(base), size_(size) {}
  uint8_t* const base_;
  const size_t size_;
};

// Copies with a helper thread for large sizes, so that a tensor's bytes reach the arena at
// two cores' memory bandwidth. The helper sleeps until a copy asks for it; a copy never waits
// for it to wake (the caller takes every chunk it has not started), only for the chunk it is
// copying (1 MiB) to end.
class ParallelCopier {
 public:
  ParallelCopier() = default;
  ~ParallelCopier();
  ParallelCopier(const ParallelCopier&) = delete;
  ParallelCopier& operator=(const ParallelCopier&) = delete;

  // memcpy(dst, src, size). Thread-safe; one copy at a time gets the helper, others copy alone
  // (as all do when no thread can be started). Does not throw.
  void copy(uint8_t* dst, const uint8_t* src, size_t size);

 private:
  struct Job {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    size_t size = 0;
    std::atomic<size_t> next{0};
  };
  static void work(Job& job);
  void helper_loop();

  std::mutex use_mu_;  // held by the copy that has the helper
  Job job_;            // the current copy's, while use_mu_ is held
  std::mutex mu_;
  std::condition_variable wake_;
  std::thread helper_;       // started by the first large copy
  uint64_t posted_ = 0;      // guarded by mu_: jobs offered to the helper
  uint64_t claimed_ = 0;     // guarded by mu_: the last job the helper took
  uint64_t closed_ = 0;      // guarded by mu_: the last job the caller finished without it
  bool stop_ = false;        // guarded by mu_
  std::atomic<bool> helper_working_{false};
};

}  // namespace drpc
