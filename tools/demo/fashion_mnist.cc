// The main job: an MLP trained on Fashion-MNIST with the model split across workers.
// Rank 0 (the trainer) holds the input layer and the head; every other rank holds one
// hidden block (Linear(256,256) + ReLU) behind RRefs. Forward goes through RPC, backward
// is distributed autograd, the update a DistributedOptimizer (SGD with momentum).
// Started by tools/demo.sh through drpc_launch. Every flag not given reads DRPC_<FLAG>
// (DRPC_EPOCHS, DRPC_LR, ...), then torch's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// LOCAL_RANK and Kubernetes' JOB_COMPLETION_INDEX (tools/flags/env_flags.h), as drpc_worker.
// On a terminal it draws a progress bar; otherwise (a log) it prints a line every
// --log_every steps.
// --profile=FILE writes a Chrome trace (chrome://tracing, Perfetto) of the second training
// step: every RPC of its forward pass, distributed backward, optimizer step and context
// release, with what each worker did for it.

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>

#include <unistd.h>

#include "common/logging.h"
#include "drpc.h"
#include "tools/demo/fashion_mnist_data.h"
#include "tools/flags/env_flags.h"
#include "tools/worker/job_process.h"

// The job's flags (--rank, --world_size, --master_addr, --listen, --token_file, --tls_*,
// --metrics_port, ...) are tools/worker/job_process.h's, as drpc_worker's; these are the
// training's own.
DEFINE_int32(epochs, 2, "training epochs");
DEFINE_int32(batch_size, 64, "batch size");
DEFINE_double(lr, 0.05, "learning rate");
DEFINE_int32(limit, 0, "use only this many training images (0: all)");
DEFINE_int32(test_limit, 0, "use only this many test images (0: all)");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist", "Debian's dataset-fashion-mnist");
DEFINE_string(profile, "", "write a Chrome trace of one training step (the second) to this file");
DEFINE_int32(log_every, 100, "when stdout is not a terminal: print a progress line every this many steps");

namespace {

using Clock = std::chrono::steady_clock;
using drpc::demo::images;
using drpc::demo::read_idx;

at::Tensor init_weight(int64_t out, int64_t in, uint64_t seed) {
  return (at::randn({out, in}, at::detail::createCPUGenerator(seed)) * std::sqrt(2.0 / in)).set_requires_grad(true);
}

std::string worker(int r) { return "worker" + std::to_string(r); }

void train(int world_size) {
  const bool tty = isatty(STDOUT_FILENO);  // a progress bar redrawn in place only on a terminal
  if (!FLAGS_profile.empty() && !std::ofstream(FLAGS_profile)) {  // fail before training, not after
    throw drpc::Error(drpc::ErrorKind::kBadArgument, "--profile: cannot write '" + FLAGS_profile + "'");
  }
  const at::Tensor train_x_all = images(FLAGS_data_dir + "/train-images-idx3-ubyte.gz");
  const at::Tensor train_y_all = read_idx(FLAGS_data_dir + "/train-labels-idx1-ubyte.gz").to(at::kLong);
  at::Tensor test_x = images(FLAGS_data_dir + "/t10k-images-idx3-ubyte.gz");
  at::Tensor test_y = read_idx(FLAGS_data_dir + "/t10k-labels-idx1-ubyte.gz").to(at::kLong);
  if (FLAGS_test_limit > 0 && FLAGS_test_limit < test_x.size(0)) {
    test_x = test_x.narrow(0, 0, FLAGS_test_limit);
    test_y = test_y.narrow(0, 0, FLAGS_test_limit);
  }
  const int64_t n = FLAGS_limit > 0 ? std::min<int64_t>(FLAGS_limit, train_x_all.size(0)) : train_x_all.size(0);
  const at::Tensor train_x = train_x_all.narrow(0, 0, n), train_y = train_y_all.narrow(0, 0, n);
  std::printf("Fashion-MNIST: %ld training and %ld test images; model split over %d workers\n", (long)n,
              (long)test_x.size(0), world_size);

  // Input layer and head here; one hidden block on each other worker.
  at::Tensor w_in = init_weight(256, 784, 1), b_in = at::zeros({256}).set_requires_grad(true);
  at::Tensor w_out = init_weight(10, 256, 2), b_out = at::zeros({10}).set_requires_grad(true);
  std::vector<drpc::RRef> params = {drpc::RRef::make_local(w_in), drpc::RRef::make_local(b_in),
                                    drpc::RRef::make_local(w_out), drpc::RRef::make_local(b_out)};
  std::vector<std::pair<c10::IValue, c10::IValue>> blocks;
  for (int r = 1; r < world_size; ++r) {
    auto wb = drpc::rpc_sync(worker(r), "demo.make_block", {int64_t{r + 10}}).toTupleRef().elements();
    blocks.emplace_back(wb[0], wb[1]);
    params.push_back(drpc::RRef::from_ivalue(wb[0]));
    params.push_back(drpc::RRef::from_ivalue(wb[1]));
  }
  drpc::DistributedOptimizer optimizer(drpc::optim::sgd(FLAGS_lr, 0.9), params);

  auto forward = [&](const at::Tensor& x) {
    at::Tensor h = at::relu(at::addmm(b_in, x, w_in.t()));
    for (size_t i = 0; i < blocks.size(); ++i) {
      h = drpc::rpc_sync(worker(i + 1), "demo.block", {blocks[i].first, blocks[i].second, h}).toTensor();
    }
    return at::addmm(b_out, h, w_out.t());
  };

  for (int epoch = 1; epoch <= FLAGS_epochs; ++epoch) {
    const auto start = Clock::now();
    at::Tensor order = at::randperm(n, at::detail::createCPUGenerator(100 + epoch));
    const int64_t steps = (n + FLAGS_batch_size - 1) / FLAGS_batch_size;
    double running = 0, total = 0;
    for (int64_t s = 0; s < steps; ++s) {
      at::Tensor idx = order.narrow(0, s * FLAGS_batch_size, std::min<int64_t>(FLAGS_batch_size, n - s * FLAGS_batch_size));
      at::Tensor x = train_x.index_select(0, idx), y = train_y.index_select(0, idx);
      // The second step (the first warms up), context release included.
      std::unique_ptr<drpc::Profiler> profiler;
      if (!FLAGS_profile.empty() && epoch == 1 && s == std::min<int64_t>(1, steps - 1)) {
        profiler = std::make_unique<drpc::Profiler>();
      }
      double l;
      drpc::FuturePtr released;
      {
        drpc::dist_autograd::Context ctx;
        at::Tensor loss = at::nll_loss(at::log_softmax(forward(x), 1), y);
        drpc::dist_autograd::backward(ctx.id(), {loss});
        optimizer.step(ctx.id());
        l = loss.item<double>();
        // A step leaves its context's release in flight; the traced one waits for it, so
        // that the trace shows it.
        if (profiler) released = drpc::current_runtime().autograd().release(ctx.id());
      }
      if (profiler) {
        released->wait();
        profiler->write_chrome_trace(FLAGS_profile);
        std::fprintf(stderr, "\ntrace of training step %ld (%zu spans) written to %s\n", static_cast<long>(s + 1),
                     profiler->events().size(), FLAGS_profile.c_str());
      }
      running = s == 0 ? l : 0.98 * running + 0.02 * l;
      total += l;
      if (tty) {
        if (s % 10 == 0 || s == steps - 1) {
          const int width = 30, filled = static_cast<int>(width * (s + 1) / steps);
          std::printf("\repoch %d [%s%s] %3d%% loss %.4f", epoch, std::string(filled, '#').c_str(),
                      std::string(width - filled, '.').c_str(), static_cast<int>(100 * (s + 1) / steps), running);
          std::fflush(stdout);
        }
      } else if ((s + 1) % FLAGS_log_every == 0 || s == steps - 1) {
        std::printf("epoch %d step %ld/%ld loss %.4f\n", epoch, static_cast<long>(s + 1), static_cast<long>(steps),
                    running);
        std::fflush(stdout);
      }
    }
    // Test accuracy, through the same split model, without recording gradients.
    int64_t correct = 0;
    for (int64_t b = 0; b < test_x.size(0); b += 1000) {
      const int64_t m = std::min<int64_t>(1000, test_x.size(0) - b);
      at::Tensor logits = forward(test_x.narrow(0, b, m));
      correct += logits.argmax(1).eq(test_y.narrow(0, b, m)).sum().item<int64_t>();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%sepoch %d: train loss %.4f, test accuracy %.2f%% (%.1f s)\n", tty ? "\n" : "", epoch, total / steps,
                100.0 * correct / test_x.size(0), seconds);
    std::fflush(stdout);
  }
}

}  // namespace

