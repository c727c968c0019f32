#include "process_group/grpc_store.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include "common/error.h"
#include "process_group/grpc_security.h"
#include "process_group/in_memory_store.h"
#include "process_group/proto/store.grpc.pb.h"

namespace drpc {
namespace {

namespace pb = ::drpc::store;
using std::chrono::milliseconds;

// Maps what the in-memory store throws to a gRPC status the client maps back.
template <typename Fn>
grpc::Status run_mapping_errors(Fn&& fn) {
  try {
    fn();
    return grpc::Status::OK;
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::kTimeout:
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, e.message());
      case ErrorKind::kBadArgument:
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.message());
      case ErrorKind::kShutdown:
        return grpc::Status(grpc::StatusCode::CANCELLED, e.message());
      default:
        return grpc::Status(grpc::StatusCode::INTERNAL, e.message());
    }
  }
}

class StoreService final : public pb::Store::Service {
 public:
  StoreService(InMemoryStore& state, std::string token) : state_(state), token_(std::move(token)) {}

  grpc::Status Set(grpc::ServerContext* ctx, const pb::SetRequest* req, pb::Empty*) override {
    return serve(ctx, [&] { state_.set(req->key(), req->value()); });
  }
  grpc::Status Get(grpc::ServerContext* ctx, const pb::KeyRequest* req, pb::ValueReply* rep) override {
    return serve(ctx, [&] { rep->set_value(state_.get(req->key(), milliseconds(req->timeout_ms()))); });
  }
  grpc::Status Add(grpc::ServerContext* ctx, const pb::AddRequest* req, pb::AddReply* rep) override {
    return serve(ctx, [&] { rep->set_value(state_.add(req->key(), req->delta())); });
  }
  grpc::Status CompareSet(grpc::ServerContext* ctx, const pb::CompareSetRequest* req,
                          pb::ValueReply* rep) override {
    return serve(ctx, [&] {
      rep->set_value(state_.compare_set(req->key(), req->expected(), req->desired()));
    });
  }
  grpc::Status DeleteKey(grpc::ServerContext* ctx, const pb::KeyRequest* req,
                         pb::DeleteReply* rep) override {
    return serve(ctx, [&] { rep->set_existed(state_.delete_key(req->key())); });
  }
  grpc::Status Wait(grpc::ServerContext* ctx, const pb::WaitRequest* req, pb::Empty*) override {
    return serve(ctx, [&] {
      state_.wait({req->keys().begin(), req->keys().end()}, milliseconds(req->timeout_ms()));
    });
  }
  grpc::Status NumKeys(grpc::ServerContext* ctx, const pb::Empty*, pb::NumKeysReply* rep) override {
    return serve(ctx, [&] { rep->set_count(state_.num_keys()); });
  }

 private:
  // Runs `fn` for an authenticated caller; maps what the in-memory store throws to a gRPC
  // status the client maps back.
  template <typename Fn>
  grpc::Status serve(grpc::ServerContext* ctx, Fn&& fn) {
    if (!token_.empty()) {
      const auto presented = ctx->client_metadata().find(kTokenMetadataKey);
      const std::string token = presented == ctx->client_metadata().end()
                                    ? std::string()
                                    : std::string(presented->second.data(), presented->second.size());
      if (!token_matches(token, token_)) {
        LOG(WARNING) << "store: refused a call from " << ctx->peer() << ": wrong or missing job token";
        return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong or missing job token");
      }
    }
    return run_mapping_errors(std::forward<Fn>(fn));
  }

  InMemoryStore& state_;
  const std::string token_;
};

class GrpcStoreServer final : public StoreServer {
 public:
  GrpcStoreServer(const std::string& host, int port, const SecurityOptions& security)
      : state_(create_in_memory_store()), service_(*state_, security.token) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(host + ":" + std::to_string(port), server_credentials(security), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      throw Error(ErrorKind::kBadArgument,
                  "store server cannot listen on " + host + ":" + std::to_string(port));
    }
  }
  ~GrpcStoreServer() override { shutdown(); }

  int port() const override { return port_; }

  void shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!server_) return;
    state_->close();  // wakes blocked Get/Wait handlers first, so Shutdown need not wait
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(100));
    server_->Wait();
    server_.reset();
  }

 private:
  std::unique_ptr<InMemoryStore> state_;
  StoreService service_;
  int port_ = 0;
  std::mutex mu_;
  std::unique_ptr<grpc::Server> server_;  // guarded by mu_
};

