// The UCX links on their own (no gRPC): real UCX workers in this process, frames in order,
// large tensors, the SWITCH gate, and messages without the pair's secret dropped.

#include "process_group/ucx_links.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "process_group/frame.h"
#include "process_group/ucx_link_message.h"

namespace drpc {
namespace {

using std::chrono::seconds;

// Records what a rank's links deliver.
class RecordingSink final : public UcxLinkSink {
 public:
  void on_link_frames(int source, std::vector<Frame> frames) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : frames) this->frames.push_back(std::move(f));
    changed_.notify_all();
  }
  void on_link_probe(int source, bool shared_memory) override {
    std::lock_guard<std::mutex> lock(mu_);
    probes.push_back(source);
    if (shared_memory) arena_offers.push_back(source);
    changed_.notify_all();
  }
  void on_link_failed(int source, const Error& why) override {
    std::lock_guard<std::mutex> lock(mu_);
    failures.push_back(why.message());
    changed_.notify_all();
  }
  // Waits until `done` holds (under the lock); false after 20 s.
  bool wait(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, seconds(20), done);
  }
  size_t frame_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return frames.size();
  }

  std::vector<Frame> frames;
  std::vector<int> probes;
  std::vector<int> arena_offers;  // probes whose arena was attached
  std::vector<std::string> failures;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
};

// Counts completed sends and waits for a number of them.
class SentCounter {
 public:
  std::function<void(std::exception_ptr)> callback() {
    return [this](std::exception_ptr e) {
      std::lock_guard<std::mutex> lock(mu_);
      if (e) ++failed_;
      ++sent_;
      changed_.notify_all();
    };
  }
  bool wait_for(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, seconds(20), [&] { return sent_ >= n; });
  }
  int failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int sent_ = 0;
  int failed_ = 0;
};

// Whether the sender's arena use falls to `at_most` bytes within 20 s. Blocks come back when
// the receiver lets go of them, which is not an event here: the receiving progress thread
// drops its own references to a message just after it handed the frames to the sink, so a
// test that lets go of the frames may still be a moment ahead of it.
bool arena_use_falls_to(UcxLinks& sender, size_t at_most) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while (sender.shared_memory_in_use() > at_most) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

pg::FrameHeader p2p_header(int64_t tag, const std::vector<at::Tensor>& tensors) {
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::P2P);
  header.set_tag(tag);
  describe_tensors(tensors, &header);
  return header;
}

struct Pair {
  RecordingSink sink0, sink1;
  std::unique_ptr<UcxLinks> rank0, rank1;

  explicit Pair(size_t arena_bytes = kDefaultArenaBytes) {
    std::string why;
    rank0 = create_ucx_links(0, 2, DataPlane::kAuto, sink0, &why, arena_bytes);
    rank1 = create_ucx_links(1, 2, DataPlane::kAuto, sink1, &why, arena_bytes);
    if (!rank0 || !rank1) throw std::runtime_error("UCX did not start: " + why);
  }

  // Rank 0's link to rank 1, open at rank 1 (as after the SWITCH).
  void open_0_to_1() {
    rank0->connect(1, rank1->address(), rank1->inbound_secret(0), /*same_host=*/false);
    rank1->open_inbound(0);
  }

  // The same, with rank 0 offering its arena in the probe and using it once rank 1 attached
  // it (as after LINK_READY). False when rank 1 did not attach it.
  bool open_0_to_1_with_arena() {
    rank0->connect(1, rank1->address(), rank1->inbound_secret(0), /*same_host=*/true);
    if (!sink1.wait([&] { return !sink1.probes.empty(); })) return false;
    if (sink1.arena_offers != std::vector<int>{0}) return false;
    rank0->use_shared_memory(1);
    rank1->open_inbound(0);
    return true;
  }
};

