// Tokens and TLS on the store and between ranks, with real gRPC on real ports.

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"
#include "process_group/in_memory_store.h"
#include "process_group/proto/frame.pb.h"
#include "process_group/security.h"
#include "process_group/testing/thread_group.h"
#include "testing/errors.h"
#include "testing/tls_certs.h"

namespace drpc {
namespace {

using std::chrono::milliseconds;
using testing::contains;
using testing::expect_error;

const testing::TlsCerts& certs() {
  static const testing::TlsCerts certs = testing::make_tls_certs(testing::make_temp_dir("certs"));
  return certs;
}

SecurityOptions job_tls() {
  SecurityOptions s;
  s.tls_cert_file = certs().cert;
  s.tls_key_file = certs().key;
  s.tls_ca_file = certs().ca;
  return s;
}

SecurityOptions impostor_tls() {
  SecurityOptions s;
  s.tls_cert_file = certs().impostor_cert;
  s.tls_key_file = certs().impostor_key;
  s.tls_ca_file = certs().ca;  // trusts the job's CA, but its own certificate is not the job's
  return s;
}

TEST(Token, ComesFromAFileOrTheEnvironmentNeverEmptyFile) {
  const std::string dir = testing::make_temp_dir("token");
  std::ofstream(dir + "/token") << "s3cret\n";
  EXPECT_EQ(read_job_token(dir + "/token", "DRPC_TEST_TOKEN"), "s3cret");
  setenv("DRPC_TEST_TOKEN", "from-env", 1);
  EXPECT_EQ(read_job_token("", "DRPC_TEST_TOKEN"), "from-env");
  unsetenv("DRPC_TEST_TOKEN");
  EXPECT_EQ(read_job_token("", "DRPC_TEST_TOKEN"), "");
  std::ofstream(dir + "/empty") << "\n";
  Error e = expect_error([&] { read_job_token(dir + "/empty", "DRPC_TEST_TOKEN"); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "is empty")) << e.what();
  e = expect_error([&] { read_job_token(dir + "/missing", "DRPC_TEST_TOKEN"); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), dir + "/missing")) << e.what();
}

TEST(Token, MatchesOnlyTheSameBytes) {
  EXPECT_TRUE(token_matches("abc", "abc"));
  EXPECT_FALSE(token_matches("abd", "abc"));
  EXPECT_FALSE(token_matches("ab", "abc"));
  EXPECT_FALSE(token_matches("abcd", "abc"));
  EXPECT_FALSE(token_matches("", "abc"));
}

TEST(Tls, NeedsAllThreeFiles) {
  SecurityOptions s;
  s.tls_cert_file = "/x.pem";
  Error e = expect_error([&] { s.tls(); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "certificate, a key and a CA")) << e.what();
  s.tls_key_file = "/x.key";
  s.tls_ca_file = "/nonexistent-ca.pem";
  e = expect_error([&] { start_store_server("127.0.0.1", 0, s); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  EXPECT_TRUE(contains(e.what(), "/nonexistent-ca.pem")) << e.what();
}

TEST(StoreSecurity, CallsWithoutTheTokenAreRefusedAndChangeNothing) {
  SecurityOptions server_side;
  server_side.token = "job-secret";
  auto server = start_store_server("127.0.0.1", 0, server_side);
  auto intruder = connect_store("127.0.0.1", server->port(), milliseconds(5000));
  Error e = expect_error([&] { intruder->set("model", "evil"); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnauthenticated) << e.what();
  EXPECT_TRUE(contains(e.what(), "token")) << e.what();
  SecurityOptions wrong;
  wrong.token = "job-secreT";
  auto guesser = connect_store("127.0.0.1", server->port(), milliseconds(5000), wrong);
  EXPECT_EQ(expect_error([&] { guesser->add("counter", 1); }).kind(), ErrorKind::kUnauthenticated);
  EXPECT_EQ(expect_error([&] { guesser->get("model", milliseconds(10)); }).kind(), ErrorKind::kUnauthenticated);

  auto member = connect_store("127.0.0.1", server->port(), milliseconds(5000), server_side);
  EXPECT_EQ(member->num_keys(), 0);  // nothing the intruders sent was applied
  member->set("model", "good");
  EXPECT_EQ(member->get("model", milliseconds(1000)), "good");
  EXPECT_EQ(member->add("counter", 2), 2);
}

TEST(StoreSecurity, TlsStoreServesTheJobAndRefusesOthers) {
  auto server = start_store_server("127.0.0.1", 0, job_tls());
  auto member = connect_store("127.0.0.1", server->port(), milliseconds(10000), job_tls());
  member->set("k", "v");
  EXPECT_EQ(member->get("k", milliseconds(1000)), "v");

  // Plaintext and foreign certificates never get a connection.
  Error e = expect_error([&] { connect_store("127.0.0.1", server->port(), milliseconds(1500)); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  e = expect_error([&] { connect_store("127.0.0.1", server->port(), milliseconds(1500), impostor_tls()); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  EXPECT_TRUE(contains(e.what(), "TLS")) << e.what();
}

TEST(ProcessGroupSecurity, TlsGroupWithTokenRunsCollectives) {
  GrpcProcessGroupOptions options;
  options.security = job_tls();
  options.security.token = "t0ken";
  options.timeout = milliseconds(20000);
  testing::ThreadGroup group = testing::make_thread_group(3, options);
  auto failures = testing::run_on_ranks(group, [](ProcessGroup& g) {
    at::Tensor t = at::full({1000}, double(g.rank() + 1));
    g.allreduce(t, ReduceOp::kSum)->wait();
    if (!at::equal(t, at::full({1000}, 6.0))) throw std::runtime_error("wrong allreduce over TLS");
    at::Tensor big = at::full({1 << 20}, double(g.rank()));  // the chunked ring path
    g.allreduce(big, ReduceOp::kMax)->wait();
    if (big[0].item<double>() != 2.0) throw std::runtime_error("wrong ring allreduce over TLS");
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

// Runs rank 1 with `good` and rank 0 with `bad` (rank 0 dials rank 1): rank 0 must fail
// with `kind` and rank 1 never completes a group.
void expect_refused(const GrpcProcessGroupOptions& good, const GrpcProcessGroupOptions& bad, ErrorKind kind,
                    const std::string& mentioned) {
  auto store = create_in_memory_store();
  std::unique_ptr<ProcessGroup> rank1;
  std::thread t([&] {
    try {
      rank1 = create_grpc_process_group(*store, 1, 2, good);
    } catch (const Error&) {
    }
  });
  Error e = expect_error([&] { create_grpc_process_group(*store, 0, 2, bad); });
  EXPECT_EQ(e.kind(), kind) << e.what();
  EXPECT_TRUE(contains(e.what(), mentioned)) << e.what();
  t.join();
  EXPECT_EQ(rank1, nullptr);
}

TEST(ProcessGroupSecurity, WrongTokenIsRefused) {
  GrpcProcessGroupOptions good, bad;
  good.security.token = "secret";
  bad.security.token = "guess";
  good.timeout = bad.timeout = milliseconds(3000);
  expect_refused(good, bad, ErrorKind::kUnauthenticated, "token");
}

TEST(ProcessGroupSecurity, ForeignCertificateIsRefused) {
  GrpcProcessGroupOptions good, bad;
  good.security = job_tls();
  bad.security = impostor_tls();
  good.timeout = bad.timeout = milliseconds(3000);
  expect_refused(good, bad, ErrorKind::kTimeout, "did not connect");
}

TEST(ProcessGroupSecurity, PlaintextPeerIsRefusedByATlsGroup) {
  GrpcProcessGroupOptions good, bad;
  good.security = job_tls();
  good.timeout = bad.timeout = milliseconds(3000);
  expect_refused(good, bad, ErrorKind::kTimeout, "did not connect");
}

TEST(ProcessGroupSecurity, RightCertificateWrongTokenIsRefused) {
  GrpcProcessGroupOptions good, bad;
  good.security = bad.security = job_tls();
  good.security.token = "right";
  bad.security.token = "wrong";
  good.timeout = bad.timeout = milliseconds(5000);
  expect_refused(good, bad, ErrorKind::kUnauthenticated, "token");
}

// Stands in for rank 1: takes rank 0's hello, then ends the stream the way gRPC ends it
// when the connection breaks (the peer's process went away, say): UNAVAILABLE, "Socket
// closed". That is not a refusal.
class DroppingPeer final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { StartRead(&hello_); }
      void OnReadDone(bool) override { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed")); }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer hello_;
    };
    return new Reactor;
  }
};

TEST(ProcessGroupSecurity, AConnectionThatBreaksDuringTheHandshakeIsNotARefusal) {
  DroppingPeer peer;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&peer);
  auto server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto store = create_in_memory_store();
  store->set("addr/1", "127.0.0.1:" + std::to_string(port));
  GrpcProcessGroupOptions options;  // no token: nothing to refuse
  options.timeout = milliseconds(20000);
  Error e = expect_error([&] { create_grpc_process_group(*store, 0, 2, options); });
  EXPECT_EQ(e.kind(), ErrorKind::kPeerUnavailable) << e.what();
  EXPECT_TRUE(contains(e.what(), "rank 1 (127.0.0.1:" + std::to_string(port) + ")")) << e.what();
  EXPECT_TRUE(contains(e.what(), "Socket closed")) << e.what();
  EXPECT_FALSE(contains(e.what(), "refused")) << e.what();
  server->Shutdown();
}

// Appends one frame as the transport puts it on the wire: [u32 length][header][bytes].
void append_frame(const pg::FrameHeader& header, const std::string& body, std::string* out) {
  const std::string bytes = header.SerializeAsString();
  const uint32_t length = static_cast<uint32_t>(bytes.size());
  out->append(reinterpret_cast<const char*>(&length), 4);
  out->append(bytes);
  out->append(body);
}

// Opens a raw stream to a rank's server, writes each of `messages` and returns how the
// call ended.
grpc::Status raw_exchange(const std::string& address, const std::vector<std::string>& messages) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue cq;
  void* tag;
  bool ok;
  auto call = stub.PrepareCall(&context, "/drpc.pg.Peer/Exchange", &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (const auto& message : messages) {
    grpc::Slice slice(message);
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    if (!ok) break;  // the server has finished the call
  }
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));  // ends when the server finishes the call
  cq.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  return status;
}

// An intruder without the token dials a rank directly, posing as rank 0, and sends a
// tensor behind its hello: it is refused, and the rank never receives that tensor.
TEST(ProcessGroupSecurity, NothingATokenlessPeerSendsIsDelivered) {
  auto store = create_in_memory_store();
  GrpcProcessGroupOptions options;
  options.security.token = "secret";
  options.timeout = milliseconds(20000);
  std::unique_ptr<ProcessGroup> rank1;
  std::thread t([&] { rank1 = create_grpc_process_group(*store, 1, 2, options); });
  const std::string address = store->get("addr/1", milliseconds(20000));

  pg::FrameHeader hello;
  hello.set_kind(pg::FrameHeader::HELLO);
  hello.set_rank(0);
  hello.set_world_size(2);
  hello.set_group(options.group_name);
  hello.set_token("guess");
  pg::FrameHeader payload;
  payload.set_kind(pg::FrameHeader::P2P);
  payload.set_tag(7);
  auto* meta = payload.add_tensors();
  meta->set_dtype(static_cast<int>(at::kFloat));
  meta->add_sizes(1);
  meta->set_nbytes(4);
  const float evil = 666.0f;
  std::string first, second;
  append_frame(hello, "", &first);
  append_frame(payload, std::string(reinterpret_cast<const char*>(&evil), 4), &second);
  // The tensor both in its own message after the hello and in the hello's message.
  const grpc::Status alone = raw_exchange(address, {first, second});
  EXPECT_EQ(alone.error_code(), grpc::StatusCode::UNAUTHENTICATED) << alone.error_message();
  const grpc::Status status = raw_exchange(address, {first + second});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_TRUE(contains(alone.error_message(), "token")) << alone.error_message();

  auto rank0 = create_grpc_process_group(*store, 0, 2, options);  // the real rank 0
  t.join();
  ASSERT_NE(rank1, nullptr);
  rank0->send({at::full({1}, 1.0f)}, 1, 7)->wait();
  at::Tensor got = at::zeros({1});
  rank1->recv({got}, 0, 7)->wait();
  EXPECT_EQ(got.item<float>(), 1.0f);  // the real rank's tensor, never the intruder's
}

}  // namespace
}  // namespace drpc
