#pragma once

// Freed buffers for large received tensors, kept for the next ones: a fresh buffer costs a
// page fault per 4 KiB when it is first written, which for a large tensor costs about as
// much as the copy into it (a 64 MiB receive: 40 ms into fresh memory, 10 ms into reused).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace drpc {

class BufferPool final : public std::enable_shared_from_this<BufferPool> {
 public:
  static constexpr size_t kAlignment = 64;
  // What a pool keeps by default: its owner's (a rank's UCX links', a message channel's)
  // share of a process's memory held for reuse.
  static constexpr size_t kDefaultMaxPooledBytes = 256u << 20;

  // Keeps at most `max_pooled_bytes` of freed buffers. Create with make_shared: buffers
  // hold the pool, so they may outlive its owner.
  explicit BufferPool(size_t max_pooled_bytes = kDefaultMaxPooledBytes) : max_pooled_bytes_(max_pooled_bytes) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool();

  // A buffer of at least `size` bytes, aligned to kAlignment, reused when one no more than
  // twice that size is free; null when memory runs out. It returns to the pool when its
  // last user lets go. Thread-safe.
  std::shared_ptr<uint8_t> take(size_t size);

  // Bytes of freed buffers held for reuse. Thread-safe.
  size_t pooled_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return pooled_bytes_;
  }

 private:
  void give_back(uint8_t* memory, size_t capacity);

  const size_t max_pooled_bytes_;
  std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;  // capacity -> buffer; guarded by mu_
  size_t pooled_bytes_ = 0;               // guarded by mu_
};

}  // namespace drpc