TEST(UcxLinks, ProbeThenFramesInOrderOnceOpened) {
  Pair pair;
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false);
  ASSERT_TRUE(pair.sink1.wait([&] { return !pair.sink1.probes.empty(); }));
  EXPECT_EQ(pair.sink1.probes, std::vector<int>{0});

  // Small frames, one with a tensor sent in place (8 MiB) and one with none, interleaved.
  const at::Tensor large = at::arange(2 << 20, at::kFloat);
  SentCounter sent;
  for (int i = 0; i < 20; ++i) {
    std::vector<at::Tensor> tensors;
    if (i % 5 == 3) tensors.push_back(large);
    if (i % 5 == 1) tensors.push_back(at::full({3}, static_cast<float>(i)));
    pair.rank0->send(1, p2p_header(i, tensors), tensors, sent.callback());
  }
  // Held until the peer's SWITCH (here: open_inbound) says the other link is done.
  ASSERT_TRUE(sent.wait_for(20));
  EXPECT_EQ(sent.failed(), 0);
  EXPECT_EQ(pair.sink1.frame_count(), 0u);
  pair.rank1->open_inbound(0);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 20; }));
  for (int i = 0; i < 20; ++i) {
    const Frame& f = pair.sink1.frames[i];
    EXPECT_EQ(f.source, 0);
    EXPECT_EQ(f.header.tag(), i);
    if (i % 5 == 3) {
      ASSERT_EQ(f.tensors.size(), 1u);
      const at::Tensor received = tensor_from_body(f, f.tensors[0], 0);
      EXPECT_TRUE(received.equal(large)) << "frame " << i;
      // Used where it landed: the sender aligned it, so the receiver copied nothing.
      ASSERT_EQ(f.body.size(), 1u);
      EXPECT_GE(static_cast<const uint8_t*>(received.data_ptr()), f.body[0].data) << "frame " << i;
      EXPECT_LT(static_cast<const uint8_t*>(received.data_ptr()), f.body[0].data + f.body[0].size);
    }
    if (i % 5 == 1) {
      EXPECT_TRUE(tensor_from_body(f, f.tensors[0], 0).equal(at::full({3}, static_cast<float>(i))));
    }
  }
  EXPECT_TRUE(pair.sink1.failures.empty());
}

TEST(UcxLinks, LargeTensorsLandInPlaceInReusedBuffers) {
  Pair pair;
  pair.open_0_to_1();
  const at::Tensor first = at::arange(1 << 18, at::kFloat), second = at::arange(1 << 16, at::kDouble);
  const std::vector<at::Tensor> tensors = {first, at::full({3}, 2.0), second};
  const void* landed = nullptr;
  for (int round = 0; round < 2; ++round) {
    SentCounter sent;
    pair.rank0->send(1, p2p_header(round, tensors), tensors, sent.callback());
    ASSERT_TRUE(sent.wait_for(1));
    EXPECT_EQ(sent.failed(), 0);
    ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
    const Frame frame = std::move(pair.sink1.frames[0]);
    pair.sink1.frames.clear();
    EXPECT_EQ(frame.header.tag(), round);
    size_t offset = 0;
    std::vector<at::Tensor> received;
    for (int i = 0; i < 3; ++i) {
      received.push_back(tensor_from_body(frame, frame.tensors[i], offset));
      offset += frame.tensors[i].nbytes;
      EXPECT_TRUE(received[i].equal(tensors[i])) << "round " << round << " tensor " << i;
    }
    // The large ones are used where UCX put them: a body of their own each.
    ASSERT_EQ(frame.body.size(), 3u);
    EXPECT_EQ(received[0].data_ptr(), frame.body[0].data);
    EXPECT_EQ(received[2].data_ptr(), frame.body[2].data);
    // The second round lands in the first round's buffer, freed meanwhile.
    if (round == 1) EXPECT_EQ(received[0].data_ptr(), landed);
    landed = received[0].data_ptr();
  }
  EXPECT_TRUE(pair.sink1.failures.empty());
}

// The tensors of a received frame, viewed where they landed.
std::vector<at::Tensor> received_tensors(const Frame& frame) {
  std::vector<at::Tensor> tensors;
  size_t offset = 0;
  for (const auto& t : frame.tensors) {
    tensors.push_back(tensor_from_body(frame, t, offset));
    offset += t.nbytes;
  }
  return tensors;
}

