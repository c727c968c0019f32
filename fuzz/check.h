#pragma once

// The fuzz targets' own assertions: a broken property aborts, which libFuzzer reports as a
// crash (and saves the input) and which fails the regression test that replays the input.

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(condition, message)                                                      \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s (%s)\n", __FILE__, __LINE__,   \
                   #condition, std::string(message).c_str());                               \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
