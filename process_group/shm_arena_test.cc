// The shared-memory arena on its own: blocks sent, taken and released, reuse, the checks on
// what a receiver is told, and the parallel copy. One test attaches from a forked process.

#include "process_group/shm_arena.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

namespace drpc {
namespace {

constexpr size_t kMiB = 1 << 20;

struct ArenaAndMapping {
  std::unique_ptr<ShmArena> arena;
  std::shared_ptr<ArenaMapping> mapping;

  explicit ArenaAndMapping(size_t size, ShmArena::ReuseWait reuse_wait = {}) {
    std::string why;
    arena = ShmArena::create(size, &why, reuse_wait);
    if (!arena) throw std::runtime_error("no arena: " + why);
    mapping = ArenaMapping::attach(reinterpret_cast<const uint8_t*>(arena->offer().data()), arena->offer().size(), &why);
    if (!mapping) throw std::runtime_error("no mapping: " + why);
  }
};

std::vector<uint8_t> pattern(size_t size, uint8_t seed) {
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + seed);
  return bytes;
}

TEST(ShmArena, ABlockIsSeenByTheReceiverAndReusedOnceReleased) {
  ArenaAndMapping pair(16 * kMiB);
  const auto bytes = pattern(kMiB + 3, 7);
  const auto block = pair.arena->allocate(bytes.size());
  ASSERT_TRUE(block.has_value());
  std::memcpy(pair.arena->data(*block), bytes.data(), bytes.size());
  std::string problem;
  auto taken = pair.mapping->take(*block, bytes.size(), &problem);
  ASSERT_NE(taken, nullptr) << problem;
  EXPECT_NE(taken.get(), pair.arena->data(*block));  // the receiver's own mapping
  EXPECT_EQ(std::memcmp(taken.get(), bytes.data(), bytes.size()), 0);
  EXPECT_GE(pair.arena->bytes_in_use(), bytes.size());
  taken.reset();
  EXPECT_EQ(pair.arena->bytes_in_use(), 0u);
  EXPECT_EQ(pair.arena->allocate(bytes.size()), block);  // the same block, its pages already in memory
}

TEST(ShmArena, AFullArenaRefusesUntilBlocksAreReleasedAndMerges) {
  ArenaAndMapping pair(4 * kMiB);
  std::vector<uint64_t> blocks;
  for (int i = 0; i < 3; ++i) {
    const auto block = pair.arena->allocate(kMiB);
    ASSERT_TRUE(block.has_value());
    blocks.push_back(*block);
  }
  EXPECT_FALSE(pair.arena->allocate(2 * kMiB).has_value());
  EXPECT_FALSE(pair.arena->allocate(5 * kMiB).has_value());
  std::string problem;
  auto first = pair.mapping->take(blocks[0], kMiB, &problem);
  auto second = pair.mapping->take(blocks[1], kMiB, &problem);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(pair.arena->allocate(2 * kMiB).has_value());  // taken is not released
  first.reset();
  second.reset();
  // Two neighbouring 1 MiB blocks make room for 2 MiB; the third is still held.
  EXPECT_EQ(pair.arena->allocate(2 * kMiB), blocks[0]);
}

// A 1 MiB block sent and taken by the receiver, which holds it until `held` is reset.
struct HeldBlock {
  uint64_t block = 0;
  std::shared_ptr<uint8_t> held;
};
HeldBlock send_and_take(ArenaAndMapping& pair) {
  const auto block = pair.arena->allocate(kMiB);
  if (!block) throw std::runtime_error("no block");
  std::string problem;
  HeldBlock sent{*block, pair.mapping->take(*block, kMiB, &problem)};
  if (!sent.held) throw std::runtime_error(problem);
  return sent;
}

using std::chrono::milliseconds;
using std::chrono::seconds;

// A 64 MiB echo's reply can come back before the receiver let go of the request's block: the
// next request then waits for that block instead of using pages never used before.
TEST(ShmArena, ABlockTheReceiverHoldsIsWaitedForBeforeNewPagesAreUsed) {
  constexpr auto kNoLimit = std::chrono::microseconds::max();  // capped, never overflowing
  for (const ShmArena::ReuseWait wait : {ShmArena::ReuseWait{seconds(10), seconds(10), seconds(10)},
                                         ShmArena::ReuseWait{kNoLimit, kNoLimit, kNoLimit}}) {
    ArenaAndMapping pair(8 * kMiB, wait);
    HeldBlock sent = send_and_take(pair);
    std::thread receiver([&] {
      std::this_thread::sleep_for(milliseconds(20));
      sent.held.reset();
    });
    EXPECT_EQ(pair.arena->allocate(kMiB), sent.block);  // with new pages at once, the next block
    receiver.join();
  }
}

// A receiver that keeps its block (or always lets go late): new pages after one call's wait,
// or once the waits together reach their bound, whichever comes first.
TEST(ShmArena, NewPagesAreUsedOnceTheWaitIsOver) {
  for (const ShmArena::ReuseWait wait : {ShmArena::ReuseWait{std::chrono::microseconds(1), milliseconds(1), seconds(1)},
                                         ShmArena::ReuseWait{seconds(30), seconds(30), milliseconds(50)}}) {
    ArenaAndMapping pair(8 * kMiB, wait);
    const HeldBlock sent = send_and_take(pair);
    const auto start = std::chrono::steady_clock::now();
    const auto next = pair.arena->allocate(kMiB);
    ASSERT_TRUE(next.has_value());
    EXPECT_NE(next, sent.block);
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
  }
}

// Blocks sent and not yet taken are the sender's own message's: nothing to wait for.
TEST(ShmArena, BlocksNotYetTakenAreNotWaitedFor) {
  ArenaAndMapping pair(8 * kMiB, ShmArena::ReuseWait{seconds(30), seconds(30), seconds(30)});
  const auto start = std::chrono::steady_clock::now();
  const auto first = pair.arena->allocate(kMiB);
  const auto second = pair.arena->allocate(kMiB);
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_NE(first, second);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
}

TEST(ShmArena, TakeRefusesWhatWasNotSentOrIsOutside) {
  ArenaAndMapping pair(4 * kMiB);
  const auto block = pair.arena->allocate(1000);
  ASSERT_TRUE(block.has_value());
  std::string problem;
  EXPECT_EQ(pair.mapping->take(*block + 8, 100, &problem), nullptr);  // unaligned
  EXPECT_NE(problem.find("not a block"), std::string::npos) << problem;
  EXPECT_EQ(pair.mapping->take(0, 100, &problem), nullptr);  // the nonce
  EXPECT_EQ(pair.mapping->take(*block, 0, &problem), nullptr);
  EXPECT_EQ(pair.mapping->take(*block, 4 * kMiB, &problem), nullptr);  // past the end
  EXPECT_EQ(pair.mapping->take(*block, UINT64_MAX - 10, &problem), nullptr);
  EXPECT_EQ(pair.mapping->take(*block + 4096, 100, &problem), nullptr);  // never sent
  EXPECT_NE(problem.find("not sent"), std::string::npos) << problem;
  EXPECT_EQ(pair.mapping->take(*block, 1025, &problem), nullptr);  // past its block (1024 bytes)
  EXPECT_NE(problem.find("overrun"), std::string::npos) << problem;
  auto taken = pair.mapping->take(*block, 1000, &problem);
  ASSERT_NE(taken, nullptr) << problem;
  EXPECT_EQ(pair.mapping->take(*block, 1000, &problem), nullptr);  // once only
  pair.arena->unallocate(*block);  // not the sender's to give back any more: ignored
  EXPECT_GT(pair.arena->bytes_in_use(), 0u);
}

TEST(ShmArena, AnUnsentBlockGoesBack) {
  ArenaAndMapping pair(4 * kMiB);
  const auto block = pair.arena->allocate(3 * kMiB);
  ASSERT_TRUE(block.has_value());
  pair.arena->unallocate(*block);
  EXPECT_EQ(pair.arena->bytes_in_use(), 0u);
  EXPECT_EQ(pair.arena->allocate(3 * kMiB), block);
}

TEST(ShmArena, AttachChecksTheOffer) {
  std::string why;
  auto arena = ShmArena::create(4 * kMiB, &why);
  ASSERT_NE(arena, nullptr) << why;
  std::string offer = arena->offer();
  ASSERT_EQ(offer.size(), kArenaOfferBytes);
  const auto* bytes = reinterpret_cast<const uint8_t*>(offer.data());
  EXPECT_EQ(ArenaMapping::attach(bytes, offer.size() - 1, &why), nullptr);
  EXPECT_NE(why.find("offer of"), std::string::npos) << why;

  std::string wrong_nonce = offer;
  wrong_nonce.back() ^= 1;
  EXPECT_EQ(ArenaMapping::attach(reinterpret_cast<const uint8_t*>(wrong_nonce.data()), offer.size(), &why), nullptr);
  EXPECT_NE(why.find("nonce"), std::string::npos) << why;

  std::string wrong_size = offer;
  wrong_size[sizeof(int32_t)] ^= 1;
  EXPECT_EQ(ArenaMapping::attach(reinterpret_cast<const uint8_t*>(wrong_size.data()), offer.size(), &why), nullptr);

  std::string no_segment = offer;
  const int32_t bogus = -5;
  std::memcpy(&no_segment[0], &bogus, sizeof(bogus));
  EXPECT_EQ(ArenaMapping::attach(reinterpret_cast<const uint8_t*>(no_segment.data()), offer.size(), &why), nullptr);
  EXPECT_NE(why.find("segment"), std::string::npos) << why;
}

TEST(ShmArena, TakenBlocksOutliveTheArenaAndTheirMapping) {
  const auto bytes = pattern(kMiB, 3);
  std::shared_ptr<uint8_t> taken;
  {
    ArenaAndMapping pair(4 * kMiB);
    const auto block = pair.arena->allocate(bytes.size());
    ASSERT_TRUE(block.has_value());
    std::memcpy(pair.arena->data(*block), bytes.data(), bytes.size());
    std::string problem;
    taken = pair.mapping->take(*block, bytes.size(), &problem);
    ASSERT_NE(taken, nullptr) << problem;
  }
  // The sender detached and the receiver dropped its mapping: the block still holds it.
  EXPECT_EQ(std::memcmp(taken.get(), bytes.data(), bytes.size()), 0);
}

TEST(ShmArena, AnotherProcessTakesAndReleases) {
  ArenaAndMapping pair(8 * kMiB);
  const auto bytes = pattern(3 * kMiB, 11);
  const auto block = pair.arena->allocate(bytes.size());
  ASSERT_TRUE(block.has_value());
  std::memcpy(pair.arena->data(*block), bytes.data(), bytes.size());
  const std::string offer = pair.arena->offer();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // no threads in this test binary here: attach, check, release, leave
    std::string why;
    auto mapping = ArenaMapping::attach(reinterpret_cast<const uint8_t*>(offer.data()), offer.size(), &why);
    if (!mapping) _exit(2);
    auto taken = mapping->take(*block, bytes.size(), &why);
    if (!taken) _exit(3);
    const bool same = std::memcmp(taken.get(), bytes.data(), bytes.size()) == 0;
    taken.reset();
    _exit(same ? 0 : 4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(pair.arena->bytes_in_use(), 0u);  // released by the other process
}

TEST(ShmArena, AForkedChildDoesNotGiveBackTheBlocksItInherited) {
  ArenaAndMapping pair(4 * kMiB);
  const auto block = pair.arena->allocate(kMiB);
  ASSERT_TRUE(block.has_value());
  std::string problem;
  auto taken = pair.mapping->take(*block, kMiB, &problem);
  ASSERT_NE(taken, nullptr) << problem;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // drops its copy of the tensor's storage, as a forked worker would
    taken.reset();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_GE(pair.arena->bytes_in_use(), kMiB);  // still the parent's
  taken.reset();
  EXPECT_EQ(pair.arena->bytes_in_use(), 0u);
}

TEST(ParallelCopier, CopiesEveryByteAloneOrTogether) {
  ParallelCopier copier;
  for (size_t size : {size_t{0}, size_t{1}, 4 * kMiB - 1, 4 * kMiB, 9 * kMiB + 123}) {
    const auto src = pattern(size, static_cast<uint8_t>(size));
    std::vector<uint8_t> dst(size, 0);
    copier.copy(dst.data(), src.data(), size);
    EXPECT_EQ(dst, src) << size;
  }
  // Several copies at once: one has the helper, the others copy alone.
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        const auto src = pattern(6 * kMiB + t * 4096, static_cast<uint8_t>(t * 7 + round));
        std::vector<uint8_t> dst(src.size(), 0);
        copier.copy(dst.data(), src.data(), src.size());
        if (dst != src) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

}  // namespace
}  // namespace drpc