TEST(UcxLinks, LargeTensorsOfMessagesComeThroughTheSendersArena) {
  Pair pair(64 << 20);
  ASSERT_TRUE(pair.open_0_to_1_with_arena());
  const at::Tensor a = at::arange(1 << 20, at::kFloat), b = at::arange(1 << 18, at::kDouble);
  const at::Tensor c = at::randn({1 << 21}), small = at::full({3}, 5.0);
  const std::vector<std::vector<at::Tensor>> messages = {{a, small}, {small}, {b, c}};
  SentCounter sent;
  for (size_t i = 0; i < messages.size(); ++i) {
    pair.rank0->send(1, p2p_header(static_cast<int64_t>(i), messages[i]), messages[i], sent.callback());
  }
  ASSERT_TRUE(sent.wait_for(3));
  EXPECT_EQ(sent.failed(), 0);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 3; }));
  for (size_t i = 0; i < messages.size(); ++i) {
    const Frame& frame = pair.sink1.frames[i];
    EXPECT_EQ(frame.header.tag(), static_cast<int64_t>(i));
    const auto received = received_tensors(frame);
    ASSERT_EQ(received.size(), messages[i].size());
    for (size_t t = 0; t < received.size(); ++t) EXPECT_TRUE(received[t].equal(messages[i][t])) << i << "/" << t;
  }
  // The three large tensors wait in rank 0's arena, used in place, until rank 1 lets go.
  const size_t large = a.nbytes() + b.nbytes() + c.nbytes();
  EXPECT_GE(pair.rank0->shared_memory_in_use(), large);
  EXPECT_LT(pair.rank0->shared_memory_in_use(), large + 4096);
  // A tensor kept holds its message's blocks (b's and c's), and only those.
  at::Tensor kept = received_tensors(pair.sink1.frames[2])[1];
  pair.sink1.frames.clear();
  EXPECT_TRUE(arena_use_falls_to(*pair.rank0, b.nbytes() + c.nbytes() + 4096));
  EXPECT_GE(pair.rank0->shared_memory_in_use(), b.nbytes() + c.nbytes());
  EXPECT_TRUE(kept.equal(c));
  kept = at::Tensor();
  EXPECT_TRUE(arena_use_falls_to(*pair.rank0, 0));
  EXPECT_TRUE(pair.sink1.failures.empty());
}

TEST(UcxLinks, WhenTheArenaIsFullTensorsGoTheUcxWayInOrder) {
  Pair pair(8 << 20);
  ASSERT_TRUE(pair.open_0_to_1_with_arena());
  SentCounter sent;
  std::vector<at::Tensor> tensors;
  for (int i = 0; i < 4; ++i) {
    tensors.push_back(at::full({3 << 18}, static_cast<float>(i)));  // 3 MiB: two fit
    pair.rank0->send(1, p2p_header(i, {tensors[i]}), {tensors[i]}, sent.callback());
  }
  ASSERT_TRUE(sent.wait_for(4));
  EXPECT_EQ(sent.failed(), 0);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 4; }));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pair.sink1.frames[i].header.tag(), i);
    EXPECT_TRUE(received_tensors(pair.sink1.frames[i])[0].equal(tensors[i])) << i;
  }
  EXPECT_GE(pair.rank0->shared_memory_in_use(), 2 * tensors[0].nbytes());
  EXPECT_LT(pair.rank0->shared_memory_in_use(), 3 * tensors[0].nbytes());
  pair.sink1.frames.clear();
  EXPECT_TRUE(arena_use_falls_to(*pair.rank0, 0));
  // Room again: the next goes through the arena.
  pair.rank0->send(1, p2p_header(9, {tensors[0]}), {tensors[0]}, sent.callback());
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_TRUE(received_tensors(pair.sink1.frames[0])[0].equal(tensors[0]));
  EXPECT_GE(pair.rank0->shared_memory_in_use(), tensors[0].nbytes());
  EXPECT_TRUE(pair.sink1.failures.empty());
}

TEST(UcxLinks, AMessageRefusedBeforeItsHeadWasPostedGivesItsBlocksBack) {
  Pair pair(16 << 20);
  ASSERT_TRUE(pair.open_0_to_1_with_arena());
  const at::Tensor large = at::ones({1 << 20});
  SentCounter sent;
  pair.rank0->send(1, p2p_header(1, {large}), {large}, sent.callback());
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_GE(pair.rank0->shared_memory_in_use(), large.nbytes());  // rank 1 holds it
  pair.rank0->fail_peer(1, Error(ErrorKind::kPeerUnavailable, "rank 1 is gone"));
  // Refused: nothing names its blocks, so they are free again; rank 1's are still held.
  EXPECT_THROW(pair.rank0->send(1, p2p_header(2, {large}), {large}, sent.callback()), Error);
  EXPECT_GE(pair.rank0->shared_memory_in_use(), large.nbytes());
  EXPECT_LT(pair.rank0->shared_memory_in_use(), 2 * large.nbytes());
  pair.sink1.frames.clear();
  EXPECT_TRUE(arena_use_falls_to(*pair.rank0, 0));
}

