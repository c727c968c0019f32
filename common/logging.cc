// The custom prefix API exists in Debian's glog 0.6 but its header hides it behind this.
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#include "common/logging.h"

#include <glog/logging.h>

#include <cstdio>
#include <mutex>

namespace drpc {
namespace {

thread_local const std::string* tls_tag = nullptr;

std::mutex& process_tag_mu() {
  static std::mutex mu;
  return mu;
}
std::string& process_tag() {
  static std::string tag;
  return tag;
}

// glog's own prefix ("I1203 11:20:00.123456 4242 file.cc:12]") followed by the tag.
void prefix(std::ostream& s, const google::LogMessageInfo& l, void*) {
  char head[64];
  std::snprintf(head, sizeof(head), "%c%02d%02d %02d:%02d:%02d.%06d %5d ", l.severity[0], l.time.month() + 1,
                l.time.day(), l.time.hour(), l.time.min(), l.time.sec(), l.time.usec(), l.thread_id);
  s << head << l.filename << ':' << l.line_number << ']';
  if (tls_tag) {
    s << ' ' << *tls_tag;
    return;
  }
  std::lock_guard<std::mutex> lock(process_tag_mu());
  if (!process_tag().empty()) s << ' ' << process_tag();
}

}  // namespace

void init_logging(const char* argv0) { google::InitGoogleLogging(argv0, &prefix, nullptr); }

void set_process_log_tag(const std::string& name, int rank) {
  std::lock_guard<std::mutex> lock(process_tag_mu());
  process_tag() = make_log_tag(name, rank);
}

std::string make_log_tag(const std::string& name, int rank) { return "[" + name + "/" + std::to_string(rank) + "]"; }

ScopedLogTag::ScopedLogTag(const std::string* tag) : previous_(tls_tag) { tls_tag = tag; }
ScopedLogTag::~ScopedLogTag() { tls_tag = previous_; }

}  // namespace drpc
