#include "process_group/in_memory_store.h"

#include <condition_variable>
#include <map>
#include <mutex>

#include "common/error.h"

namespace drpc {
namespace {

class InMemoryStoreImpl final : public InMemoryStore {
 public:
  ~InMemoryStoreImpl() override { close(); }

  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open();
      values_[key] = value;
    }
    changed_.notify_all();
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    wait_locked(lock, {key}, timeout);
    return values_.at(key);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result;
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open();
      int64_t current = 0;
      auto it = values_.find(key);
      if (it != values_.end()) {
        size_t parsed = 0;
        try {
          current = std::stoll(it->second, &parsed);
        } catch (const std::exception&) {
          parsed = 0;
        }
        if (parsed == 0 || parsed != it->second.size()) {
          throw Error(ErrorKind::kBadArgument,
                      "store add('" + key + "'): the key holds a value that is not an integer");
        }
      }
      result = current + delta;
      values_[key] = std::to_string(result);
    }
    changed_.notify_all();
    return result;
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    std::string now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_open();
      auto it = values_.find(key);
      const std::string current = it == values_.end() ? std::string() : it->second;
      if (current != expected) return current;
      values_[key] = desired;
      now = desired;
    }
    changed_.notify_all();
    return now;
  }

  bool delete_key(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    check_open();
    return values_.erase(key) > 0;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    wait_locked(lock, keys, timeout);
  }

  int64_t num_keys() override {
    std::lock_guard<std::mutex> lock(mu_);
    check_open();
    return static_cast<int64_t>(values_.size());
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    changed_.notify_all();
  }

 private:
  void check_open() const {
    if (closed_) throw Error(ErrorKind::kShutdown, "the store is closed");
  }

  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout) {
    auto all_set = [&] {
      if (closed_) return true;
      for (const auto& key : keys) {
        if (values_.count(key) == 0) return false;
      }
      return true;
    };
    if (!changed_.wait_for(lock, timeout, all_set)) {
      std::string missing;
      for (const auto& key : keys) {
        if (values_.count(key) == 0) missing += (missing.empty() ? "'" : ", '") + key + "'";
      }
      throw Error(ErrorKind::kTimeout, "store: waited " + std::to_string(timeout.count()) +
                                           " ms for key " + missing);
    }
    check_open();
  }

  std::mutex mu_;
  std::condition_variable changed_;
  // Guarded by mu_.
  std::map<std::string, std::string> values_;
  bool closed_ = false;
};

}  // namespace

std::unique_ptr<InMemoryStore> create_in_memory_store() {
  return std::make_unique<InMemoryStoreImpl>();
}

}  // namespace drpc
