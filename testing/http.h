#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace drpc {
namespace testing {

// Sends `request` (raw bytes) to 127.0.0.1:`port` over a fresh TCP connection and returns
// everything the server sends until it closes. Throws std::runtime_error if it cannot
// connect or the server stalls for 10 s.
inline std::string http_exchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
  }
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      close(fd);
      throw std::runtime_error("no answer from 127.0.0.1:" + std::to_string(port) + " within 10 s");
    }
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return response;
}

// A real HTTP/1.0 GET of `path` on 127.0.0.1:`port`: the whole response, headers included.
inline std::string http_get(int port, const std::string& path) {
  return http_exchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

}  // namespace testing
}  // namespace drpc
