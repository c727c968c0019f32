// The parameter-server pattern users of torch.distributed.rpc know: rank 0 holds the
// model (a softmax classifier on Fashion-MNIST) behind an RRef; every other rank is a
// trainer that, on its own shard of the data, fetches the current weights through the
// RRef, computes gradients locally and sends them back asynchronously. The server
// applies each update as it arrives (no barrier between trainers).
//   drpc_launch --nproc=3 -- parameter_server [--epochs=1] [--limit=N]
// Flags not given read DRPC_<FLAG>, then torch's and Kubernetes' names (tools/flags).

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "drpc.h"
#include "tools/demo/fashion_mnist_data.h"
#include "tools/flags/env_flags.h"

DEFINE_int32(rank, -1, "this worker's rank");
DEFINE_int32(world_size, -1, "workers: one server and the trainers");
DEFINE_string(master_addr, "127.0.0.1", "where rank 0 serves the store");
DEFINE_int32(master_port, 29500, "the store's port");
DEFINE_int32(epochs, 1, "passes of each trainer over its shard");
DEFINE_int32(batch_size, 64, "batch size");
// 0.1 made the linear model's loss jump around (784 standardized inputs), and where it
// ended depended on how the trainers' stale updates interleaved.
DEFINE_double(lr, 0.01, "learning rate of the server's updates");
DEFINE_int32(limit, 0, "use only this many training images (0: all)");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist", "Debian's dataset-fashion-mnist");

namespace {

// Serializes the server's updates and counts them (the weights live in the RRef's value).
std::mutex g_update_mu;
int64_t g_updates = 0;
// ps.updates_reach callers, by the count they wait for (under g_update_mu).
std::multimap<int64_t, drpc::FuturePtr> g_update_waiters;

}  // namespace

// On the server, through the model's RRef (its value: a tuple of weight and bias).
DRPC_REGISTER_FUNCTION("ps.model", []() {
  auto weights = c10::ivalue::Tuple::create({at::zeros({10, 784}), at::zeros({10})});
  return drpc::RRef::make_local(c10::IValue(weights)).to_ivalue();
});
DRPC_REGISTER_FUNCTION("ps.get_weights", [](c10::IValue model) {
  std::lock_guard<std::mutex> lock(g_update_mu);
  const auto& t = model.toTupleRef().elements();
  return c10::ivalue::Tuple::create({t[0].toTensor().clone(), t[1].toTensor().clone()});
});
DRPC_REGISTER_FUNCTION("ps.apply_gradients", [](c10::IValue model, at::Tensor grad_w, at::Tensor grad_b) {
  std::vector<drpc::FuturePtr> reached;
  int64_t updates;
  {
    std::lock_guard<std::mutex> lock(g_update_mu);
    const auto& t = model.toTupleRef().elements();
    t[0].toTensor().sub_(grad_w, FLAGS_lr);
    t[1].toTensor().sub_(grad_b, FLAGS_lr);
    updates = ++g_updates;
    for (auto it = g_update_waiters.begin(); it != g_update_waiters.end() && it->first <= updates;) {
      reached.push_back(it->second);
      it = g_update_waiters.erase(it);
    }
  }
  for (auto& f : reached) f->markCompleted(c10::IValue(updates));  // sends their replies: not under the lock
  return updates;
});
// Answers once the server has applied `count` updates (from any trainers), without holding
// a handler thread meanwhile.
DRPC_REGISTER_ASYNC_FUNCTION("ps.updates_reach", [](int64_t count) {
  auto reached = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
  std::lock_guard<std::mutex> lock(g_update_mu);
  if (g_updates >= count) {
    reached->markCompleted(c10::IValue(g_updates));
  } else {
    g_update_waiters.emplace(count, reached);
  }
  return reached;
});

