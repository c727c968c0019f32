#include "tools/worker/metrics_http.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace drpc {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kClientTimeout = std::chrono::seconds(5);
constexpr size_t kMaxRequest = 8192;

const char* reason(int code) {
  switch (code) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 500: return "Internal Server Error";
    default: return "Service Unavailable";
  }
}

class Server final : public MetricsHttpServer {
 public:
  Server(int listen_fd, int port, std::map<std::string, Handler> routes)
      : listen_fd_(listen_fd), port_(port), routes_(std::move(routes)) {
    if (pipe2(wake_, O_CLOEXEC) != 0) {
      close(listen_fd_);
      throw Error(ErrorKind::kInternal, std::string("metrics server: pipe: ") + std::strerror(errno));
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~Server() override { stop(); }

  int port() const override { return port_; }

  void stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    const char c = 0;
    while (write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    close(listen_fd_);
    close(wake_[0]);
    close(wake_[1]);
  }

 private:
  // Waits until `fd` has `events`: false at the deadline or when stopping.
  bool wait(int fd, short events, Clock::time_point deadline) {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd fds[2] = {{fd, events, 0}, {wake_[0], POLLIN, 0}};
      const int n = poll(fds, 2, static_cast<int>(left));
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      if (fds[1].revents) return false;
      if (fds[0].revents) return true;
    }
  }

  void loop() {
    while (true) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        LOG(ERROR) << "metrics server: poll: " << std::strerror(errno);
        return;
      }
      if (fds[1].revents) return;
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) continue;  // the client left already, or out of descriptors for a moment
      serve(conn);
      linger_close(conn);
    }
  }

  // Closing with unread request bytes would reset the connection and could destroy the
  // response before the client reads it: signal the end, then drain (briefly) first.
  void linger_close(int conn) {
    shutdown(conn, SHUT_WR);
    const auto deadline = Clock::now() + std::chrono::seconds(1);
    char buf[4096];
    for (size_t drained = 0; drained < 65536 && wait(conn, POLLIN, deadline);) {
      const ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
      if (n > 0) drained += static_cast<size_t>(n);
    }
    close(conn);
  }

  void serve(int conn) {
    const auto deadline = Clock::now() + kClientTimeout;
    std::string request;
    char buf[1024];
    while (request.find("\r\n\r\n") == std::string::npos && request.find("\n\n") == std::string::npos) {
      if (request.size() > kMaxRequest) return respond(conn, 400, "request too long\n", false, deadline);
      if (!wait(conn, POLLIN, deadline)) return;
      const ssize_t n = recv(conn, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) break;  // closed: serve what came, if anything
      request.append(buf, static_cast<size_t>(n));
    }
    if (request.empty()) return;
    // "METHOD TARGET HTTP/x.y"
    const std::string line = request.substr(0, request.find_first_of("\r\n"));
    const size_t sp1 = line.find(' '), sp2 = line.find(' ', sp1 + 1);
    if (sp1 == std::string::npos || sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      return respond(conn, 400, "not an HTTP request\n", false, deadline);
    }
    const std::string method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const bool head = method == "HEAD";
    if (method != "GET" && !head) return respond(conn, 405, "only GET\n", false, deadline);
    const std::string path = target.substr(0, target.find('?'));
    auto route = routes_.find(path);
    if (route == routes_.end()) {
      std::string paths;
      for (const auto& [p, h] : routes_) paths += (paths.empty() ? "" : ", ") + p;
      return respond(conn, {404, "text/plain; charset=utf-8", "not found; this server answers " + paths + "\n"}, head,
                     deadline);
    }
    Response response;
    try {
      response = route->second();
    } catch (const std::exception& e) {
      response = {503, "text/plain; charset=utf-8", std::string("unavailable: ") + e.what() + "\n"};
    }
    respond(conn, response, head, deadline);
  }

  void respond(int conn, int code, const std::string& body, bool head, Clock::time_point deadline) {
    respond(conn, {code, "text/plain; charset=utf-8", body}, head, deadline);
  }

  void respond(int conn, const Response& r, bool head, Clock::time_point deadline) {
    std::string out = "HTTP/1.0 " + std::to_string(r.code) + " " + reason(r.code) + "\r\n";
    out += "Content-Type: " + r.content_type + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n";
    if (!head) out += r.body;
    size_t sent = 0;
    while (sent < out.size()) {
      const ssize_t n = send(conn, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait(conn, POLLOUT, deadline)) return;
      } else {
        return;  // the client went away
      }
    }
  }

  const int listen_fd_;
  const int port_;
  const std::map<std::string, Handler> routes_;
  int wake_[2] = {-1, -1};  // written once by stop()
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;  // guarded by stop_mu_
};

}  // namespace

std::unique_ptr<MetricsHttpServer> MetricsHttpServer::start(const std::string& host, int port, Render render) {
  std::map<std::string, Handler> routes;
  routes["/metrics"] = [render = std::move(render)] {
    return Response{200, "text/plain; version=0.0.4; charset=utf-8", render()};
  };
  return start(host, port, std::move(routes));
}

std::unique_ptr<MetricsHttpServer> MetricsHttpServer::start(const std::string& host, int port,
                                                            std::map<std::string, Handler> routes) {
  const std::string where = host + ":" + std::to_string(port);
  if (port < 0 || port > 65535) throw Error(ErrorKind::kBadArgument, "metrics port " + std::to_string(port) + " is out of range");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw Error(ErrorKind::kBadArgument, "cannot serve metrics on " + where + ": " + gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) throw Error(ErrorKind::kBadArgument, "cannot serve metrics on " + where + ": " + why);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                       : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_unique<Server>(fd, actual, std::move(routes));
}

}  // namespace drpc
