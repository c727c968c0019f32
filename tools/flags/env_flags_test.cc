#include "tools/flags/env_flags.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "common/error.h"

DEFINE_int32(rank, -1, "");
DEFINE_int32(master_port, 29500, "");
DEFINE_string(master_addr, "127.0.0.1", "");
DEFINE_double(lr, 0.05, "");
DEFINE_bool(verbose_thing, false, "");

namespace drpc {
namespace flags {
namespace {

// Clears the variables these tests set; flags come back through a FlagSaver per step.
void reset() {
  for (const char* v : {"DRPC_RANK", "RANK", "JOB_COMPLETION_INDEX", "DRPC_MASTER_PORT", "MASTER_PORT",
                        "DRPC_MASTER_ADDR", "MASTER_ADDR", "DRPC_LR", "DRPC_VERBOSE_THING"}) {
    unsetenv(v);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadArgument);
    return e.what();
  }
  return "";
}

// Each step runs with the flags saved and restored (FlagSaver) and the variables cleared.
#define STEP for (bool once = (reset(), true); once; once = false) for (gflags::FlagSaver saver; once; once = false)

TEST(EnvFlags, DrpcNamesThenTorchNamesThenKubernetesIndex) {
  STEP {
    setenv("JOB_COMPLETION_INDEX", "3", 1);
    from_environment();
    EXPECT_EQ(FLAGS_rank, 3);
    EXPECT_EQ(source("rank"), "JOB_COMPLETION_INDEX");
  }
  STEP {
    setenv("JOB_COMPLETION_INDEX", "3", 1);
    setenv("RANK", "2", 1);
    setenv("MASTER_ADDR", "10.0.0.5", 1);
    setenv("MASTER_PORT", "1234", 1);
    from_environment();
    EXPECT_EQ(FLAGS_rank, 2);
    EXPECT_EQ(FLAGS_master_addr, "10.0.0.5");
    EXPECT_EQ(FLAGS_master_port, 1234);
  }
  STEP {
    setenv("RANK", "2", 1);
    setenv("DRPC_RANK", "1", 1);
    setenv("DRPC_LR", "0.5", 1);
    setenv("DRPC_VERBOSE_THING", "true", 1);
    from_environment();
    EXPECT_EQ(FLAGS_rank, 1);
    EXPECT_EQ(source("rank"), "DRPC_RANK");
    EXPECT_DOUBLE_EQ(FLAGS_lr, 0.5);
    EXPECT_TRUE(FLAGS_verbose_thing);
  }
  reset();
  EXPECT_EQ(FLAGS_rank, -1);  // restored
}

TEST(EnvFlags, CommandLineWinsAndEmptyIsUnset) {
  STEP {
    gflags::SetCommandLineOption("rank", "5");  // as if given on the command line
    setenv("DRPC_RANK", "1", 1);
    setenv("DRPC_MASTER_PORT", "", 1);
    setenv("MASTER_PORT", "4321", 1);
    from_environment();
    EXPECT_EQ(FLAGS_rank, 5);
    EXPECT_EQ(source("rank"), "--rank");
    EXPECT_EQ(FLAGS_master_port, 4321);
  }
  reset();
}

TEST(EnvFlags, TrailingGarbageAndOverflowAreRefusedNamingVariableAndFlag) {
  for (const char* bad : {"29500x", "x", "1e3", "99999999999", "12 "}) {
    STEP {
      setenv("MASTER_PORT", bad, 1);
      const std::string e = error_of([] { from_environment(); });
      EXPECT_NE(e.find("MASTER_PORT='" + std::string(bad) + "' (for --master_port) is not a valid int32"),
                std::string::npos)
          << bad << ": " << e;
    }
  }
  STEP {
    setenv("DRPC_LR", "0.5.1", 1);
    EXPECT_NE(error_of([] { from_environment(); }).find("DRPC_LR='0.5.1' (for --lr) is not a valid double"),
              std::string::npos);
  }
  STEP {
    setenv("DRPC_VERBOSE_THING", "maybe", 1);
    EXPECT_NE(error_of([] { from_environment(); }).find("(for --verbose_thing) is not a valid bool"),
              std::string::npos);
  }
  reset();
}

TEST(EnvFlags, ParseIntIsStrict) {
  EXPECT_EQ(parse_int("42", "n", 0, 100), 42);
  EXPECT_EQ(parse_int("-3", "n", -5, 5), -3);
  EXPECT_NE(error_of([] { parse_int("42x", "--n", 0, 100); }).find("--n: '42x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of([] { parse_int("", "--n", 0, 100); }).find("is not an integer"), std::string::npos);
  EXPECT_NE(error_of([] { parse_int("-", "--n", 0, 100); }).find("is not an integer"), std::string::npos);
  EXPECT_NE(error_of([] { parse_int("101", "--n", 0, 100); }).find("out of range [0, 100]"), std::string::npos);
  EXPECT_NE(error_of([] { parse_int("99999999999999999999", "--n", 0, 100); }).find("out of range"),
            std::string::npos);
}

TEST(EnvFlags, CheckRangeNamesTheSource) {
  STEP {
    setenv("RANK", "7", 1);
    from_environment();
    EXPECT_NE(error_of([] { check_range("rank", FLAGS_rank, 0, 3); }).find("RANK=7: must be in [0, 3]"),
              std::string::npos);
  }
  reset();
}

}  // namespace
}  // namespace flags
}  // namespace drpc
