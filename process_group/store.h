#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace drpc {

// A rendezvous key-value store shared by every process of a job. All methods are
// thread-safe. Failures throw drpc::Error: kTimeout when a wait passes its deadline,
// kPeerUnavailable when the store's server cannot be reached, kShutdown after close.
class Store {
 public:
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  virtual ~Store() = default;

  // Sets `key` to `value`, waking every waiter on it.
  virtual void set(const std::string& key, const std::string& value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to be set.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Adds `delta` to the integer stored at `key` (a missing key counts as 0) and returns
  // the new value. Throws kBadArgument if the key holds something that is not an integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // Atomically sets `key` to `desired` if it now holds `expected` (a missing key counts
  // as holding ""). Returns the value the key holds afterwards ("" if missing).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // Removes `key`; returns whether it existed.
  virtual bool delete_key(const std::string& key) = 0;

  // Waits up to `timeout` until every key in `keys` is set.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // How many keys are set.
  virtual int64_t num_keys() = 0;
};

}  // namespace drpc
