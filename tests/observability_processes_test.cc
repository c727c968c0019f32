// Observability with real processes: the trace of a call chain across three worker
// processes, and a drpc_worker's Prometheus endpoint read over real HTTP, with its tagged
// logs and the metrics it logs at shutdown.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "common/subprocess.h"
#include "drpc.h"
#include "process_group/grpc_store.h"
#include "testing/errors.h"
#include "testing/http.h"
#include "testing/worker_processes.h"
#include "tests/trace_check.h"

namespace drpc {
namespace {

using testing::contains;

TEST(ObservabilityProcesses, TraceOfACallChainAcrossThreeWorkerProcesses) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/obs_profile.json";
  std::remove(path.c_str());
  setenv("OBS_TRACE_FILE", path.c_str(), 1);  // the workers inherit it
  const auto codes = testing::run_worker_processes("tests/observability_worker", 3, "profile");
  for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "worker" << r;
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "worker0 wrote no trace to " << path;
  std::stringstream json;
  json << in.rdbuf();
  testing::check_chain_trace(json.str());
}

// Everything a child process writes, collected by a thread so the child never blocks.
class Output {
 public:
  explicit Output(int fd) : fd_(fd), thread_([this] { read_all(); }) {}
  ~Output() {
    thread_.join();
    close(fd_);
  }
  // Waits (up to `timeout`) for `pattern` to match; returns the match's first group.
  std::string wait_for(const std::regex& pattern, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    std::smatch m;
    cv_.wait_for(lock, timeout, [&] { return std::regex_search(text_, m, pattern) || closed_; });
    return std::regex_search(text_, m, pattern) ? m[1].str() : "";
  }
  // Everything, once the child closed its end.
  std::string all() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_; });
    return text_;
  }

 private:
  void read_all() {
    char buf[4096];
    for (ssize_t n; (n = read(fd_, buf, sizeof(buf))) > 0;) {
      std::lock_guard<std::mutex> lock(mu_);
      text_.append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;     // guarded by mu_
  bool closed_ = false;  // guarded by mu_
  std::thread thread_;
};

TEST(ObservabilityProcesses, WorkerServesPrometheusMetricsOverHttpAndLogsThemTagged) {
  // This test hosts the store and is rank 0; a drpc_worker process is rank 1.
  auto store = start_store_server("127.0.0.1", 0);
  int fd = -1;
  std::unique_ptr<Output> reader;  // declared first: the worker is killed before it is joined
  auto worker = Subprocess::start_with_output(
      {testing::runfile("tools/worker/drpc_worker"), "--rank=1", "--world_size=2", "--metrics_port=0", "--v=1"},
      {"DRPC_MASTER_PORT=" + std::to_string(store->port()), "GLOG_logtostderr=1", "GLOG_minloglevel=0"}, &fd);
  reader = std::make_unique<Output>(fd);
  Output& output = *reader;
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(20);
  auto me = Runtime::create("worker0", 0, 2, options);
  const std::string port =
      output.wait_for(std::regex("worker1 serves metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics"),
                      std::chrono::seconds(20));
  ASSERT_FALSE(port.empty()) << "no metrics address announced";

  const at::Tensor x = at::ones({16});
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(me->rpc_sync("worker1", "aten::add", {x, x}).toTensor(), x * 2));
  EXPECT_EQ(testing::expect_error([&] { me->rpc_sync("worker1", "no.such.fn"); }).kind(), ErrorKind::kBadArgument);

  const std::string response = testing::http_get(std::stoi(port), "/metrics");
  ASSERT_EQ(response.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << response;
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  const MetricsSnapshot mine = me->metrics();
  for (const std::string& line : {
           std::string("drpc_rpc_calls_received_total{worker=\"worker1\",function=\"aten::add\",peer=\"worker0\"} 3"),
           std::string("drpc_rpc_calls_received_total{worker=\"worker1\",function=\"no.such.fn\",peer=\"worker0\"} 1"),
           std::string("drpc_rpc_errors_total{worker=\"worker1\",direction=\"received\",kind=\"BadArgument\"} 1"),
           std::string("drpc_rpc_handler_seconds_count{worker=\"worker1\",function=\"aten::add\"} 3"),
           // Byte for byte what this process counted from the other side.
           "drpc_rpc_bytes_received_total{worker=\"worker1\",peer=\"worker0\"} " +
               std::to_string(mine.bytes_sent.at("worker1")),
           "drpc_rpc_bytes_sent_total{worker=\"worker1\",peer=\"worker0\"} " +
               std::to_string(mine.bytes_received.at("worker1")),
       }) {
    EXPECT_TRUE(contains(body, line + "\n")) << "missing " << line << " in:\n" << body;
  }
  EXPECT_EQ(testing::http_get(std::stoi(port), "/").rfind("HTTP/1.0 404", 0), 0u);

  me->shutdown(true);  // the worker's graceful shutdown completes with this one
  auto code = worker->wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0);
  const std::string log = output.all();
  // glog's lines (6-digit fractions; gRPC's own have 9) all carry the worker's tag.
  std::istringstream lines(log);
  int glog_lines = 0;
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_search(line, std::regex("^[IWEF][0-9]{4} [0-9:]{8}\\.[0-9]{6} "))) continue;
    ++glog_lines;
    EXPECT_TRUE(contains(line, "] [worker1/1] ")) << line;
  }
  EXPECT_GE(glog_lines, 4);
  EXPECT_TRUE(contains(log, "] [worker1/1] request ")) << "--v=1 logs each request:\n" << log;
  EXPECT_TRUE(contains(log, "] [worker1/1] summary: sent 0 calls (0 failed), received 4 (1 failed)")) << log;
  EXPECT_TRUE(contains(log, "metrics at shutdown:\n")) << log;
  EXPECT_TRUE(contains(
      log, "\ndrpc_rpc_calls_received_total{worker=\"worker1\",function=\"aten::add\",peer=\"worker0\"} 3\n"))
      << log;
  // Once the job is quiet nothing is in flight. (Earlier, a reply can reach this process
  // before the worker has counted its request as done.)
  EXPECT_TRUE(contains(log, "\ndrpc_rpc_in_flight{worker=\"worker1\",direction=\"received\"} 0\n")) << log;
}

}  // namespace
}  // namespace drpc
