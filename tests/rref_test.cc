// RRefs end to end with workers as threads over real gRPC: remote(), to_here(), every
// fork case, deletion observed through the owners' counts, proxies, failures, and the
// protocol under dropped and delayed control messages.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "drpc.h"
#include "process_group/in_memory_store.h"
#include "tests/job.h"
#include "rpc/faulty_agent.h"
#include "rpc/process_group_agent.h"
#include "rref/proto/rref.pb.h"
#include "rref/rref_context.h"

namespace drpc {
namespace {

using testing::Gate;
using testing::Job;
using testing::eventually;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

Gate* g_gate = nullptr;

DRPC_REGISTER_FUNCTION("rref.sum", [](c10::IValue rref) {
  return RRef::from_ivalue(rref).to_here().toTensor().sum().item<double>();
});
DRPC_REGISTER_FUNCTION("rref.is_owner", [](c10::IValue rref) { return RRef::from_ivalue(rref).is_owner(); });
DRPC_REGISTER_FUNCTION("rref.gated_is_owner", [](c10::IValue rref) {
  g_gate->wait();
  return RRef::from_ivalue(rref).is_owner();
});
DRPC_REGISTER_FUNCTION("rref.local_sum", [](c10::IValue rref) {
  return RRef::from_ivalue(rref).local_value().toTensor().sum().item<double>();
});
DRPC_REGISTER_FUNCTION("rref.sum_all", [](c10::IValue list) {
  double total = 0;
  for (const auto& r : list.toListRef()) total += RRef::from_ivalue(r).to_here().toTensor().sum().item<double>();
  return total;
});
DRPC_REGISTER_FUNCTION("rref.make", [](double v) { return RRef::make_local(at::full({2}, v)).to_ivalue(); });
DRPC_REGISTER_FUNCTION("rref.slow_ones", [](int64_t n) {
  g_gate->wait();
  return at::ones({n});
});
DRPC_REGISTER_FUNCTION("rref.fail", []() -> at::Tensor { throw std::runtime_error("no value for you"); });
DRPC_REGISTER_FUNCTION("rref.scale", [](at::Tensor t, double s) { return t * s; });
DRPC_REGISTER_FUNCTION("rref.module", []() {
  torch::jit::Module m("Affine");
  m.register_parameter("w", at::full({2}, 3.0), false);
  m.define(R"(
    def forward(self, x):
        return x * self.w

    def scaled(self, x, s: float):
        return x * self.w * s
  )");
  return c10::IValue(m._ivalue());
});

// No worker owns or references anything any more.
bool all_released(Job& job) {
  for (int r = 0; r < job.size(); ++r) {
    RRefCounts c = job[r].rref_counts();
    if (c.owners || c.owner_values || c.users || c.pending_children || c.pending_users) return false;
  }
  return true;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The drpc::Error `f` throws (kInternal "nothing thrown" if none).
template <typename F>
Error thrown_by(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::kInternal, "nothing thrown");
}

Error error_of(const FuturePtr& future) {
  return thrown_by([&] {
    future->wait();
    future->value();
  });
}

// A fetch of RRef `id` ("creator:counter") sent by `from` to `owner` as the protocol does:
// for ids no handle on `from` refers to any more, or never did.
FuturePtr raw_fetch(Runtime& from, const std::string& owner, const std::string& id, milliseconds timeout) {
  rref::Control control;
  const size_t colon = id.find(':');
  control.mutable_rref()->set_worker(std::stoi(id.substr(0, colon)));
  control.mutable_rref()->set_local(std::stoll(id.substr(colon + 1)));
  return from.agent().send(from.agent().worker(owner), Message{kRRefFetch, control.SerializeAsString(), {}}, timeout,
                           "fetch of RRef " + id);
}

std::string describe_counts(Job& job) {
  std::string out;
  for (int r = 0; r < job.size(); ++r) {
    RRefCounts c = job[r].rref_counts();
    out += "worker" + std::to_string(r) + ": owners=" + std::to_string(c.owners) + " values=" +
           std::to_string(c.owner_values) + " users=" + std::to_string(c.users) + " children=" +
           std::to_string(c.pending_children) + " pending_users=" + std::to_string(c.pending_users) + "\n";
  }
  return out;
}

class RRefTest : public testing::JobOnEveryNetwork<3> {
 protected:
  void TearDown() override {
    EXPECT_TRUE(eventually([this] { return all_released(*job_); })) << describe_counts(*job_);
  }
};

TEST_P(RRefTest, RemoteThenToHere) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2, 2})});
  EXPECT_FALSE(r.is_owner());
  EXPECT_EQ(r.owner_name(), "worker1");
  EXPECT_EQ(r.owner(), 1);
  EXPECT_TRUE(at::equal(r.to_here().toTensor(), at::ones({2, 2})));
  EXPECT_TRUE(eventually([&] { return r.confirmed_by_owner(); }));
  EXPECT_EQ(job[1].rref_counts().owners, 1);
  EXPECT_EQ(job[0].rref_counts().users, 1);
}