TEST(UcxLinks, NoArenaIsOfferedToAnotherHostAndCollectivesKeepTheirPlaces) {
  {
    Pair pair;
    pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false);
    ASSERT_TRUE(pair.sink1.wait([&] { return !pair.sink1.probes.empty(); }));
    EXPECT_TRUE(pair.sink1.arena_offers.empty());
  }
  {
    Pair pair(0);  // no arena: nothing to offer
    pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/true);
    ASSERT_TRUE(pair.sink1.wait([&] { return !pair.sink1.probes.empty(); }));
    EXPECT_TRUE(pair.sink1.arena_offers.empty());
    EXPECT_EQ(pair.rank0->shared_memory_in_use(), 0u);
  }
  Pair pair;
  ASSERT_TRUE(pair.open_0_to_1_with_arena());
  const at::Tensor chunk = at::arange(1 << 20, at::kFloat);
  at::Tensor placed = at::zeros({1 << 20});
  pair.rank1->place_collective_frame(0, 3, 0, placed);
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::COLLECTIVE);
  header.set_seq(3);
  describe_tensors({chunk}, &header);
  SentCounter sent;
  pair.rank0->send(1, header, {chunk}, sent.callback());
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_EQ(pair.sink1.frames[0].body[0].data, placed.data_ptr());
  EXPECT_TRUE(placed.equal(chunk));
  EXPECT_EQ(pair.rank0->shared_memory_in_use(), 0u);
}

pg::FrameHeader collective_header(uint64_t seq, uint32_t step, const std::vector<at::Tensor>& tensors) {
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::COLLECTIVE);
  header.set_seq(seq);
  header.set_step(step);
  describe_tensors(tensors, &header);
  return header;
}

TEST(UcxLinks, PlacedCollectiveFramesLandInTheirDestination) {
  Pair pair;
  pair.open_0_to_1();
  const at::Tensor chunk = at::arange(1 << 16, at::kFloat);  // 256 KiB: a body
  at::Tensor placed = at::zeros({1 << 16});
  at::Tensor wrong_size = at::zeros({1 << 15});
  at::Tensor released = at::zeros({1 << 16});
  at::Tensor other_seq = at::zeros({1 << 16});
  pair.rank1->place_collective_frame(0, 7, 1, placed);
  pair.rank1->place_collective_frame(0, 7, 2, wrong_size);
  pair.rank1->place_collective_frame(0, 6, 0, released);
  pair.rank1->place_collective_frame(0, 8, 0, other_seq);
  pair.rank1->release_placements(6);  // forgets seq 6, keeps 7 and 8
  const void* placed_at = placed.data_ptr();
  placed = at::Tensor();  // the link keeps it alive until the frame is done with it

  SentCounter sent;
  const std::vector<std::pair<uint64_t, uint32_t>> keys = {{7, 0}, {7, 1}, {7, 2}, {6, 0}};
  for (const auto& [seq, step] : keys) pair.rank0->send(1, collective_header(seq, step, {chunk}), {chunk}, sent.callback());
  // A P2P frame is never placed, whatever its seq and step say.
  pg::FrameHeader p2p = p2p_header(1, {chunk});
  p2p.set_seq(8);
  pair.rank0->send(1, p2p, {chunk}, sent.callback());
  ASSERT_TRUE(sent.wait_for(5));
  EXPECT_EQ(sent.failed(), 0);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 5; }));
  for (size_t i = 0; i < 5; ++i) {
    const Frame& f = pair.sink1.frames[i];
    ASSERT_EQ(f.body.size(), 1u);
    EXPECT_TRUE(tensor_from_body(f, f.tensors[0], 0).equal(chunk)) << "frame " << i;
    // Only (7, 1) had a destination of its size.
    EXPECT_EQ(f.body[0].data == placed_at, i == 1) << "frame " << i;
  }
  EXPECT_TRUE(wrong_size.eq(0).all().item<bool>());
  EXPECT_TRUE(released.eq(0).all().item<bool>());
  EXPECT_TRUE(other_seq.eq(0).all().item<bool>());
  // copy_body into the destination it landed in copies nothing, and says so by not failing.
  at::Tensor again = at::from_blob(const_cast<void*>(placed_at), {1 << 16});
  pair.sink1.frames[1].copy_body(0, again.data_ptr(), again.nbytes());
  EXPECT_TRUE(again.equal(chunk));
  EXPECT_TRUE(pair.sink1.failures.empty());
}

