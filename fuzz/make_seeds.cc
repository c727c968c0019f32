// Writes the fuzz targets' seed corpora: real encodings made by drpc's own code. The RRef
// and autograd seeds are the messages that actually reach worker0 of a World while it
// builds its state and exercises the protocols over it (see world.h), so they refer to
// ids the fuzzers' Worlds have too. Run once, check in what it writes:
//   bazel run //fuzz:make_seeds        (writes fuzz/corpus/<target>/ in the workspace)

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "dist_autograd/dist_autograd.h"
#include "common/error_wire.h"
#include "fuzz/world.h"
#include "process_group/frame.h"
#include "process_group/transport.h"
#include "process_group/ucx_link_message.h"
#include "rpc/envelope.h"
#include "rpc/value_codec.h"
#include "rref/proto/rref.pb.h"
#include "rref/rref_context.h"

namespace drpc {
namespace fuzz {
namespace {

namespace fs = std::filesystem;

// One frame as the transports write it (process_group/frame.cc's encode_frame, whose
// format decode_wire_frames reads), its pieces concatenated.
std::string wire_frame(pg::FrameHeader header, const std::vector<at::Tensor>& tensors) {
  struct Concatenated final : FramePieces {
    std::string bytes;
    void add_bytes(size_t size, const std::function<void(uint8_t*)>& fill) override {
      const size_t at = bytes.size();
      bytes.resize(at + size);
      fill(reinterpret_cast<uint8_t*>(bytes.data() + at));
    }
    void add_tensor(const at::Tensor& t) override {
      bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
    }
  } out;
  if (header.kind() != pg::FrameHeader::MESSAGE) describe_tensors(tensors, &header);
  encode_frame(header, tensors, out);
  return out.bytes;
}

// A message as rank 1's process group would frame it: the agent's envelope (as
// ProcessGroupAgent writes a request) with the tensors beside it.
std::string wire_message(const Message& m) {
  rpc::Envelope envelope;
  envelope.set_type(m.type);
  envelope.set_id(kInjectedRequestId);
  Message copy = m;
  pg::FrameHeader header;
  header.set_kind(pg::FrameHeader::MESSAGE);
  header.set_payload(encode_with(envelope, copy));
  std::vector<at::Tensor> tensors;
  for (const auto& t : m.tensors) tensors.push_back(t.contiguous());
  return wire_frame(std::move(header), tensors);
}

void write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
  std::cout << (dir / name).string() << " (" << bytes.size() << " bytes)\n";
}

std::string type_name(int32_t type) {
  static const std::map<int32_t, std::string> names = {
      {kRRefRemoteCall, "remote_call"}, {kRRefFetch, "fetch"},         {kRRefUserDelete, "user_delete"},
      {kRRefForkRequest, "fork_request"}, {kRRefChildAccept, "child_accept"}, {kRRefApply, "apply"}, {kRRefControlBatch, "control_batch"},
      {kAutogradBackward, "backward"},  {kAutogradRelease, "release"}};
  auto it = names.find(type);
  return it == names.end() ? "type" + std::to_string(type) : it->second;
}

// The messages that reach worker0, each kind once (first seen), with or without tensors.
std::vector<Message> record_traffic() {
  std::mutex mu;
  std::vector<Message> seen;
  std::set<std::string> kinds;
  {
    World world([&](const WorkerInfo&, const Message& m) {
      const std::string kind = std::to_string(m.type) + "/" + std::to_string(m.tensors.size()) + "/" +
                               std::to_string(m.extensions.count(kAutogradExtension)) + "/" + std::to_string(m.payload.empty()) +
                               "/" + std::to_string(m.extensions.count(kRRefCarriedControls));
      std::lock_guard<std::mutex> lock(mu);
      if (!kinds.insert(kind).second) return;
      Message copy = m;
      for (auto& t : copy.tensors) t = t.detach().clone();
      seen.push_back(std::move(copy));
    });
    world.build_state();
    world.exercise();
  }
  return seen;
}

void frame_seeds(const fs::path& dir, const std::vector<Message>& traffic) {
  int n = 0;
  for (const auto& m : traffic) {
    if ((m.type == kRRefRemoteCall || m.type == kAutogradBackward) && !m.tensors.empty()) {
      write(dir, "message_" + type_name(m.type) + "_" + std::to_string(n++), wire_message(m));
    }
  }
  pg::FrameHeader p2p;
  p2p.set_kind(pg::FrameHeader::P2P);
  p2p.set_tag(42);
  write(dir, "p2p_two_tensors", wire_frame(p2p, {at::arange(6, at::kFloat).reshape({2, 3}), at::arange(4, at::kLong)}));
  pg::FrameHeader collective;
  collective.set_kind(pg::FrameHeader::COLLECTIVE);
  collective.set_seq(3);
  collective.set_step(1);
  collective.set_collective(2);
  collective.mutable_full()->set_dtype(static_cast<int32_t>(at::kHalf));
  collective.mutable_full()->add_sizes(8);
  collective.mutable_full()->set_nbytes(16);
  write(dir, "collective_chunk",
        wire_frame(collective, {at::ones({4}, at::kHalf), at::empty({0, 3}), at::ones({}, at::kBool), at::ones({1}, at::kComplexDouble)}));
  pg::FrameHeader hello;
  hello.set_kind(pg::FrameHeader::HELLO);
  hello.set_rank(1);
  hello.set_world_size(3);
  hello.set_token("secret");
  hello.set_group("job");
  write(dir, "hello", wire_frame(hello, {}));
  pg::FrameHeader abort;
  abort.set_kind(pg::FrameHeader::ABORT);
  abort.set_seq(9);
  abort.set_error_kind(to_wire(ErrorKind::kTimeout));
  abort.set_payload("allreduce timed out");
  pg::FrameHeader goodbye;
  goodbye.set_kind(pg::FrameHeader::GOODBYE);
  write(dir, "two_frames_abort_goodbye", wire_frame(abort, {}) + wire_frame(goodbye, {}));
}

// link_message_fuzzer's input: [1 if the pair's secret goes first][the rest of the message].
void link_message_seeds(const fs::path& dir) {
  const std::string with_secret(1, '\1');
  write(dir, "probe", with_secret + std::string(1, '\1'));
  pg::FrameHeader p2p;
  p2p.set_kind(pg::FrameHeader::P2P);
  p2p.set_tag(7);
  const std::string frames_type(1, '\0');
  write(dir, "frames_p2p", with_secret + frames_type + wire_frame(p2p, {at::arange(6, at::kFloat)}));
  pg::FrameHeader heartbeat;
  heartbeat.set_kind(pg::FrameHeader::HEARTBEAT);
  write(dir, "frames_two", with_secret + frames_type + wire_frame(heartbeat, {}) + wire_frame(p2p, {}));
  write(dir, "without_secret", std::string(1, '\0') + std::string(16, 'x') + frames_type + wire_frame(p2p, {}));
  // A frame whose 64-float tensor travels as a body: cut out of the frames, listed in the table.
  const std::string whole = wire_frame(p2p, {at::arange(64, at::kFloat)});
  const drpc::LinkBody body{whole.size() - 256, 256, drpc::link_body_tag(std::string(16, '\x5a'), 0)};
  const std::string head = drpc::link_message_head(std::string(16, '\x5a'), drpc::LinkMessageType::kFramesWithBodies,
                                                   {body});
  write(dir, "frames_with_body", with_secret + head.substr(drpc::kLinkSecretBytes) + whole.substr(0, body.offset));
  // The same body waiting in the sender's arena, at the fuzzer's one sent block (the arena's
  // header, then the block's state word: 4096 + 64), and a probe offering an arena.
  const drpc::LinkBody arena_body{body.offset, body.size, 4096 + 64};
  const std::string arena_head = drpc::link_message_head(std::string(16, '\x5a'),
                                                         drpc::LinkMessageType::kFramesWithArenaBodies, {arena_body});
  write(dir, "frames_with_arena_body",
        with_secret + arena_head.substr(drpc::kLinkSecretBytes) + whole.substr(0, body.offset));
  write(dir, "probe_with_arena", with_secret + std::string(1, '\1') + std::string(drpc::kArenaOfferBytes, '\7'));
  // Ring chunks as a collective sends them: a small frame in the head, then two frames whose
  // tensors are bodies (what a receiver places by their seq and step).
  pg::FrameHeader chunk;
  chunk.set_kind(pg::FrameHeader::COLLECTIVE);
  chunk.set_seq(3);
  const std::string small = wire_frame(chunk, {at::arange(4, at::kFloat)});
  chunk.set_step(1);
  const std::string first = wire_frame(chunk, {at::arange(32, at::kFloat)});
  chunk.set_step(2);
  const std::string second = wire_frame(chunk, {at::arange(16, at::kDouble)});
  const drpc::LinkBody chunk1{small.size() + first.size() - 128, 128, drpc::link_body_tag(std::string(16, '\x5a'), 1)};
  const drpc::LinkBody chunk2{small.size() + first.size() + second.size() - 128, 128,
                              drpc::link_body_tag(std::string(16, '\x5a'), 2)};
  const std::string chunks_head = drpc::link_message_head(std::string(16, '\x5a'),
                                                          drpc::LinkMessageType::kFramesWithBodies, {chunk1, chunk2});
  write(dir, "collective_chunks_with_bodies", with_secret + chunks_head.substr(drpc::kLinkSecretBytes) + small +
                                                  first.substr(0, first.size() - 128) +
                                                  second.substr(0, second.size() - 128));
}

void value_seeds(const fs::path& dir) {
  // The value fuzzer's message brings four tensors; seeds refer to at most those.
  auto encoded = [](const c10::IValue& v) {
    std::string out;
    std::vector<at::Tensor> tensors;
    encode_value(v, &out, &tensors, "seed");
    if (tensors.size() > 4) throw std::logic_error("a value seed refers to more than 4 tensors");
    return out;
  };
  write(dir, "scalars", encoded(c10::ivalue::Tuple::create({c10::IValue(), true, int64_t{-7}, 2.5,
                                                             c10::complex<double>(1, -2), std::string("h\xc3\xa9")})));
  write(dir, "typed_lists", encoded(c10::ivalue::Tuple::create(
                                {c10::List<int64_t>({1, 2, 3}), c10::List<double>({0.5}), c10::List<bool>({true, false}),
                                 c10::List<std::string>({"a", "b"}), c10::List<at::Tensor>({at::ones({1}), at::ones({2})})})));
  c10::Dict<std::string, at::Tensor> by_name;
  by_name.insert("w", at::ones({2}));
  by_name.insert("b", at::ones({1}));
  write(dir, "dict_of_tensors", encoded(by_name));
  c10::Dict<int64_t, double> by_int;
  by_int.insert(1, 0.5);
  by_int.insert(-3, 2.0);
  write(dir, "dict_int_keys", encoded(by_int));
  c10::impl::GenericList nested(c10::AnyType::get());
  nested.push_back(c10::List<int64_t>({4}));
  nested.push_back(c10::ivalue::Tuple::create({at::ones({3}), c10::IValue()}));
  c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
  inner.insert("deep", c10::List<int64_t>({1}));
  nested.push_back(inner);
  write(dir, "nested", encoded(nested));
  c10::impl::GenericDict tensor_keys(c10::TensorType::get(), c10::AnyType::get());
  tensor_keys.insert(at::ones({1}), std::string("one"));
  write(dir, "dict_tensor_keys", encoded(tensor_keys));
}

void message_seeds(const fs::path& rref_dir, const fs::path& autograd_dir, const std::vector<Message>& traffic) {
  std::map<std::string, int> count;
  for (const auto& m : traffic) {
    const bool riding = m.extensions.count(kRRefCarriedControls) > 0;
    const bool rref = (m.type >= kRRefRemoteCall && m.type <= kRRefControlBatch) || riding;
    const bool in_context = m.extensions.count(kAutogradExtension) > 0;
    const bool autograd = m.type == kAutogradBackward || m.type == kAutogradRelease || in_context;
    std::string name = type_name(m.type) + (in_context ? "_in_context" : "") + (riding ? "_with_riding_controls" : "");
    name += "_" + std::to_string(count[name]++);
    if (rref) write(rref_dir, name, wire_message(m));
    if (autograd) write(autograd_dir, name, wire_message(m));
  }
  // The controls seen, as one batch (what a peer sends when several are queued for us).
  rref::ControlBatch batch;
  for (const auto& m : traffic) {
    auto riding = m.extensions.find(kRRefCarriedControls);
    if (riding != m.extensions.end()) {
      rref::ControlBatch carried;
      if (!carried.ParseFromString(riding->second)) throw std::logic_error("recorded riding controls are malformed");
      for (const auto& item : carried.items()) *batch.add_items() = item;
    }
    if (m.type != kRRefUserDelete && m.type != kRRefForkRequest && m.type != kRRefChildAccept) continue;
    auto* item = batch.add_items();
    item->set_type(m.type);
    if (!item->mutable_control()->ParseFromString(m.payload)) throw std::logic_error("a recorded control is malformed");
  }
  if (batch.items_size() < 2) throw std::logic_error("the recorded traffic holds fewer than 2 RRef controls");
  write(rref_dir, "control_batch_0", wire_message(Message{kRRefControlBatch, batch.SerializeAsString(), {}}));
}

}  // namespace
}  // namespace fuzz
}  // namespace drpc

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  fs::path out = argc > 1 ? fs::path(argv[1]) : fs::path();
  if (out.empty()) {
    const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
    if (!workspace) {
      std::cerr << "usage: make_seeds OUTPUT_DIR (or bazel run //fuzz:make_seeds)\n";
      return 2;
    }
    out = fs::path(workspace) / "fuzz" / "corpus";
  }
  drpc::fuzz::quiet_logs();
  try {
    const auto traffic = drpc::fuzz::record_traffic();
    drpc::fuzz::frame_seeds(out / "frame", traffic);
    drpc::fuzz::link_message_seeds(out / "link_message");
    drpc::fuzz::value_seeds(out / "value_codec");
    drpc::fuzz::message_seeds(out / "rref", out / "autograd", traffic);
  } catch (const std::exception& e) {
    std::cerr << "make_seeds: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
