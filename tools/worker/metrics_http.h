#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace drpc {

// A minimal HTTP/1.0 endpoint for Prometheus scrapes and probes: GET (or HEAD) of a path
// answers that path's handler; other paths get 404, other methods 405, requests that are
// not HTTP 400, and 503 if the handler throws. One thread serves one connection at a time;
// a client that stalls is dropped after 5 s. Thread-safe.
class MetricsHttpServer {
 public:
  struct Response {
    int code = 200;  // 200, 400, 404, 405 or 503
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
  };
  using Handler = std::function<Response()>;
  // Handlers by path ("/metrics", ...), run on the server's thread.
  static std::unique_ptr<MetricsHttpServer> start(const std::string& host, int port,
                                                  std::map<std::string, Handler> routes);

  // Only GET /metrics, answering render() as Prometheus text (exposition format 0.0.4).
  using Render = std::function<std::string()>;

  // Listens on host:port (port 0: a free one; host "0.0.0.0" or "::" for every address).
  // Throws Error(kBadArgument) naming the address if it cannot.
  static std::unique_ptr<MetricsHttpServer> start(const std::string& host, int port, Render render);

  virtual ~MetricsHttpServer() = default;
  // The port it listens on.
  virtual int port() const = 0;
  // Stops serving (at once, even mid-connection) and closes the socket. Idempotent.
  virtual void stop() = 0;
};

}  // namespace drpc