class GrpcStoreClient final : public Store {
 public:
  GrpcStoreClient(const std::string& host, int port, milliseconds connect_timeout,
                  const SecurityOptions& security)
      : address_(host + ":" + std::to_string(port)), token_(security.token) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Reconnect quickly while the master is still starting up.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    auto credentials = channel_credentials(security, &args);
    channel_ = grpc::CreateCustomChannel(address_, credentials, args);
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + connect_timeout)) {
      throw Error(ErrorKind::kPeerUnavailable,
                  "cannot reach the store at " + address_ + " within " +
                      std::to_string(connect_timeout.count()) + " ms" +
                      (security.tls() ? " (TLS: is the store's certificate signed by our CA, and ours by its?)"
                                      : ""));
    }
    stub_ = pb::Store::NewStub(channel_);
  }

  void set(const std::string& key, const std::string& value) override {
    pb::SetRequest req;
    req.set_key(key);
    req.set_value(value);
    pb::Empty rep;
    call("set('" + key + "')", kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->Set(ctx, req, &rep);
    });
  }

  std::string get(const std::string& key, milliseconds timeout) override {
    pb::KeyRequest req;
    req.set_key(key);
    req.set_timeout_ms(timeout.count());
    pb::ValueReply rep;
    call("get('" + key + "')", timeout + kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->Get(ctx, req, &rep);
    });
    return rep.value();
  }

  int64_t add(const std::string& key, int64_t delta) override {
    pb::AddRequest req;
    req.set_key(key);
    req.set_delta(delta);
    pb::AddReply rep;
    call("add('" + key + "')", kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->Add(ctx, req, &rep);
    });
    return rep.value();
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    pb::CompareSetRequest req;
    req.set_key(key);
    req.set_expected(expected);
    req.set_desired(desired);
    pb::ValueReply rep;
    call("compare_set('" + key + "')", kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->CompareSet(ctx, req, &rep);
    });
    return rep.value();
  }

  bool delete_key(const std::string& key) override {
    pb::KeyRequest req;
    req.set_key(key);
    pb::DeleteReply rep;
    call("delete_key('" + key + "')", kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->DeleteKey(ctx, req, &rep);
    });
    return rep.existed();
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    pb::WaitRequest req;
    for (const auto& key : keys) req.add_keys(key);
    req.set_timeout_ms(timeout.count());
    pb::Empty rep;
    call("wait", timeout + kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->Wait(ctx, req, &rep);
    });
  }

  int64_t num_keys() override {
    pb::Empty req;
    pb::NumKeysReply rep;
    call("num_keys", kCallMargin, [&](grpc::ClientContext* ctx) {
      return stub_->NumKeys(ctx, req, &rep);
    });
    return rep.count();
  }

 private:
  // Time allowed beyond a call's own wait for the round trip to the server.
  static constexpr milliseconds kCallMargin{10000};

  template <typename Rpc>
  void call(const std::string& what, milliseconds deadline, Rpc&& rpc) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    if (!token_.empty()) ctx.AddMetadata(kTokenMetadataKey, token_);
    const grpc::Status status = rpc(&ctx);
    if (status.ok()) return;
    const std::string where = "store " + what + " at " + address_ + ": ";
    switch (status.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        throw Error(ErrorKind::kTimeout, where + status.error_message());
      case grpc::StatusCode::INVALID_ARGUMENT:
        throw Error(ErrorKind::kBadArgument, where + status.error_message());
      case grpc::StatusCode::CANCELLED:
        throw Error(ErrorKind::kShutdown, where + status.error_message());
      case grpc::StatusCode::UNAUTHENTICATED:
        throw Error(ErrorKind::kUnauthenticated, where + "refused: " + status.error_message());
      case grpc::StatusCode::UNAVAILABLE:
        throw Error(ErrorKind::kPeerUnavailable, where + "unreachable (" +
                                                     status.error_message() + ")");
      default:
        throw Error(ErrorKind::kInternal, where + status.error_message());
    }
  }

  const std::string address_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Store::Stub> stub_;
};

}  // namespace

std::unique_ptr<StoreServer> start_store_server(const std::string& host, int port,
                                                const SecurityOptions& security) {
  return std::make_unique<GrpcStoreServer>(host, port, security);
}

std::unique_ptr<Store> connect_store(const std::string& host, int port, milliseconds connect_timeout,
                                     const SecurityOptions& security) {
  return std::make_unique<GrpcStoreClient>(host, port, connect_timeout, security);
}

}  // namespace drpc
