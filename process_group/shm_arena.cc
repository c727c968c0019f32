// Shared memory for large tensors between the processes of one host (shm_arena.h).

#include "process_group/shm_arena.h"

#include <sched.h>
#include <unistd.h>
#include <sys/ipc.h>
#include <sys/shm.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>


namespace drpc {
namespace {

// The arena's first bytes hold the nonce; blocks follow. Each block starts with a word its
// receiver sets when it lets go; the data follows, aligned as the links' other buffers.
constexpr uint64_t kArenaHeaderBytes = 4096;
constexpr uint64_t kBlockHeaderBytes = 64;
constexpr uint64_t kBlockAlignment = 64;
constexpr size_t kNonceBytes = 16;

// A block's state word. The sender marks a block sent before it names it in a message; the
// receiver marks it taken when a message names it, and released when the tensor using it dies.
constexpr uint32_t kBlockFree = 0;
constexpr uint32_t kBlockSent = 1;
constexpr uint32_t kBlockReleased = 2;
constexpr uint32_t kBlockTaken = 3;  // a receiver uses it

// Copies below this size are not worth waking the helper for (about 0.6 ms on one thread).
constexpr size_t kParallelCopyBytes = 4 << 20;
constexpr size_t kCopyChunkBytes = 1 << 20;

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

uint32_t* state_word(uint8_t* base, uint64_t block) { return reinterpret_cast<uint32_t*>(base + block); }
// The block's data bytes, written by the sender before it marks the block sent.
uint64_t* capacity_word(uint8_t* base, uint64_t block) { return reinterpret_cast<uint64_t*>(base + block + 8); }

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// A ReuseWait's figure as nanoseconds, at most an hour: microseconds::max() means no limit,
// and the arithmetic must not overflow.
constexpr std::chrono::hours kLongestWait{1};
std::chrono::nanoseconds to_wait(std::chrono::microseconds us) {
  if (us <= std::chrono::microseconds(0)) return std::chrono::nanoseconds(0);
  return us >= kLongestWait ? std::chrono::nanoseconds(kLongestWait) : std::chrono::nanoseconds(us);
}
std::chrono::nanoseconds scaled_wait(std::chrono::microseconds per_mib, int64_t mib) {
  if (mib <= 0 || per_mib <= std::chrono::microseconds(0)) return std::chrono::nanoseconds(0);
  if (per_mib >= std::chrono::microseconds(kLongestWait) / mib) return kLongestWait;
  return to_wait(per_mib * mib);
}

}  // namespace

std::unique_ptr<ShmArena> ShmArena::create(size_t size, std::string* why_not, ReuseWait reuse_wait) {
  size = round_up(size, kBlockAlignment);
  if (size <= kArenaHeaderBytes + kBlockHeaderBytes) {
    *why_not = "an arena of " + std::to_string(size) + " bytes holds nothing";
    return nullptr;
  }
  // SHM_NORESERVE: no swap is reserved for the whole size up front (the kernel's overcommit
  // accounting would otherwise count it all at once); pages are taken as blocks are first used.
  const int id = shmget(IPC_PRIVATE, size, IPC_CREAT | IPC_EXCL | SHM_NORESERVE | 0600);
  if (id < 0) {
    *why_not = errno_text("creating a shared memory segment of " + std::to_string(size) + " bytes");
    return nullptr;
  }
  void* base = shmat(id, nullptr, 0);
  // Removed at once: the kernel frees it when the last process attached to it detaches, and
  // peers may still attach it until then (Linux allows attaching a removed segment).
  const int saved_errno = errno;
  shmctl(id, IPC_RMID, nullptr);
  if (base == reinterpret_cast<void*>(-1)) {
    errno = saved_errno;
    *why_not = errno_text("attaching a shared memory segment");
    return nullptr;
  }
  const std::string nonce = random_link_secret();
  std::memcpy(base, nonce.data(), kNonceBytes);
  std::string offer(kArenaOfferBytes, '\0');
  const int32_t id32 = id;
  const uint64_t size64 = size;
  std::memcpy(&offer[0], &id32, sizeof(id32));
  std::memcpy(&offer[sizeof(id32)], &size64, sizeof(size64));
  std::memcpy(&offer[sizeof(id32) + sizeof(size64)], nonce.data(), kNonceBytes);
  return std::unique_ptr<ShmArena>(new ShmArena(static_cast<uint8_t*>(base), size, std::move(offer), reuse_wait));
}

ShmArena::ShmArena(uint8_t* base, size_t size, std::string offer, ReuseWait reuse_wait)
    : base_(base), size_(size), offer_(std::move(offer)), reuse_wait_(reuse_wait), used_end_(kArenaHeaderBytes) {
  free_[kArenaHeaderBytes] = size_ - kArenaHeaderBytes;
}

ShmArena::~ShmArena() { shmdt(base_); }

std::optional<uint64_t> ShmArena::allocate(size_t size) {
  if (size == 0 || size > size_) return std::nullopt;
  const uint64_t need = kBlockHeaderBytes + round_up(size, kBlockAlignment);
  using std::chrono::steady_clock;
  const int64_t mib = static_cast<int64_t>(need >> 20);
  const std::chrono::nanoseconds wait_here = std::min(to_wait(reuse_wait_.most), scaled_wait(reuse_wait_.per_mib, mib));
  const std::chrono::nanoseconds wait_in_all = scaled_wait(reuse_wait_.in_all_per_mib, mib);
  const auto start = steady_clock::now();
  bool waited_here = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    reclaim();
    // First fit: the lowest blocks are reused, whose pages are already in memory.
    auto it = std::find_if(free_.begin(), free_.end(), [&](const auto& range) { return range.second >= need; });
    if (it == free_.end()) return std::nullopt;
    const uint64_t block = it->first;
    if (block + need > used_end_ && receiver_holds_a_block()) {
      const auto now = steady_clock::now();
      const auto waited = now - start;
      if (waited < wait_here && waited_ + waited < wait_in_all) {
        waited_here = true;
        lock.unlock();  // the receiver's release needs no lock of ours, and other senders go on
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        lock.lock();
        continue;
      }
    }
    const uint64_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[block + need] = left;
    sent_[block] = need;
    if (block + need > used_end_) {
      used_end_ = block + need;
      waited_ = std::chrono::nanoseconds(0);
    } else if (waited_here) {
      waited_ += steady_clock::now() - start;
    }
    *capacity_word(base_, block) = need - kBlockHeaderBytes;
    __atomic_store_n(state_word(base_, block), kBlockSent, __ATOMIC_RELEASE);
    return block + kBlockHeaderBytes;
  }
}