TEST_P(RRefTest, ValueIsFreedWhenTheLastUserGoes) {
  Job& job = *job_;
  {
    RRef a = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({3})});
    RRef copy = a;  // copies share one reference
    a.to_here();
    EXPECT_EQ(job[1].rref_counts().owner_values, 1);
  }
  EXPECT_TRUE(eventually([&] { return job[1].rref_counts().owner_values == 0; })) << describe_counts(job);
}

TEST_P(RRefTest, ToHereBeforeTheOwnerHasTheValueWaitsForIt) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  RRef r = job[0].remote("worker1", "rref.slow_ones", {int64_t{4}});
  auto fetched = std::async(std::launch::async, [&] { return r.to_here().toTensor(); });
  EXPECT_EQ(fetched.wait_for(milliseconds(50)), std::future_status::timeout);  // it waits...
  gate.release();
  EXPECT_TRUE(at::equal(fetched.get(), at::ones({4})));  // ...and gets the value once it exists
  g_gate = nullptr;
}

TEST_P(RRefTest, RemoteToOneself) {
  Job& job = *job_;
  RRef r = job[2].remote("worker2", "rref.scale", {at::ones({2}), 5.0});
  EXPECT_TRUE(r.is_owner());
  EXPECT_TRUE(at::equal(r.to_here().toTensor(), at::full({2}, 5.0)));
  EXPECT_TRUE(at::equal(r.local_value().toTensor(), at::full({2}, 5.0)));
}

TEST_P(RRefTest, CreationThatFailsRemotelyRaisesOnUse) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.fail");
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      r.to_here();
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRemote) << e.what();
      EXPECT_NE(std::string(e.what()).find("no value for you"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("worker1"), std::string::npos) << e.what();
    }
  }
  RRef unknown = job[0].remote("worker1", "no.such.function");
  Error e = thrown_by([&] { unknown.to_here(); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();  // the owner's kind, kept
  EXPECT_TRUE(contains(e.what(), "no.such.function")) << e.what();
}

TEST_P(RRefTest, AFailedCreationIsNeverConfirmed) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.fail");
  r.impl().confirmation()->wait();
  EXPECT_FALSE(r.confirmed_by_owner());
  for (const Error& e : {thrown_by([&] { r.to_here(); }), thrown_by([&] { r.rpc_sync("sum"); })}) {
    EXPECT_EQ(e.kind(), ErrorKind::kRemote) << e.what();
    EXPECT_TRUE(contains(e.what(), "creation of RRef " + r.impl().id_string())) << e.what();
    EXPECT_TRUE(contains(e.what(), "no value for you")) << e.what();
  }
}

