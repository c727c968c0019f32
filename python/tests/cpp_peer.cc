// A C++ worker for mixed-language tests: serves functions that call back into Python
// workers by name, and a TorchScript module as an RRef value (a C++ owner's object).
// Usage: cpp_peer NAME RANK WORLD_SIZE MASTER_PORT

#include <ATen/ATen.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "drpc.h"

// Calls `fn` on `to` (a Python worker, say) with (x, 2.0) from this C++ handler.
DRPC_REGISTER_FUNCTION("cpp.call", [](std::string to, std::string fn, at::Tensor x) {
  return drpc::rpc_sync(to, fn, {x, 2.0}).toTensor();
});
DRPC_REGISTER_FUNCTION("cpp.double", [](at::Tensor x) { return x * 2; });
DRPC_REGISTER_FUNCTION("cpp.name", []() { return drpc::get_worker_info().name; });
// RRefs both ways: fetch one (a Python worker's, say) from here, and hand out one owned here.
DRPC_REGISTER_FUNCTION("cpp.fetch_twice", [](c10::IValue rref) {
  return drpc::RRef::from_ivalue(rref).to_here().toTensor() * 2;
});
DRPC_REGISTER_FUNCTION("cpp.keep", [](at::Tensor x) { return drpc::RRef::make_local(x * 3).to_ivalue(); });
// The module object itself, for remote(): its methods then run here by name.
DRPC_REGISTER_FUNCTION("cpp.load_module", [](std::string path) { return c10::IValue(torch::jit::load(path)._ivalue()); });

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: cpp_peer NAME RANK WORLD_SIZE MASTER_PORT\n";
    return 2;
  }
  drpc::Options options;
  options.master_port = std::atoi(argv[4]);
  options.host_store = false;
  try {
    drpc::init_rpc(argv[1], std::atoi(argv[2]), std::atoi(argv[3]), options);
    drpc::shutdown(true);
  } catch (const std::exception& e) {
    std::cerr << argv[1] << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << argv[1] << ": shut down" << std::endl;
  return 0;
}
