// Freed buffers for large received tensors (buffer_pool.h).

#include "process_group/buffer_pool.h"

#include <algorithm>
#include <cstdlib>

namespace drpc {

BufferPool::~BufferPool() {
  for (auto& [capacity, memory] : free_) std::free(memory);
}

std::shared_ptr<uint8_t> BufferPool::take(size_t size) {
  const size_t capacity = (std::max<size_t>(size, 1) + 4095) / 4096 * 4096;
  if (capacity < size) return nullptr;
  uint8_t* memory = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(capacity);
    if (it != free_.end() && it->first / 2 <= capacity) {  // not more than twice what is asked
      memory = it->second;
      pooled_bytes_ -= it->first;
      free_.erase(it);
    }
  }
  if (memory == nullptr) memory = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, capacity));
  if (memory == nullptr) return nullptr;
  auto pool = shared_from_this();
  return std::shared_ptr<uint8_t>(memory, [pool, capacity](uint8_t* p) { pool->give_back(p, capacity); });
}

void BufferPool::give_back(uint8_t* memory, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pooled_bytes_ + capacity <= max_pooled_bytes_) {
      free_.emplace(capacity, memory);
      pooled_bytes_ += capacity;
      return;
    }
  }
  std::free(memory);
}

}  // namespace drpc
