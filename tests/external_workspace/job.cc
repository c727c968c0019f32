// A consumer's program over @drpc//:drpc: rank 0 calls a function registered here on
// rank 1, and a builtin through an RRef. Usage: job RANK STORE_PORT
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "drpc.h"

DRPC_REGISTER_FUNCTION("consumer.twice", [](at::Tensor t) { return t * 2; });

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int rank = std::atoi(argv[1]);
  drpc::Options options;
  options.master_port = std::atoi(argv[2]);
  drpc::init_rpc("worker" + std::to_string(rank), rank, 2, options);
  int status = 0;
  if (rank == 0) {
    const at::Tensor twice = drpc::rpc_sync("worker1", "consumer.twice", {at::ones({3})}).toTensor();
    drpc::RRef r = drpc::remote("worker1", "aten::add", {at::ones({2}), at::ones({2})});
    const double sum = twice.sum().item<double>() + r.to_here().toTensor().sum().item<double>();
    std::printf("consumer job: %s (%g)\n", sum == 10 ? "ok" : "WRONG", sum);
    status = sum == 10 ? 0 : 1;
  }
  drpc::shutdown(true);
  return status;
}