// A collective that fails while a frame of it is landing in one of its tensors gets the
// tensor back only once the frame has landed: nothing writes it after release_placements.
TEST(UcxLinks, ReleaseWaitsForAPlacedBodyStillLanding) {
  Pair pair;
  pair.open_0_to_1();
  const int64_t n = 32 << 20;  // 128 MiB: the copy takes long enough to be caught under way
  const at::Tensor chunk = at::ones({n});
  at::Tensor dst = at::zeros({n});
  pair.rank1->place_collective_frame(0, 5, 0, dst);
  pair.rank0->send(1, collective_header(5, 0, {chunk}), {chunk}, nullptr);
  // The body starts landing when its first float turns to 1 (UCX copies it in from the start).
  const auto* first = static_cast<const uint32_t*>(dst.data_ptr());
  const auto give_up = std::chrono::steady_clock::now() + seconds(20);
  while (__atomic_load_n(first, __ATOMIC_ACQUIRE) == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the body never started landing";
    std::this_thread::yield();
  }
  pair.rank1->release_placements(5);
  EXPECT_TRUE(dst.eq(1).all().item<bool>()) << "release_placements returned before the body had landed";
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_EQ(pair.sink1.frames[0].body[0].data, dst.data_ptr());
  EXPECT_TRUE(pair.sink1.failures.empty());
}

// A peer declared failed may still be alive and sending: once it is, its frames never land
// in a collective's tensors (release_placements no longer waits for it).
TEST(UcxLinks, NothingOfAFailedPeerLandsInPlace) {
  Pair pair;
  pair.open_0_to_1();
  const at::Tensor chunk = at::ones({1 << 16});
  at::Tensor placed_before = at::zeros({1 << 16}), placed_after = at::zeros({1 << 16});
  pair.rank1->place_collective_frame(0, 3, 0, placed_before);
  pair.rank1->fail_peer(0, Error(ErrorKind::kPeerUnavailable, "rank 0 missed its heartbeats"));
  pair.rank1->place_collective_frame(0, 3, 1, placed_after);
  for (uint32_t step : {0u, 1u}) pair.rank0->send(1, collective_header(3, step, {chunk}), {chunk}, nullptr);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 2; }));
  for (const Frame& f : pair.sink1.frames) {
    EXPECT_TRUE(tensor_from_body(f, f.tensors[0], 0).equal(chunk));
    EXPECT_NE(f.body[0].data, placed_before.data_ptr());
    EXPECT_NE(f.body[0].data, placed_after.data_ptr());
  }
  EXPECT_TRUE(placed_before.eq(0).all().item<bool>());
  EXPECT_TRUE(placed_after.eq(0).all().item<bool>());
  pair.rank1->release_placements(3);  // nothing to wait for
}

TEST(UcxLinks, MessagesWithoutThePairsSecretAreDropped) {
  Pair pair;
  pair.rank1->open_inbound(0);
  // An intruder that knows rank 1's UCX address, and claims to be rank 0, but not the secret.
  RecordingSink intruder_sink;
  std::string why;
  auto intruder = create_ucx_links(0, 2, DataPlane::kAuto, intruder_sink, &why);
  ASSERT_NE(intruder, nullptr) << why;
  intruder->connect(1, pair.rank1->address(), std::string(kLinkSecretBytes, 'x'), /*same_host=*/false);
  SentCounter sent;
  for (int i = 0; i < 3; ++i) intruder->send(1, p2p_header(100 + i, {}), {}, sent.callback());
  ASSERT_TRUE(sent.wait_for(3));  // written into rank 1's queue, ahead of what follows
  // Then the real rank 0: only its frames arrive, and its probe; the intruder's probe does not.
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false);
  pair.rank0->send(1, p2p_header(7, {}), {}, nullptr);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_EQ(pair.sink1.frames[0].header.tag(), 7);
  EXPECT_EQ(pair.sink1.probes, std::vector<int>{0});
  EXPECT_TRUE(pair.sink1.failures.empty());
  intruder->shutdown();
}