bool ShmArena::receiver_holds_a_block() const {
  for (const auto& [block, length] : sent_) {
    if (__atomic_load_n(state_word(base_, block), __ATOMIC_ACQUIRE) == kBlockTaken) return true;
  }
  return false;
}

void ShmArena::unallocate(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sent_.find(offset - kBlockHeaderBytes);
  if (it == sent_.end()) return;
  // Only while no receiver has taken it: then it is theirs until they release it.
  uint32_t expected = kBlockSent;
  __atomic_compare_exchange_n(state_word(base_, it->first), &expected, kBlockReleased, false, __ATOMIC_ACQ_REL,
                              __ATOMIC_RELAXED);
  reclaim();
}

size_t ShmArena::bytes_in_use() {
  std::lock_guard<std::mutex> lock(mu_);
  reclaim();
  size_t total = 0;
  for (const auto& [block, length] : sent_) total += length;
  return total;
}

void ShmArena::reclaim() {
  for (auto it = sent_.begin(); it != sent_.end();) {
    if (__atomic_load_n(state_word(base_, it->first), __ATOMIC_ACQUIRE) != kBlockReleased) {
      ++it;
      continue;
    }
    uint64_t start = it->first;
    uint64_t length = it->second;
    __atomic_store_n(state_word(base_, start), kBlockFree, __ATOMIC_RELAXED);
    it = sent_.erase(it);
    // Merged with the free neighbours, so that large blocks form again.
    auto next = free_.lower_bound(start);
    if (next != free_.end() && start + length == next->first) {
      length += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == start) {
        previous->second += length;
        continue;
      }
    }
    free_[start] = length;
  }
}

std::shared_ptr<ArenaMapping> ArenaMapping::attach(const uint8_t* offer, size_t size, std::string* why_not) {
  if (size != kArenaOfferBytes) {
    *why_not = "an arena offer of " + std::to_string(size) + " bytes";
    return nullptr;
  }
  int32_t id;
  uint64_t arena_size;
  std::memcpy(&id, offer, sizeof(id));
  std::memcpy(&arena_size, offer + sizeof(id), sizeof(arena_size));
  const uint8_t* nonce = offer + sizeof(id) + sizeof(arena_size);
  shmid_ds info{};
  if (shmctl(id, IPC_STAT, &info) != 0) {
    *why_not = errno_text("the peer's shared memory segment " + std::to_string(id));
    return nullptr;
  }
  if (info.shm_segsz != arena_size || arena_size <= kArenaHeaderBytes) {
    *why_not = "segment " + std::to_string(id) + " has " + std::to_string(info.shm_segsz) + " bytes, not the " +
               std::to_string(arena_size) + " offered";
    return nullptr;
  }
  void* base = shmat(id, nullptr, 0);
  if (base == reinterpret_cast<void*>(-1)) {
    *why_not = errno_text("attaching the peer's shared memory segment " + std::to_string(id));
    return nullptr;
  }
  uint8_t diff = 0;
  for (size_t i = 0; i < kNonceBytes; ++i) diff |= static_cast<const uint8_t*>(base)[i] ^ nonce[i];
  if (diff != 0) {
    shmdt(base);
    *why_not = "segment " + std::to_string(id) + " is not the peer's (its nonce differs)";
    return nullptr;
  }
  return std::shared_ptr<ArenaMapping>(new ArenaMapping(static_cast<uint8_t*>(base), arena_size));
}