TEST_P(RRefTest, RemoteTimeoutCoversTheCreationOnTheOwner) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  {
    RRef r = job[0].remote("worker1", "rref.slow_ones", {int64_t{3}}, {}, milliseconds(300));
    gate.wait_for_waiters(1);  // the function runs on the owner, and will not finish in time
    const std::string id = r.impl().id_string();
    auto creation_timed_out = [&](const Error& e) {
      return e.kind() == ErrorKind::kTimeout && contains(e.what(), "creation of RRef " + id) &&
             contains(e.what(), "timed out");
    };
    const auto start = Clock::now();
    // A fetch already waiting fails when the creation times out, not at its own deadline.
    Error fetched = thrown_by([&] { r.to_here(milliseconds(5000)); });
    EXPECT_TRUE(creation_timed_out(fetched)) << fetched.what();
    EXPECT_LT(Clock::now() - start, milliseconds(4000));
    EXPECT_FALSE(r.confirmed_by_owner());
    // Every later use says so too, at once.
    const milliseconds bound(1000);
    for (const Error& e : {thrown_by([&] { r.to_here(bound); }), thrown_by([&] { r.rpc_sync("sum", {}, {}, bound); }),
                           thrown_by([&] { r.remote("sum", {}, {}, bound).to_here(bound); }),
                           thrown_by([&] { job[0].rpc_sync("worker2", "rref.sum", {r.to_ivalue()}, {}, bound); })}) {
      EXPECT_TRUE(creation_timed_out(e)) << e.what();
    }
    gate.release();
  }
  g_gate = nullptr;
}

TEST_P(RRefTest, FetchOfAFreedRRefFailsAtOnceNamingIt) {
  Job& job = *job_;
  std::string created, owned;
  {
    RRef r = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2})});
    r.to_here();
    created = r.impl().id_string();
    RRef local = job[1].make_local(c10::IValue(at::ones({3})));
    EXPECT_EQ(job[1].rpc_sync("worker2", "rref.sum", {local.to_ivalue()}).toDouble(), 3.0);
    owned = local.impl().id_string();
  }
  ASSERT_TRUE(eventually([&] { return job[1].rref_counts().owner_values == 0; })) << describe_counts(job);
  // Asked by its creator, by a third worker (which may have held a fork), and for an RRef
  // the owner made itself: none can ever have a value again.
  for (const auto& [from, id] : std::vector<std::pair<int, std::string>>{{0, created}, {2, created}, {2, owned}}) {
    const auto start = Clock::now();
    Error e = error_of(raw_fetch(job[from], "worker1", id, milliseconds(5000)));
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();
    EXPECT_TRUE(contains(e.what(), "RRef " + id + " does not exist on its owner worker1")) << e.what();
    EXPECT_LT(Clock::now() - start, milliseconds(4000));
  }
  EXPECT_EQ(job[1].rref_counts().owners, 0) << describe_counts(job);  // no empty record was made
}

TEST_P(RRefTest, AWaitingFetchFailsOnceItsCreationCanNoLongerCome) {
  Job& job = *job_;
  RRef first = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({1})});
  first.to_here();
  // remote() takes the RRef's id and then its fork's: worker0's next id is a fork id,
  // never an RRef's.
  const std::string id = first.impl().id_string();
  const std::string never = "0:" + std::to_string(std::stoll(id.substr(id.find(':') + 1)) + 1);
  const int64_t owners = job[1].rref_counts().owners;
  FuturePtr fetch = raw_fetch(job[2], "worker1", never, milliseconds(10000));
  // As far as worker1 can know, worker0's remote call for it may still come: it waits.
  ASSERT_TRUE(eventually([&] { return job[1].rref_counts().owners == owners + 1; })) << describe_counts(job);
  EXPECT_FALSE(fetch->completed());
  RRef later = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({1})});  // a higher id: now it cannot
  Error e = error_of(fetch);
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();
  EXPECT_TRUE(contains(e.what(), "RRef " + never + " does not exist on its owner worker1")) << e.what();
  EXPECT_TRUE(at::equal(later.to_here().toTensor(), at::ones({1})));
}

TEST_P(RRefTest, LocalValueOfAUserNamesThisWorkerAndTheOwner) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2})});
  Error e = thrown_by([&] { r.local_value(); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadArgument) << e.what();
  EXPECT_TRUE(contains(e.what(), "RRef " + r.impl().id_string() + " on worker0")) << e.what();
  EXPECT_TRUE(contains(e.what(), "worker1 is")) << e.what();
}

