#pragma once

#include <functional>
#include <memory>
#include <string>

namespace drpc {

// A minimal HTTP/1.0 endpoint for Prometheus scrapes: GET /metrics answers render() as
// text/plain (exposition format 0.0.4); other paths get 404, other methods 405, requests
// that are not HTTP 400, and 503 if render() throws. One thread serves one connection at
// a time; a client that stalls is dropped after 5 s. Thread-safe.
class MetricsHttpServer {
 public:
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
