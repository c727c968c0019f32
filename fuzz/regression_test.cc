// Replays a fuzz target's checked-in inputs (its seed corpus and every crasher found so far)
// through its LLVMFuzzerTestOneInput, one test case per file, built with the normal
// compiler. The target aborts when a property breaks, which fails the test; a crash or
// hang fails it too. Usage: <test> <target name> <files...> (the BUILD passes them).

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// Below this many seeds the corpus has gone missing, and the test would prove nothing.
constexpr int kMinSeeds = 3;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class Replay : public ::testing::Test {
 public:
  explicit Replay(std::string path) : path_(std::move(path)) {}
  void TestBody() override {
    const std::string bytes = read_file(path_);
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }

 private:
  std::string path_;
};

std::string test_name(const std::string& path) {
  const auto slash = path.rfind('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    fprintf(stderr, "usage: %s <target> <input files...>\n", argv[0]);
    return 2;
  }
  const std::string target = argv[1];
  int seeds = 0;
  for (int i = 2; i < argc; ++i) {
    const std::string path = argv[i];
    const bool crasher = path.find("/crashers/") != std::string::npos;
    seeds += !crasher;
    ::testing::RegisterTest((target + (crasher ? "_crashers" : "_corpus")).c_str(), test_name(path).c_str(), nullptr,
                            nullptr, __FILE__, __LINE__, [path]() -> ::testing::Test* { return new Replay(path); });
  }
  if (seeds < kMinSeeds) {
    fprintf(stderr, "%s: only %d seed inputs given, expected at least %d\n", target.c_str(), seeds, kMinSeeds);
    return 1;
  }
  return RUN_ALL_TESTS();
}