TEST_P(RRefTest, ProxiesCallTensorMethodsAndScriptMethods) {
  Job& job = *job_;
  RRef tensor = job[0].remote("worker2", "aten::ones", {c10::List<int64_t>({2})});
  EXPECT_TRUE(at::equal(tensor.rpc_sync("add", {at::full({2}, 2.0)}).toTensor(), at::full({2}, 3.0)));
  EXPECT_EQ(tensor.rpc_sync("sum").toTensor().item<double>(), 2.0);
  FuturePtr product = tensor.rpc_async("mul", {4.0});
  product->wait();
  EXPECT_TRUE(at::equal(product->value().toTensor(), at::full({2}, 4.0)));
  RRef derived = tensor.remote("add", {at::ones({2})}, {{"alpha", c10::IValue(int64_t{3})}});
  EXPECT_EQ(derived.owner_name(), "worker2");
  EXPECT_TRUE(at::equal(derived.to_here().toTensor(), at::full({2}, 4.0)));
  RRef local = job[1].make_local(c10::IValue(at::full({3}, 2.0)));  // on the owner itself
  EXPECT_EQ(local.rpc_sync("sum").toTensor().item<double>(), 6.0);
  Error unknown = thrown_by([&] { tensor.rpc_sync("no_such_method"); });
  EXPECT_EQ(unknown.kind(), ErrorKind::kBadArgument) << unknown.what();
  EXPECT_TRUE(contains(unknown.what(), "Tensor") && contains(unknown.what(), "no method 'no_such_method'"))
      << unknown.what();

  RRef module = job[0].remote("worker1", "rref.module");
  EXPECT_TRUE(at::equal(module.rpc_sync("scaled", {at::ones({2}), 2.0}).toTensor(), at::full({2}, 6.0)));
  FuturePtr forward = module.rpc_async("forward", {at::ones({2})});
  forward->wait();
  EXPECT_TRUE(at::equal(forward->value().toTensor(), at::full({2}, 3.0)));
  RRef scaled = module.remote("scaled", {at::ones({2}), 0.5});
  EXPECT_EQ(scaled.owner_name(), "worker1");
  EXPECT_TRUE(at::equal(scaled.to_here().toTensor(), at::full({2}, 1.5)));
  Error missing = thrown_by([&] { module.rpc_sync("no_such_method"); });
  EXPECT_EQ(missing.kind(), ErrorKind::kBadArgument) << missing.what();
  EXPECT_TRUE(contains(missing.what(), "Affine") && contains(missing.what(), "no method 'no_such_method'"))
      << missing.what();
}

TEST_P(RRefTest, OwnerSharesWithAUser) {
  Job& job = *job_;
  RRef local = job[1].make_local(c10::IValue(at::full({4}, 2.0)));
  EXPECT_TRUE(local.is_owner());
  EXPECT_EQ(job[1].rpc_sync("worker2", "rref.sum", {local.to_ivalue()}).toDouble(), 8.0);
  EXPECT_FALSE(job[1].rpc_sync("worker2", "rref.is_owner", {local.to_ivalue()}).toBool());
}

TEST_P(RRefTest, UserSharesWithTheOwner) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.scale", {at::ones({3}), 2.0});
  EXPECT_TRUE(job[0].rpc_sync("worker1", "rref.is_owner", {r.to_ivalue()}).toBool());
  EXPECT_EQ(job[0].rpc_sync("worker1", "rref.local_sum", {r.to_ivalue()}).toDouble(), 6.0);
}

// RRef control messages (alone or batched) `from` sent to `to`.
int64_t controls_sent(Runtime& from, const std::string& to) {
  int64_t sent = 0;
  for (const auto& [key, count] : from.metrics().calls_sent) {
    if (key.first.rfind("RRef control", 0) == 0 && key.second == to) sent += count;
  }
  return sent;
}

// The owner's child accept for an RRef a user passes back to it rides on the call's reply:
// the user keeps nothing pending once the call returns, and no control went back alone.
TEST_P(RRefTest, AnRRefPassedToItsOwnerIsAcceptedOnTheCallsReply) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.scale", {at::ones({3}), 2.0});
  r.to_here();
  const int64_t before = controls_sent(job[1], "worker0");
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(job[0].rpc_sync("worker1", "rref.is_owner", {r.to_ivalue()}).toBool());
    EXPECT_EQ(job[0].rref_counts().pending_children, 0) << "after call " << i;
  }
  EXPECT_EQ(controls_sent(job[1], "worker0"), before);
}