DRPC_REGISTER_FUNCTION("demo.make_block", [](int64_t seed) {
  at::Tensor w = init_weight(256, 256, seed), b = at::zeros({256}).set_requires_grad(true);
  return c10::ivalue::Tuple::create({drpc::RRef::make_local(w).to_ivalue(), drpc::RRef::make_local(b).to_ivalue()});
});
DRPC_REGISTER_FUNCTION("demo.block", [](c10::IValue w, c10::IValue b, at::Tensor x) {
  return at::relu(at::addmm(drpc::RRef::from_ivalue(b).local_value().toTensor(), x,
                            drpc::RRef::from_ivalue(w).local_value().toTensor().t()));
});

int main(int argc, char** argv) {
  // Every call waits for a whole training step of its peer at worst: longer than a worker's.
  gflags::SetCommandLineOptionWithMode("rpc_timeout_ms", "120000", gflags::SET_FLAGS_DEFAULT);
  gflags::ParseCommandLineFlags(&argc, &argv, true);  // refuses malformed flags, naming them
  drpc::job::Settings settings;
  try {
    settings = drpc::job::settings_from_flags();
    drpc::flags::check_range("epochs", FLAGS_epochs, 0, 1000000);
    drpc::flags::check_range("batch_size", FLAGS_batch_size, 1, 1 << 20);
    drpc::flags::check_range("limit", FLAGS_limit, 0, INT32_MAX);
    drpc::flags::check_range("test_limit", FLAGS_test_limit, 0, INT32_MAX);
    drpc::flags::check_range("log_every", FLAGS_log_every, 1, INT32_MAX);
  } catch (const drpc::Error& e) {
    std::cerr << "fashion_mnist: bad setting: " << e.message() << "\n";
    return 2;
  }
  drpc::init_logging(argv[0]);
  at::set_num_threads(1);  // several workers share the machine's cores
  const int rank = settings.rank, world_size = settings.world_size;
  // Rank 0 trains; the others serve its calls until it has shut down too.
  return drpc::job::run("fashion_mnist", worker(rank), settings, [&] {
    if (rank == 0) train(world_size);
  });
}
