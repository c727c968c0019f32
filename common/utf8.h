#pragma once

#include <string>

namespace drpc {

// `s` with every byte that does not begin a well-formed UTF-8 sequence replaced by U+FFFD:
// for formats that must be UTF-8 (JSON, Prometheus labels) carrying names from peers.
inline std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = cont(i + 1) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      len = i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi && cont(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      len = i + 1 < n && p[i + 1] >= lo && p[i + 1] <= hi && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace drpc
