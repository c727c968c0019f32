// The UCX links on their own (no gRPC): real UCX workers in this process, frames in order,
// large tensors, the SWITCH gate, and messages without the pair's secret dropped.

#include "process_group/ucx_links.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "process_group/frame.h"

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
  void on_link_probe(int source) override {
    std::lock_guard<std::mutex> lock(mu_);
    probes.push_back(source);
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

  Pair() {
    std::string why;
    rank0 = create_ucx_links(0, 2, DataPlane::kAuto, sink0, &why);
    rank1 = create_ucx_links(1, 2, DataPlane::kAuto, sink1, &why);
    if (!rank0 || !rank1) throw std::runtime_error("UCX did not start: " + why);
  }
};

TEST(UcxLinks, ProbeThenFramesInOrderOnceOpened) {
  Pair pair;
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0));
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
      ASSERT_EQ(f.header.tensors_size(), 1);
      const at::Tensor received = tensor_from_body(f, f.header.tensors(0), 0);
      EXPECT_TRUE(received.equal(large)) << "frame " << i;
      // Used where it landed: the sender aligned it, so the receiver copied nothing.
      ASSERT_EQ(f.body.size(), 1u);
      EXPECT_GE(static_cast<const uint8_t*>(received.data_ptr()), f.body[0].data) << "frame " << i;
      EXPECT_LT(static_cast<const uint8_t*>(received.data_ptr()), f.body[0].data + f.body[0].size);
    }
    if (i % 5 == 1) {
      EXPECT_TRUE(tensor_from_body(f, f.header.tensors(0), 0).equal(at::full({3}, static_cast<float>(i))));
    }
  }
  EXPECT_TRUE(pair.sink1.failures.empty());
}

TEST(UcxLinks, MessagesWithoutThePairsSecretAreDropped) {
  Pair pair;
  pair.rank1->open_inbound(0);
  // An intruder that knows rank 1's UCX address, and claims to be rank 0, but not the secret.
  RecordingSink intruder_sink;
  std::string why;
  auto intruder = create_ucx_links(0, 2, DataPlane::kAuto, intruder_sink, &why);
  ASSERT_NE(intruder, nullptr) << why;
  intruder->connect(1, pair.rank1->address(), std::string(kLinkSecretBytes, 'x'));
  SentCounter sent;
  for (int i = 0; i < 3; ++i) intruder->send(1, p2p_header(100 + i, {}), {}, sent.callback());
  ASSERT_TRUE(sent.wait_for(3));  // written into rank 1's queue, ahead of what follows
  // Then the real rank 0: only its frames arrive, and its probe; the intruder's probe does not.
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0));
  pair.rank0->send(1, p2p_header(7, {}), {}, nullptr);
  ASSERT_TRUE(pair.sink1.wait([&] { return pair.sink1.frames.size() == 1; }));
  EXPECT_EQ(pair.sink1.frames[0].header.tag(), 7);
  EXPECT_EQ(pair.sink1.probes, std::vector<int>{0});
  EXPECT_TRUE(pair.sink1.failures.empty());
  intruder->shutdown();
}

TEST(UcxLinks, SendsFailOncePeerFailedAndAfterShutdown) {
  Pair pair;
  pair.rank0->connect(1, pair.rank1->address(), pair.rank1->inbound_secret(0));
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
  EXPECT_THROW(pair.rank1->connect(0, pair.rank0->address(), pair.rank0->inbound_secret(1)), Error);
}

TEST(UcxLinks, ConnectRejectsBadPeersAndSecrets) {
  Pair pair;
  EXPECT_THROW(pair.rank0->connect(0, pair.rank1->address(), pair.rank1->inbound_secret(0)), Error);
  EXPECT_THROW(pair.rank0->connect(2, pair.rank1->address(), pair.rank1->inbound_secret(0)), Error);
  EXPECT_THROW(pair.rank0->connect(1, pair.rank1->address(), "short"), Error);
  EXPECT_THROW(pair.rank0->send(1, p2p_header(1, {}), {}, nullptr), Error);  // not connected
}

TEST(UcxLinkMessages, DecodeChecksPrefixSecretTypeAndFrames) {
  const std::string secret(kLinkSecretBytes, 's');
  auto decode = [&](const std::string& bytes, bool* probe, std::vector<Frame>* frames) {
    std::string problem;
    const bool ok = decode_link_message(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), secret,
                                        nullptr, 0, probe, frames, &problem);
    return ok ? std::string() : problem;
  };
  bool probe = false;
  std::vector<Frame> frames;
  EXPECT_EQ(decode(link_message_prefix(secret, true), &probe, &frames), "");
  EXPECT_TRUE(probe);
  EXPECT_NE(decode("short", &probe, &frames).find("shorter than its prefix"), std::string::npos);
  EXPECT_NE(decode(link_message_prefix(std::string(kLinkSecretBytes, 't'), true), &probe, &frames).find("secret"),
            std::string::npos);
  EXPECT_NE(decode(link_message_prefix(secret, true) + "x", &probe, &frames).find("probe carries"),
            std::string::npos);
  std::string unknown = link_message_prefix(secret, false);
  unknown.back() = 9;
  EXPECT_NE(decode(unknown, &probe, &frames).find("unknown message type 9"), std::string::npos);
  EXPECT_NE(decode(link_message_prefix(secret, false), &probe, &frames).find("without frames"), std::string::npos);
  EXPECT_NE(decode(link_message_prefix(secret, false) + "\xff\xff\xff\x7f", &probe, &frames), "");
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