ArenaMapping::~ArenaMapping() { shmdt(base_); }

std::shared_ptr<uint8_t> ArenaMapping::take(uint64_t offset, uint64_t size, std::string* problem) {
  if (offset % kBlockAlignment != 0 || offset < kArenaHeaderBytes + kBlockHeaderBytes || size == 0 ||
      offset > size_ || size > size_ - offset) {
    *problem = std::to_string(size) + " bytes at " + std::to_string(offset) + " are not a block of an arena of " +
               std::to_string(size_) + " bytes";
    return nullptr;
  }
  const uint64_t block = offset - kBlockHeaderBytes;
  uint32_t* state = state_word(base_, block);
  if (__atomic_load_n(state, __ATOMIC_ACQUIRE) != kBlockSent) {
    *problem = "the block at " + std::to_string(offset) + " was not sent";
    return nullptr;
  }
  const uint64_t capacity = __atomic_load_n(capacity_word(base_, block), __ATOMIC_RELAXED);
  if (size > capacity) {
    *problem = std::to_string(size) + " bytes at " + std::to_string(offset) + " overrun a block of " +
               std::to_string(capacity);
    return nullptr;
  }
  uint32_t expected = kBlockSent;
  // Taken once: a second message naming the same block cannot release it twice.
  if (!__atomic_compare_exchange_n(state, &expected, kBlockTaken, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
    *problem = "the block at " + std::to_string(offset) + " was not sent";
    return nullptr;
  }
  // A process forked from this one shares the block, but its copy of the tensor is not the
  // one the sender waits for: only this process gives it back.
  return std::shared_ptr<uint8_t>(base_ + offset, [self = shared_from_this(), state, pid = getpid()](uint8_t*) {
    if (getpid() == pid) __atomic_store_n(state, kBlockReleased, __ATOMIC_RELEASE);
  });
}

ParallelCopier::~ParallelCopier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (helper_.joinable()) helper_.join();
}

void ParallelCopier::work(Job& job) {
  size_t at;
  while ((at = job.next.fetch_add(kCopyChunkBytes, std::memory_order_relaxed)) < job.size) {
    std::memcpy(job.dst + at, job.src + at, std::min(kCopyChunkBytes, job.size - at));
  }
}

void ParallelCopier::copy(uint8_t* dst, const uint8_t* src, size_t size) {
  if (size == 0) return;
  std::unique_lock<std::mutex> use(use_mu_, std::defer_lock);
  if (size < kParallelCopyBytes || !use.try_lock()) {
    std::memcpy(dst, src, size);
    return;
  }
  job_.dst = dst;
  job_.src = src;
  job_.size = size;
  job_.next.store(0, std::memory_order_relaxed);
  uint64_t mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!helper_.joinable()) {
      try {
        helper_ = std::thread([this] { helper_loop(); });
      } catch (const std::system_error&) {  // no thread to be had: copy alone
        use.unlock();
        std::memcpy(dst, src, size);
        return;
      }
    }
    mine = ++posted_;
  }
  wake_.notify_one();
  work(job_);
  bool helped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    helped = claimed_ == mine;
    if (!helped) closed_ = mine;  // the helper, waking late, leaves this one alone
  }
  // The helper's last chunk (at most kCopyChunkBytes) is still being copied.
  while (helped && helper_working_.load(std::memory_order_acquire)) sched_yield();
}

void ParallelCopier::helper_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || posted_ != seen; });
    if (stop_) return;
    seen = posted_;
    if (closed_ == seen) continue;
    claimed_ = seen;
    helper_working_.store(true, std::memory_order_relaxed);
    lock.unlock();
    work(job_);
    helper_working_.store(false, std::memory_order_release);
    lock.lock();
  }
}

}  // namespace drpc