TEST(UcxLinks, SendsFailOncePeerFailedAndAfterShutdown) {
  Pair pair;
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false);
  pair.rank0->fail_peer(1, Error(ErrorKind::kPeerUnavailable, "rank 1 is gone"));
  try {
    pair.rank0->send(1, p2p_header(1, {}), {}, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable);
    EXPECT_NE(std::string(e.what()).find("rank 1 is gone"), std::string::npos) << e.what();
  }
  pair.rank1->shutdown();
  pair.rank1->shutdown();  // idempotent
  EXPECT_THROW(pair.rank1->connect(0, pair.rank0->address(), pair.rank0->inbound_secret(1), /*same_host=*/false), Error);
}

TEST(UcxLinks, ConnectRejectsBadPeersAndSecrets) {
  Pair pair;
  EXPECT_THROW(pair.rank0->connect(0, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false), Error);
  EXPECT_THROW(pair.rank0->connect(2, pair.rank1->address(), pair.rank1->inbound_secret(0), /*same_host=*/false), Error);
  EXPECT_THROW(pair.rank0->connect(1, pair.rank1->address(), "short", /*same_host=*/false), Error);
  EXPECT_THROW(pair.rank0->send(1, p2p_header(1, {}), {}, nullptr), Error);  // not connected
}

// The wire bytes of one frame (encode_frame's pieces, concatenated).
std::string wire_bytes(const pg::FrameHeader& header, const std::vector<at::Tensor>& tensors) {
  struct Concatenated final : FramePieces {
    void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
      const size_t at = bytes.size();
      bytes.resize(at + size);
      fill(reinterpret_cast<uint8_t*>(&bytes[at]));
    }
    void add_tensor(const at::Tensor& t) override {
      bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
    std::string bytes;
  } out;
  encode_frame(header, tensors, out);
  return out.bytes;
}

std::string parse_problem(const std::string& bytes, const std::string& secret, LinkMessage* message) {
  std::string problem;
  const bool ok = parse_link_message(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), secret, message,
                                     &problem);
  EXPECT_EQ(ok, problem.empty()) << problem;
  return problem;
}

TEST(UcxLinkMessages, ParseChecksPrefixSecretAndType) {
  const std::string secret(kLinkSecretBytes, 's');
  LinkMessage message;
  EXPECT_EQ(parse_problem(link_message_head(secret, LinkMessageType::kProbe), secret, &message), "");
  EXPECT_EQ(message.type, LinkMessageType::kProbe);
  EXPECT_NE(parse_problem("short", secret, &message).find("shorter than its prefix"), std::string::npos);
  const std::string other(kLinkSecretBytes, 't');
  EXPECT_NE(parse_problem(link_message_head(other, LinkMessageType::kProbe), secret, &message).find("secret"),
            std::string::npos);
  EXPECT_NE(parse_problem(link_message_head(secret, LinkMessageType::kProbe) + "x", secret, &message)
                .find("probe carries"),
            std::string::npos);
  // A probe may offer the sender's arena, in exactly kArenaOfferBytes.
  const std::string offer(kArenaOfferBytes, 'o');
  const std::string probe = link_probe_with_arena(secret, offer);  // the parsed message points into it
  ASSERT_EQ(parse_problem(probe, secret, &message), "");
  ASSERT_NE(message.arena_offer, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(message.arena_offer), kArenaOfferBytes), offer);
  EXPECT_NE(parse_problem(link_probe_with_arena(secret, offer + "x"), secret, &message).find("probe carries"),
            std::string::npos);
  std::string unknown = link_message_head(secret, LinkMessageType::kFrames);
  unknown.back() = 9;
  EXPECT_NE(parse_problem(unknown, secret, &message).find("unknown message type 9"), std::string::npos);

  // Frames: parsed lazily, refused when absent or malformed.
  std::vector<Frame> frames;
  std::string problem;
  ASSERT_EQ(parse_problem(link_message_head(secret, LinkMessageType::kFrames), secret, &message), "");
  EXPECT_FALSE(link_message_frames(message, {}, nullptr, 0, &frames, &problem));
  EXPECT_NE(problem.find("without frames"), std::string::npos) << problem;
  const std::string garbage = link_message_head(secret, LinkMessageType::kFrames) + "\xff\xff\xff\x7f";
  ASSERT_EQ(parse_problem(garbage, secret, &message), "");
  EXPECT_FALSE(link_message_frames(message, {}, nullptr, 0, &frames, &problem));
}

