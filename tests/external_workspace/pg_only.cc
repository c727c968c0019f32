// A consumer's program over the process group alone (@drpc//process_group:grpc and its
// store): two ranks allreduce. Usage: pg_only RANK STORE_PORT
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "process_group/grpc_process_group.h"
#include "process_group/grpc_store.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const int rank = std::atoi(argv[1]), port = std::atoi(argv[2]);
  std::unique_ptr<drpc::StoreServer> server;
  if (rank == 0) server = drpc::start_store_server("127.0.0.1", port);
  auto store = drpc::connect_store("127.0.0.1", port, std::chrono::seconds(30));
  auto group = drpc::create_grpc_process_group(*store, rank, 2, {});
  at::Tensor t = at::full({4}, rank + 1.0);
  group->allreduce(t, drpc::ReduceOp::kSum)->wait();
  const bool ok = t.eq(3).all().item<bool>();
  std::printf("process group rank %d: %s\n", rank, ok ? "ok" : "WRONG");
  group->barrier()->wait();
  group->shutdown();
  return ok ? 0 : 1;
}