// With no message going back to ride on, the accept leaves alone: the user lets go of the
// reference it kept while the call still runs.
TEST_P(RRefTest, AnAcceptWithNothingToRideOnLeavesAlone) {
  Job& job = *job_;
  Gate gate;
  g_gate = &gate;
  RRef r = job[0].remote("worker1", "rref.scale", {at::ones({3}), 2.0});
  r.to_here();
  auto call = job[0].rpc_async("worker1", "rref.gated_is_owner", {r.to_ivalue()});
  gate.wait_for_waiters(1);
  EXPECT_TRUE(eventually([&] { return job[0].rref_counts().pending_children == 0; })) << describe_counts(job);
  EXPECT_FALSE(call->completed());
  gate.release();
  call->wait();
  EXPECT_TRUE(call->value().toBool());
  g_gate = nullptr;
}

// Controls riding on a message are checked like any other bytes from the network: garbage
// and kinds that never ride are dropped, and the message they came on is still served.
TEST_P(RRefTest, MalformedOrForeignRidingControlsAreDropped) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.scale", {at::ones({3}), 2.0});
  r.to_here();
  // A user delete of worker0's own fork (remote() takes the id after the RRef's for it):
  // applied, it would free the value on worker1.
  const std::string id = r.impl().id_string();
  rref::ControlBatch deletes;
  auto* item = deletes.add_items();
  item->set_type(kRRefUserDelete);
  item->mutable_control()->mutable_rref()->set_worker(0);
  item->mutable_control()->mutable_rref()->set_local(std::stoll(id.substr(id.find(':') + 1)));
  item->mutable_control()->mutable_fork()->set_worker(0);
  item->mutable_control()->mutable_fork()->set_local(std::stoll(id.substr(id.find(':') + 1)) + 1);
  ASSERT_EQ(id.substr(0, 2), "0:");
  rref::Control nobodys_fork;  // the carrier: an accept of a fork nobody made does nothing
  nobodys_fork.mutable_fork()->set_worker(2);
  nobodys_fork.mutable_fork()->set_local(999999);
  for (const std::string& riding : {std::string("\xff\x01garbage"), deletes.SerializeAsString()}) {
    Message m{kRRefChildAccept, nobodys_fork.SerializeAsString(), {}};
    m.extensions[kRRefCarriedControls] = riding;
    FuturePtr reply = job[0].agent().send(job[0].agent().worker("worker1"), std::move(m), milliseconds(10000),
                                          "child accept with riding controls");
    reply->wait();
    EXPECT_FALSE(reply->hasError()) << reply->tryRetrieveErrorMessage();
  }
  EXPECT_TRUE(at::equal(r.to_here().toTensor(), at::full({3}, 2.0)));  // still there
  EXPECT_EQ(job[1].rref_counts().owners, 1);
}

TEST_P(RRefTest, UserSharesWithAThirdWorkerTwiceAndInContainers) {
  Job& job = *job_;
  RRef r = job[0].remote("worker1", "rref.scale", {at::ones({2}), 3.0});
  EXPECT_EQ(job[0].rpc_sync("worker2", "rref.sum", {r.to_ivalue()}).toDouble(), 6.0);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(r.to_ivalue());
  list.push_back(r.to_ivalue());
  EXPECT_EQ(job[0].rpc_sync("worker2", "rref.sum_all", {list}).toDouble(), 12.0);
}

TEST_P(RRefTest, RRefReturnedFromACall) {
  Job& job = *job_;
  RRef r = RRef::from_ivalue(job[0].rpc_sync("worker1", "rref.make", {7.0}));
  EXPECT_EQ(r.owner_name(), "worker1");
  EXPECT_TRUE(at::equal(r.to_here().toTensor(), at::full({2}, 7.0)));
}