TEST(UcxLinkMessages, BodiesAreSplicedBackWhereTheyWereCut) {
  const std::string secret(kLinkSecretBytes, 's');
  const at::Tensor first = at::arange(100, at::kFloat), second = at::arange(50, at::kInt);
  const std::vector<at::Tensor> tensors = {first, at::full({2}, 7.0), second};
  const std::string wire = wire_bytes(p2p_header(5, tensors), tensors);
  // Cut out the first and third tensors' bytes, as a sender does with large ones.
  const size_t mid = tensors[1].nbytes();
  const size_t second_at = wire.size() - second.nbytes(), first_at = second_at - mid - first.nbytes();
  const LinkBody body0{first_at, first.nbytes(), link_body_tag(secret, 0)};
  const LinkBody body1{second_at, second.nbytes(), link_body_tag(secret, 1)};
  EXPECT_NE(body0.tag, body1.tag);
  EXPECT_NE(body0.tag & kLinkBodyTagBit, 0u);
  EXPECT_NE(link_body_tag(std::string(kLinkSecretBytes, 't'), 0), body0.tag);
  const std::string head = link_message_head(secret, LinkMessageType::kFramesWithBodies, {body0, body1}) +
                           wire.substr(0, first_at) + wire.substr(first_at + first.nbytes(), mid);
  LinkMessage message;
  ASSERT_EQ(parse_problem(head, secret, &message), "");
  ASSERT_EQ(message.bodies.size(), 2u);
  EXPECT_EQ(message.bodies[1].tag, body1.tag);
  const std::vector<ByteSpan> bodies = {ByteSpan{static_cast<const uint8_t*>(first.data_ptr()), first.nbytes()},
                                        ByteSpan{static_cast<const uint8_t*>(second.data_ptr()), second.nbytes()}};
  std::vector<Frame> frames;
  std::string problem;
  ASSERT_TRUE(link_message_frames(message, bodies, nullptr, 3, &frames, &problem)) << problem;
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].source, 3);
  EXPECT_TRUE(tensor_from_body(frames[0], frames[0].tensors[0], 0).equal(first));
  EXPECT_TRUE(tensor_from_body(frames[0], frames[0].tensors[1], first.nbytes()).equal(at::full({2}, 7.0)));
  EXPECT_TRUE(tensor_from_body(frames[0], frames[0].tensors[2], first.nbytes() + mid).equal(second));

  // Each body's frame and tensor, from the head alone.
  std::vector<LinkBodyOwner> owners;
  ASSERT_TRUE(link_body_owners(message, &owners));
  ASSERT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners[0].kind, pg::FrameHeader::P2P);
  EXPECT_EQ(owners[0].tensor, 0);
  EXPECT_EQ(owners[1].tensor, 2);

  // A body of another size, or one missing, is refused.
  EXPECT_FALSE(link_message_frames(message, {bodies[0], bodies[0]}, nullptr, 3, &frames, &problem));
  EXPECT_NE(problem.find("body 1 has"), std::string::npos) << problem;
  EXPECT_FALSE(link_message_frames(message, {bodies[0]}, nullptr, 3, &frames, &problem));

  // Malformed tables.
  auto table_problem = [&](const std::vector<LinkBody>& table) {
    return parse_problem(link_message_head(secret, LinkMessageType::kFramesWithBodies, table) + "0123456789", secret,
                         &message);
  };
  EXPECT_NE(table_problem({}).find("claims 0 bodies"), std::string::npos);
  EXPECT_NE(table_problem({LinkBody{0, 0, kLinkBodyTagBit}}).find("has size 0"), std::string::npos);
  EXPECT_NE(table_problem({LinkBody{4, 8, kLinkBodyTagBit}, LinkBody{6, 8, kLinkBodyTagBit}}).find("out of order"),
            std::string::npos);
  EXPECT_NE(table_problem({LinkBody{11, 8, kLinkBodyTagBit}}).find("past the frames"), std::string::npos);
  EXPECT_NE(table_problem({LinkBody{2, UINT64_MAX, kLinkBodyTagBit}}).find("has size"), std::string::npos);
  EXPECT_NE(table_problem({LinkBody{2, 8, 1}}).find("head's tag"), std::string::npos);
  EXPECT_EQ(table_problem({LinkBody{10, 8, kLinkBodyTagBit}, LinkBody{18, 1, kLinkBodyTagBit}}), "");
  // An arena body's tag is its block's offset, which any value may be (its mapping checks it).
  EXPECT_EQ(parse_problem(link_message_head(secret, LinkMessageType::kFramesWithArenaBodies, {LinkBody{2, 8, 4160}}) +
                              "0123456789",
                          secret, &message),
            "");
  EXPECT_EQ(message.type, LinkMessageType::kFramesWithArenaBodies);
  EXPECT_EQ(message.bodies.at(0).tag, 4160u);
  EXPECT_NE(parse_problem(link_message_head(secret, LinkMessageType::kFramesWithArenaBodies, {LinkBody{11, 8, 4160}}) +
                              "0123456789",
                          secret, &message)
                .find("past the frames"),
            std::string::npos);
  std::string huge_count = link_message_head(secret, LinkMessageType::kFramesWithBodies, {});
  huge_count.replace(kLinkPrefixBytes, 4, "\xff\xff\xff\xff");
  EXPECT_NE(parse_problem(huge_count + "xx", secret, &message).find("claims 4294967295 bodies"), std::string::npos);
}

