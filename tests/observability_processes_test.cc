// Observability with real processes: the trace of a call chain across three worker
// processes, and a drpc_worker's Prometheus endpoint read over real HTTP, with its tagged
// logs and the metrics it logs at shutdown; its /healthz and /state as the job joins, runs
// and loses a worker.

#include <ATen/ATen.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
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

// The body of an HTTP response, and its status line.
std::string body_of(const std::string& response) {
  const size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

// Parses `json` (protobuf's parser: strict JSON); returns the object or fails the test.
google::protobuf::Struct parse_json(const std::string& json) {
  google::protobuf::Struct root;
  auto status = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return root;
}

// GETs `path` until its status line starts with `status` (up to 30 s); the last response.
std::string poll_until(int port, const std::string& path, const std::string& status) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string r;
  while (std::chrono::steady_clock::now() < deadline) {
    r = testing::http_get(port, path);
    if (r.rfind(status, 0) == 0) return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

// A peer's entry in /state's "peers".
google::protobuf::Struct peer_of(const google::protobuf::Struct& state, const std::string& name) {
  for (const auto& p : state.fields().at("peers").list_value().values()) {
    if (p.struct_value().fields().at("name").string_value() == name) return p.struct_value();
  }
  ADD_FAILURE() << "no peer " << name << " in /state";
  return {};
}

TEST(ObservabilityProcesses, HealthzAndStateFollowTheJobOverHttp) {
  // This test hosts the store and is rank 0; drpc_worker processes are ranks 1 to 3.
  auto store = start_store_server("127.0.0.1", 0);
  const std::string master = "DRPC_MASTER_PORT=" + std::to_string(store->port());
  int fd = -1;
  std::unique_ptr<Output> reader;  // declared first: the workers are killed before it is joined
  auto worker1 = Subprocess::start_with_output(
      {testing::runfile("tools/worker/drpc_worker"), "--rank=1", "--world_size=4", "--metrics_port=0"},
      {master, "GLOG_minloglevel=2"}, &fd);
  reader = std::make_unique<Output>(fd);
  const std::string port_text =
      reader->wait_for(std::regex("worker1 serves metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics"),
                       std::chrono::seconds(20));
  ASSERT_FALSE(port_text.empty()) << "no metrics address announced";
  const int port = std::stoi(port_text);

  // Joining: ranks 0, 2 and 3 are not there yet.
  std::string r = testing::http_get(port, "/healthz");
  EXPECT_EQ(r.rfind("HTTP/1.0 503 ", 0), 0u) << r;
  EXPECT_TRUE(contains(r, "joining the job")) << r;
  r = testing::http_get(port, "/state");
  EXPECT_EQ(r.rfind("HTTP/1.0 200 ", 0), 0u) << r;
  EXPECT_TRUE(contains(r, "Content-Type: application/json")) << r;
  EXPECT_EQ(parse_json(body_of(r)).fields().at("state").string_value(), "joining");
  EXPECT_EQ(testing::http_get(port, "/metrics").rfind("HTTP/1.0 503 ", 0), 0u);

  auto worker2 = Subprocess::start({testing::runfile("tools/worker/drpc_worker"), "--rank=2", "--world_size=4"},
                                   {master, "GLOG_minloglevel=2"});
  auto worker3 = Subprocess::start({testing::runfile("tools/worker/drpc_worker"), "--rank=3", "--world_size=4"},
                                   {master, "GLOG_minloglevel=2"});
  Options options;
  options.master_port = store->port();
  options.host_store = false;
  options.init_timeout = std::chrono::seconds(20);
  auto me = Runtime::create("worker0", 0, 4, options);
  const at::Tensor x = at::ones({4});
  EXPECT_TRUE(at::equal(me->rpc_sync("worker1", "aten::neg", {x}).toTensor(), -x));
  EXPECT_TRUE(at::equal(me->rpc_sync("worker2", "aten::neg", {x}).toTensor(), -x));

  // Joined: healthy, every peer alive, nothing in flight.
  r = poll_until(port, "/healthz", "HTTP/1.0 200 ");
  EXPECT_EQ(r.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << r;
  EXPECT_EQ(body_of(r), "ok\n");
  {
    const auto state = parse_json(body_of(testing::http_get(port, "/state")));
    EXPECT_EQ(state.fields().at("worker").string_value(), "worker1");
    EXPECT_EQ(state.fields().at("state").string_value(), "serving");
    EXPECT_TRUE(state.fields().at("healthy").bool_value());
    EXPECT_EQ(state.fields().at("peers").list_value().values_size(), 3);
    const auto w0 = peer_of(state, "worker0");
    EXPECT_EQ(w0.fields().at("state").string_value(), "alive");
    EXPECT_GE(w0.fields().at("last_heard_seconds_ago").number_value(), 0);  // a number: it called
    EXPECT_LT(w0.fields().at("last_heard_seconds_ago").number_value(), 30);
    EXPECT_EQ(peer_of(state, "worker2").fields().at("state").string_value(), "alive");
    EXPECT_EQ(state.fields().at("calls_in_flight").struct_value().fields().at("sent").number_value(), 0);
    EXPECT_EQ(state.fields().at("rrefs").struct_value().fields().at("owners").number_value(), 0);
    EXPECT_EQ(state.fields().at("autograd_contexts").number_value(), 0);
  }
  std::string metrics = body_of(testing::http_get(port, "/metrics"));
  EXPECT_TRUE(contains(metrics, "drpc_peer_up{worker=\"worker1\",peer=\"worker2\"} 1\n")) << metrics;
  EXPECT_TRUE(contains(metrics, "drpc_build_info{worker=\"worker1\",version=\"")) << metrics;

  // A peer stopped by SIGTERM leaves the job (exit 143): worker1 is no longer healthy.
  worker3->kill(SIGTERM);
  ASSERT_EQ(worker3->wait(std::chrono::seconds(30)), std::optional<int>(143));
  r = poll_until(port, "/healthz", "HTTP/1.0 503 ");
  EXPECT_TRUE(contains(body_of(r), "peer gone: worker3 (")) << r;
  {
    const auto state = parse_json(body_of(testing::http_get(port, "/state")));
    // It said goodbye: "left", not "failed", yet gone.
    EXPECT_EQ(peer_of(state, "worker3").fields().at("state").string_value(), "left");
  }

  // A peer killed: worker1 names it too; the others stay alive.
  worker2->kill(SIGKILL);
  ASSERT_TRUE(worker2->wait(std::chrono::seconds(10)).has_value());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    r = testing::http_get(port, "/healthz");
  } while (!contains(r, "worker2 (") && std::chrono::steady_clock::now() < deadline &&
           (std::this_thread::sleep_for(std::chrono::milliseconds(100)), true));
  EXPECT_EQ(r.rfind("HTTP/1.0 503 Service Unavailable\r\n", 0), 0u) << r;
  EXPECT_TRUE(contains(body_of(r), "worker2 (")) << r;
  {
    const auto state = parse_json(body_of(testing::http_get(port, "/state")));
    EXPECT_FALSE(state.fields().at("healthy").bool_value());
    const auto w2 = peer_of(state, "worker2");
    EXPECT_EQ(w2.fields().at("state").string_value(), "failed");
    EXPECT_FALSE(w2.fields().at("reason").string_value().empty());
    EXPECT_EQ(peer_of(state, "worker0").fields().at("state").string_value(), "alive");
  }
  metrics = body_of(testing::http_get(port, "/metrics"));
  EXPECT_TRUE(contains(metrics, "drpc_peer_up{worker=\"worker1\",peer=\"worker2\"} 0\n")) << metrics;
  EXPECT_TRUE(contains(metrics, "drpc_peer_up{worker=\"worker1\",peer=\"worker0\"} 1\n")) << metrics;

  // Calls in flight carry their function, peer and age (this process's own agent: a call
  // to worker1 while it is stopped).
  ASSERT_TRUE(worker1->stop());
  auto fut = me->rpc_async("worker1", "aten::neg", {x});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const MetricsSnapshot snap = me->metrics();
  worker1->kill(SIGCONT);
  ASSERT_EQ(snap.calls_in_flight.size(), 1u);
  EXPECT_EQ(snap.calls_in_flight[0].function, "aten::neg");
  EXPECT_EQ(snap.calls_in_flight[0].peer, "worker1");
  EXPECT_GE(snap.calls_in_flight[0].age_seconds, 0.1);
  fut->wait();
  EXPECT_FALSE(fut->hasError());

  me->shutdown(true);  // workers 2 and 3 are known to be gone: not waited for
  auto code = worker1->wait(std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  // Its own part ended well, but the job lost a worker: it exits 1 naming the failed one
  // (worker3, which left, is not a failure).
  EXPECT_EQ(*code, 1);
  const std::string lost = reader->wait_for(std::regex("drpc_worker: (the job lost worker2: .*)"), std::chrono::seconds(5));
  EXPECT_FALSE(lost.empty()) << reader->all();
}

}  // namespace
}  // namespace drpc
