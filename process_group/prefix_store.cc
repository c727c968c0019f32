#include "process_group/prefix_store.h"

namespace drpc {
namespace {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix) + "/"), base_(base) {}

  void set(const std::string& key, const std::string& value) override {
    base_.set(prefix_ + key, value);
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_.get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_.add(prefix_ + key, delta);
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return base_.compare_set(prefix_ + key, expected, desired);
  }
  bool delete_key(const std::string& key) override { return base_.delete_key(prefix_ + key); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    base_.wait(prefixed, timeout);
  }
  // Counts every key of the base store: a store keeps no index by prefix.
  int64_t num_keys() override { return base_.num_keys(); }

 private:
  const std::string prefix_;
  Store& base_;
};

}  // namespace

std::unique_ptr<Store> create_prefix_store(std::string prefix, Store& base) {
  return std::make_unique<PrefixStore>(std::move(prefix), base);
}

}  // namespace drpc
