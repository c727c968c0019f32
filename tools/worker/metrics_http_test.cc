// The metrics endpoint on a real loopback socket, spoken to with real HTTP.

#include "tools/worker/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include "common/error.h"
#include "testing/http.h"

namespace drpc {
namespace {

using testing::http_exchange;
using testing::http_get;

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(MetricsHttp, AnswersGetMetricsWithTheRenderedText) {
  std::atomic<int> renders{0};
  auto server = MetricsHttpServer::start("127.0.0.1", 0, [&] {
    ++renders;
    return "drpc_test_total{worker=\"w0\"} " + std::to_string(renders.load()) + "\n";
  });
  ASSERT_GT(server->port(), 0);
  std::string r = http_get(server->port(), "/metrics");
  EXPECT_TRUE(starts_with(r, "HTTP/1.0 200 OK\r\n")) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Length: 31\r\n"), std::string::npos) << r;  // the body's length
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "drpc_test_total{worker=\"w0\"} 1\n");
  r = http_get(server->port(), "/metrics?name[]=x");  // scrapers may add parameters
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "drpc_test_total{worker=\"w0\"} 2\n");
  r = http_exchange(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(starts_with(r, "HTTP/1.0 200 OK\r\n")) << r;
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), "");
  EXPECT_EQ(renders.load(), 3);
}

TEST(MetricsHttp, BadRequestsGetClearStatusesAndTheServerGoesOn) {
  bool fail = false;
  auto server = MetricsHttpServer::start("127.0.0.1", 0, [&]() -> std::string {
    if (fail) throw Error(ErrorKind::kShutdown, "the worker is gone");
    return "ok 1\n";
  });
  EXPECT_TRUE(starts_with(http_get(server->port(), "/"), "HTTP/1.0 404 Not Found\r\n"));
  EXPECT_TRUE(starts_with(http_exchange(server->port(), "POST /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.0 405"));
  EXPECT_TRUE(starts_with(http_exchange(server->port(), "hello\r\n\r\n"), "HTTP/1.0 400"));
  EXPECT_TRUE(starts_with(http_exchange(server->port(), std::string(20000, 'x')), "HTTP/1.0 400"));
  fail = true;
  const std::string r = http_get(server->port(), "/metrics");
  EXPECT_TRUE(starts_with(r, "HTTP/1.0 503")) << r;
  EXPECT_NE(r.find("the worker is gone"), std::string::npos) << r;
  fail = false;
  EXPECT_TRUE(starts_with(http_get(server->port(), "/metrics"), "HTTP/1.0 200"));
}

TEST(MetricsHttp, AStalledClientDoesNotHoldUpStop) {
  auto server = MetricsHttpServer::start("127.0.0.1", 0, [] { return std::string("x 1\n"); });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(send(fd, "GET /met", 8, 0), 8);  // and never the rest
  const auto start = std::chrono::steady_clock::now();
  server->stop();
  server->stop();  // idempotent
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  close(fd);
}

TEST(MetricsHttp, AnAddressItCannotUseIsABadArgumentNamingIt) {
  auto first = MetricsHttpServer::start("127.0.0.1", 0, [] { return std::string(); });
  try {
    MetricsHttpServer::start("127.0.0.1", first->port(), [] { return std::string(); });
    FAIL() << "a port in use was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first->port())), std::string::npos) << e.what();
  }
  try {
    MetricsHttpServer::start("not an address", 0, [] { return std::string(); });
    FAIL() << "a bad host was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    EXPECT_NE(std::string(e.what()).find("not an address"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MetricsHttpServer::start("127.0.0.1", 70000, [] { return std::string(); }), Error);
}

}  // namespace
}  // namespace drpc