TEST_P(RRefTest, ChainOfRemotesThroughAThirdWorker) {
  Job& job = *job_;
  RRef first = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({5})});
  RRef second = job[0].remote("worker2", "rref.sum", {first.to_ivalue()});  // worker2 fetches from worker1
  EXPECT_EQ(second.to_here().toDouble(), 5.0);
}

TEST_P(RRefTest, ProxiesCallMethodsOnTheOwnersValue) {
  Job& job = *job_;
  RRef module = job[0].remote("worker1", "rref.module");
  EXPECT_TRUE(at::equal(module.rpc_sync("forward", {at::ones({2})}).toTensor(), at::full({2}, 3.0)));
  RRef tensor = job[0].remote("worker2", "aten::ones", {c10::List<int64_t>({2})});
  EXPECT_TRUE(at::equal(tensor.rpc_sync("rref.scale", {4.0}).toTensor(), at::full({2}, 4.0)));
  RRef derived = tensor.remote("rref.scale", {10.0});  // stays on worker2
  EXPECT_EQ(derived.owner_name(), "worker2");
  EXPECT_TRUE(at::equal(derived.to_here().toTensor(), at::full({2}, 10.0)));
  try {
    tensor.local_value();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
  }
}

TEST_P(RRefTest, TenThousandRRefsCreatedAndDeleted) {
  Job& job = *job_;
  for (int batch = 0; batch < 20; ++batch) {
    std::vector<RRef> rrefs;
    for (int i = 0; i < 500; ++i) {
      rrefs.push_back(job[i % 2].remote(i % 2 ? "worker2" : "worker1", "aten::ones", {c10::List<int64_t>({1})}));
    }
    EXPECT_TRUE(at::equal(rrefs.back().to_here().toTensor(), at::ones({1})));
  }
  EXPECT_TRUE(eventually([&] { return all_released(job); }, milliseconds(60000))) << describe_counts(job);
}

// The protocol with the fork and delete messages dropped or delayed: nothing is freed
// while someone still holds a reference, and nothing is left once all are gone.
TEST(RRefFaults, DroppedAndDelayedControlMessagesAreRetried) {
  Faults faults;
  faults.drop[kRRefUserDelete] = 3;
  faults.drop[kRRefForkRequest] = 2;
  faults.drop[kRRefChildAccept] = 2;
  faults.delay[kRRefUserDelete] = milliseconds(100);
  faults.delay[kRRefChildAccept] = milliseconds(50);
  register_backend("faulty_rref", [faults](MessagePort& port, Executor& executor, std::vector<WorkerInfo> workers,
                                           const Options& o) {
    AgentOptions agent;
    agent.num_threads = o.num_worker_threads;
    agent.default_timeout = o.rpc_timeout;
    return create_faulty_agent(create_process_group_agent(port, executor, std::move(workers), agent), faults);
  });
  Options options;
  options.backend = "faulty_rref";
  Job job(3, options);
  {
    RRef r = job[0].remote("worker1", "rref.scale", {at::ones({2}), 2.0});
    // Shared on to worker2 (fork request and child accept, both faulty) while worker0
    // drops its own reference at once: the parent must keep it until the owner confirms.
    auto shared = job[0].rpc_async("worker2", "rref.sum", {r.to_ivalue()});
    r = RRef();
    shared->wait();
    EXPECT_EQ(shared->value().toDouble(), 4.0);
  }
  EXPECT_TRUE(eventually([&] { return all_released(job); }, milliseconds(30000))) << describe_counts(job);
  job.shutdown(true);
}

TEST(RRefShutdown, GracefulShutdownDeletesRemainingReferences) {
  Job job(2);
  RRef kept = job[0].remote("worker1", "aten::ones", {c10::List<int64_t>({2})});
  kept.to_here();
  EXPECT_EQ(job[1].rref_counts().owners, 1);
  job.shutdown(true);  // worker0 still holds `kept`: shutdown deletes it
  EXPECT_EQ(job[1].rref_counts().owners, 0) << describe_counts(job);
  EXPECT_EQ(job[1].rref_counts().owner_values, 0);
}

DRPC_ON_EVERY_NETWORK(RRefTest);

}  // namespace
}  // namespace drpc