TEST(UcxLinkMessages, BodyOwnersAreReadFromEveryFrameOfTheHead) {
  const std::string secret(kLinkSecretBytes, 's');
  const at::Tensor small = at::arange(3, at::kFloat), large = at::arange(40, at::kFloat);
  // Three frames: (seq 4, step 0) all in the head, (4, 1) with a body, (9, 0) with a body
  // after an empty tensor and a small one.
  const std::string f0 = wire_bytes(collective_header(4, 0, {small}), {small});
  const std::string f1 = wire_bytes(collective_header(4, 1, {large}), {large});
  const std::vector<at::Tensor> third = {at::empty({0}), small, large};
  const std::string f2 = wire_bytes(collective_header(9, 0, third), third);
  const uint64_t body0_at = f0.size() + f1.size() - large.nbytes();
  const uint64_t body1_at = f0.size() + f1.size() + f2.size() - large.nbytes();
  const std::string frames = f0 + f1.substr(0, f1.size() - large.nbytes()) + f2.substr(0, f2.size() - large.nbytes());
  // The parsed message points into its bytes, so they live as long as the walk over them.
  auto owners_of = [&](const std::vector<LinkBody>& table, std::vector<LinkBodyOwner>* owners) {
    const std::string bytes = link_message_head(secret, LinkMessageType::kFramesWithBodies, table) + frames;
    LinkMessage message;
    EXPECT_EQ(parse_problem(bytes, secret, &message), "");
    return link_body_owners(message, owners);
  };
  std::vector<LinkBodyOwner> owners;
  ASSERT_TRUE(owners_of({LinkBody{body0_at, large.nbytes(), kLinkBodyTagBit},
                         LinkBody{body1_at, large.nbytes(), kLinkBodyTagBit}},
                        &owners));
  ASSERT_EQ(owners.size(), 2u);
  EXPECT_EQ(owners[0].kind, pg::FrameHeader::COLLECTIVE);
  EXPECT_EQ(owners[0].seq, 4u);
  EXPECT_EQ(owners[0].step, 1u);
  EXPECT_EQ(owners[0].tensor, 0);
  EXPECT_EQ(owners[1].seq, 9u);
  EXPECT_EQ(owners[1].step, 0u);
  EXPECT_EQ(owners[1].tensor, 2);
  // A body that is not one whole tensor where the head says, or that points into a header.
  EXPECT_FALSE(owners_of({LinkBody{body0_at, large.nbytes() - 4, kLinkBodyTagBit},
                          LinkBody{body1_at - 4, large.nbytes(), kLinkBodyTagBit}},
                         &owners));
  EXPECT_FALSE(owners_of({LinkBody{body0_at + 4, large.nbytes(), kLinkBodyTagBit}}, &owners));
  EXPECT_FALSE(owners_of({LinkBody{2, large.nbytes(), kLinkBodyTagBit}}, &owners));
}

TEST(DataPlaneNames, ParseAndName) {
  EXPECT_EQ(parse_data_plane("auto"), DataPlane::kAuto);
  EXPECT_EQ(parse_data_plane("ucx"), DataPlane::kUcx);
  EXPECT_EQ(parse_data_plane("grpc"), DataPlane::kGrpc);
  EXPECT_STREQ(data_plane_name(DataPlane::kUcx), "ucx");
  try {
    parse_data_plane("tcp");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_NE(std::string(e.what()).find("'tcp'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace drpc