namespace {

void train(int rank, int world_size) {
  using drpc::demo::images;
  using drpc::demo::read_idx;
  const int trainers = world_size - 1;
  at::Tensor x_all = images(FLAGS_data_dir + "/train-images-idx3-ubyte.gz");
  at::Tensor y_all = read_idx(FLAGS_data_dir + "/train-labels-idx1-ubyte.gz").to(at::kLong);
  const int64_t n = FLAGS_limit > 0 ? std::min<int64_t>(FLAGS_limit, x_all.size(0)) : x_all.size(0);
  const int64_t shard = n / trainers, begin = (rank - 1) * shard;
  at::Tensor x = x_all.narrow(0, begin, shard), y = y_all.narrow(0, begin, shard);
  drpc::RRef model = drpc::RRef::from_ivalue(drpc::rpc_sync("worker0", "ps.model"));
  int64_t last_update = 0;
  for (int epoch = 1; epoch <= FLAGS_epochs; ++epoch) {
    double total = 0;
    int64_t steps = 0;
    drpc::FuturePtr pending;
    for (int64_t b = 0; b < shard; b += FLAGS_batch_size, ++steps) {
      const int64_t m = std::min<int64_t>(FLAGS_batch_size, shard - b);
      auto wb = model.rpc_sync("ps.get_weights").toTupleRef().elements();
      at::Tensor w = wb[0].toTensor().set_requires_grad(true), bias = wb[1].toTensor().set_requires_grad(true);
      at::Tensor loss = at::nll_loss(at::log_softmax(at::addmm(bias, x.narrow(0, b, m), w.t()), 1), y.narrow(0, b, m));
      loss.backward();
      total += loss.item<double>();
      if (pending) {  // at most one update of this trainer in flight
        pending->wait();
        last_update = pending->value().toInt();
      }
      pending = model.rpc_async("ps.apply_gradients", {w.grad(), bias.grad()});
    }
    if (pending) {
      pending->wait();
      last_update = pending->value().toInt();
    }
    std::printf("trainer %d epoch %d: train loss %.4f over %ld steps (server at update %ld)\n", rank, epoch,
                total / steps, (long)steps, (long)last_update);
    std::fflush(stdout);
  }
  if (rank == 1) {  // one trainer reports the shared model's test accuracy, once every trainer's updates are in
    const int64_t steps_per_trainer = (shard + FLAGS_batch_size - 1) / FLAGS_batch_size * FLAGS_epochs;
    const int64_t updates = drpc::rpc_sync("worker0", "ps.updates_reach", {steps_per_trainer * trainers}).toInt();
    at::Tensor tx = images(FLAGS_data_dir + "/t10k-images-idx3-ubyte.gz");
    at::Tensor ty = read_idx(FLAGS_data_dir + "/t10k-labels-idx1-ubyte.gz").to(at::kLong);
    auto wb = model.rpc_sync("ps.get_weights").toTupleRef().elements();
    at::Tensor logits = at::addmm(wb[1].toTensor(), tx, wb[0].toTensor().t());
    std::printf("test accuracy %.2f%% after %ld updates\n", 100.0 * logits.argmax(1).eq(ty).sum().item<int64_t>() / tx.size(0),
                (long)updates);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  try {
    drpc::flags::from_environment();
    if (FLAGS_rank >= 0 && FLAGS_world_size >= 2) {
      drpc::flags::check_range("rank", FLAGS_rank, 0, FLAGS_world_size - 1);
      drpc::flags::check_range("batch_size", FLAGS_batch_size, 1, 1 << 20);
    }
  } catch (const drpc::Error& e) {
    std::fprintf(stderr, "parameter_server: bad setting: %s\n", e.message().c_str());
    return 2;
  }
  google::InitGoogleLogging(argv[0]);
  if (FLAGS_rank < 0 || FLAGS_world_size < 2) {
    std::fprintf(stderr, "parameter_server: --rank and --world_size >= 2 are required\n");
    return 2;
  }
  at::set_num_threads(1);
  try {
    drpc::Options options;
    options.master_addr = FLAGS_master_addr;
    options.master_port = FLAGS_master_port;
    drpc::init_rpc("worker" + std::to_string(FLAGS_rank), FLAGS_rank, FLAGS_world_size, options);
    if (FLAGS_rank > 0) train(FLAGS_rank, FLAGS_world_size);
    drpc::shutdown(true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker%d: %s\n", FLAGS_rank, e.what());
    return 1;
  }
  return 0;
}
