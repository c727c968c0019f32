// Starts the workers of a job on this machine, like `torchrun --nproc_per_node N`:
//   drpc_launch --nproc=3 [--master_port=0] -- BINARY [ARGS...]
// and on several machines, like torchrun's static rendezvous, one launcher per machine:
//   drpc_launch --nnodes=2 --node_rank=K --master_addr=HOST0 --master_port=29500 --nproc=3 -- BINARY ...
// (the workers then need --listen / --advertise addresses the other machines can reach).
// Worker L of node K gets rank K * nproc + L of nnodes * nproc: --rank=R --world_size=W
// --master_addr=A --master_port=P (a free port when 0, on one node only), and the same in
// DRPC_RANK, DRPC_WORLD_SIZE, DRPC_MASTER_ADDR, DRPC_MASTER_PORT, DRPC_LOCAL_RANK and
// torch's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK, LOCAL_WORLD_SIZE. The
// launcher's own flags read DRPC_<FLAG> (and MASTER_ADDR, MASTER_PORT) when not given.
// Every line a worker prints is prefixed with its rank. SIGINT/SIGTERM are forwarded; when
// one worker fails, the others are stopped and the launcher exits with that worker's
// status (a worker stopped by SIGTERM exits 143).

#include <gflags/gflags.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/subprocess.h"
#include "tools/flags/env_flags.h"

DEFINE_int32(nproc, 2, "how many workers to start on this machine");
DEFINE_int32(nnodes, 1, "how many machines run a launcher for this job");
DEFINE_int32(node_rank, 0, "this machine's index among them (rank 0's machine hosts the store)");
DEFINE_string(master_addr, "127.0.0.1", "the address of node 0, where rank 0 serves the store");
DEFINE_int32(master_port, 0, "the store's port (0: pick a free one; required with --nnodes > 1)");

namespace {

std::atomic<int> g_signal{0};
void on_signal(int signal) { g_signal = signal; }

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::mutex g_print_mu;

// Copies `fd` to stdout line by line, each line prefixed with "[rank R] ".
void relay(int rank, int fd) {
  std::string pending;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    pending.append(buf, n);
    size_t nl;
    while ((nl = pending.find_first_of("\n\r")) != std::string::npos) {
      std::lock_guard<std::mutex> lock(g_print_mu);
      // A carriage return (progress bars) is kept, so the line redraws in place.
      std::cout << "[rank " << rank << "] " << pending.substr(0, nl) << pending[nl] << std::flush;
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) {
    std::lock_guard<std::mutex> lock(g_print_mu);
    std::cout << "[rank " << rank << "] " << pending << std::endl;
  }
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: drpc_launch [--nnodes=N --node_rank=K --master_addr=A] --nproc=N [--master_port=P] -- BINARY [ARGS...]";
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(&argc, &argv, true);  // refuses malformed flags, naming them
  try {
    drpc::flags::from_environment({{"master_addr", {"MASTER_ADDR"}}, {"master_port", {"MASTER_PORT"}}});
    drpc::flags::check_range("nproc", FLAGS_nproc, 1, 4096);
    drpc::flags::check_range("nnodes", FLAGS_nnodes, 1, 65536);
    drpc::flags::check_range("node_rank", FLAGS_node_rank, 0, FLAGS_nnodes - 1);
    drpc::flags::check_range("master_port", FLAGS_master_port, FLAGS_nnodes > 1 ? 1 : 0, 65535);
    if (FLAGS_master_addr.empty()) throw drpc::Error(drpc::ErrorKind::kBadArgument, "--master_addr is empty");
  } catch (const drpc::Error& e) {
    std::cerr << "drpc_launch: " << e.message()
              << (FLAGS_nnodes > 1 && FLAGS_master_port == 0 ? " (every node must be told the store's port)" : "")
              << "\n"
              << usage << "\n";
    return 2;
  }
  if (argc < 2) {
    std::cerr << usage << "\n";
    return 2;
  }
  const int port = FLAGS_master_port ? FLAGS_master_port : free_port();
  const int world_size = FLAGS_nnodes * FLAGS_nproc;
  const std::string addr = FLAGS_master_addr, port_text = std::to_string(port), size_text = std::to_string(world_size);
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  std::vector<std::unique_ptr<drpc::Subprocess>> workers;
  std::vector<std::thread> relays;
  for (int local = 0; local < FLAGS_nproc; ++local) {
    const int r = FLAGS_node_rank * FLAGS_nproc + local;
    const std::string rank_text = std::to_string(r), local_text = std::to_string(local);
    std::vector<std::string> args(argv + 1, argv + argc);
    args.push_back("--rank=" + rank_text);
    args.push_back("--world_size=" + size_text);
    args.push_back("--master_addr=" + addr);
    args.push_back("--master_port=" + port_text);
    int fd = -1;
    try {
      workers.push_back(drpc::Subprocess::start_with_output(
          args,
          {"DRPC_RANK=" + rank_text, "DRPC_WORLD_SIZE=" + size_text, "DRPC_MASTER_ADDR=" + addr,
           "DRPC_MASTER_PORT=" + port_text, "DRPC_LOCAL_RANK=" + local_text, "RANK=" + rank_text,
           "WORLD_SIZE=" + size_text, "MASTER_ADDR=" + addr, "MASTER_PORT=" + port_text, "LOCAL_RANK=" + local_text,
           "LOCAL_WORLD_SIZE=" + std::to_string(FLAGS_nproc)},
          &fd));
    } catch (const std::exception& e) {
      std::cerr << "drpc_launch: " << e.what() << "\n";
      return 2;
    }
    relays.emplace_back(relay, r, fd);
  }
  // Wait for all; the first failure (or a signal) stops the rest.
  int status = 0;
  std::vector<bool> done(workers.size(), false);
  size_t remaining = workers.size();
  while (remaining > 0) {
    if (int s = g_signal.exchange(0)) {
      for (size_t r = 0; r < workers.size(); ++r) {
        if (!done[r]) workers[r]->kill(s);
      }
    }
    for (size_t r = 0; r < workers.size(); ++r) {
      if (done[r]) continue;
      auto code = workers[r]->wait(std::chrono::milliseconds(remaining == workers.size() ? 50 : 20));
      if (!code) continue;
      done[r] = true;
      --remaining;
      if (*code != 0 && status == 0) {
        status = *code;
        std::lock_guard<std::mutex> lock(g_print_mu);
        std::cout << "drpc_launch: rank " << FLAGS_node_rank * FLAGS_nproc + r << " exited with status " << *code << "; stopping the others"
                  << std::endl;
        for (size_t o = 0; o < workers.size(); ++o) {
          if (!done[o]) workers[o]->kill(SIGTERM);
        }
      }
    }
  }
  for (auto& t : relays) t.join();
  return status;
}
