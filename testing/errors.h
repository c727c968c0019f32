#pragma once

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace drpc {
namespace testing {

// Runs `fn`, which must throw a drpc::Error, and returns it; records a failure otherwise.
template <typename Fn>
Error expect_error(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a drpc::Error";
  return Error(ErrorKind::kInternal, "no error was thrown");
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace testing
}  // namespace drpc
