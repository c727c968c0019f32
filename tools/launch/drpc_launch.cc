// Starts N workers of a job on this machine, like `torchrun --nproc_per_node N`:
//   drpc_launch --nproc=3 [--master_port=0] -- BINARY [ARGS...]
// Each worker gets --rank=R --world_size=N --master_addr=127.0.0.1 --master_port=P (a
// free port when 0) and the same in DRPC_RANK, DRPC_WORLD_SIZE, ... Every line a worker
// prints is prefixed with its rank. SIGINT/SIGTERM are forwarded; when one worker fails,
// the others are stopped and the launcher exits with that worker's status.

#include <gflags/gflags.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"

DEFINE_int32(nproc, 2, "how many workers to start");
DEFINE_int32(master_port, 0, "the store's port (0: pick a free one)");

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
  gflags::SetUsageMessage("drpc_launch --nproc=N [--master_port=P] -- BINARY [ARGS...]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc < 2 || FLAGS_nproc < 1) {
    std::cerr << "usage: drpc_launch --nproc=N [--master_port=P] -- BINARY [ARGS...]\n";
    return 2;
  }
  const int port = FLAGS_master_port ? FLAGS_master_port : free_port();
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  std::vector<std::unique_ptr<drpc::Subprocess>> workers;
  std::vector<std::thread> relays;
  for (int r = 0; r < FLAGS_nproc; ++r) {
    std::vector<std::string> args(argv + 1, argv + argc);
    args.push_back("--rank=" + std::to_string(r));
    args.push_back("--world_size=" + std::to_string(FLAGS_nproc));
    args.push_back("--master_addr=127.0.0.1");
    args.push_back("--master_port=" + std::to_string(port));
    int fd = -1;
    try {
      workers.push_back(drpc::Subprocess::start_with_output(
          args,
          {"DRPC_RANK=" + std::to_string(r), "DRPC_WORLD_SIZE=" + std::to_string(FLAGS_nproc),
           "DRPC_MASTER_ADDR=127.0.0.1", "DRPC_MASTER_PORT=" + std::to_string(port)},
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
        std::cout << "drpc_launch: rank " << r << " exited with status " << *code << "; stopping the others"
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
