#include "testing/tls_certs.h"

#include <stdlib.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "common/subprocess.h"

namespace drpc {
namespace testing {
namespace {

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = Subprocess::start(argv);
  const auto code = child->wait(std::chrono::seconds(60));
  if (code != 0) {
    std::string line;
    for (const auto& a : argv) line += a + " ";
    throw std::runtime_error("openssl failed (" + std::to_string(code.value_or(-1)) + "): " + line);
  }
}

void make_ca(const std::string& prefix, const std::string& subject) {
  openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", subject, "-keyout",
           prefix + ".key", "-out", prefix + ".pem"});
}

void make_signed(const std::string& dir, const std::string& prefix, const std::string& ca_prefix) {
  const std::string ext = dir + "/" + "san.ext";
  std::ofstream(ext) << "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:drpc-job\n";
  openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=drpc-worker", "-keyout", prefix + ".key", "-out",
           prefix + ".csr"});
  openssl({"x509", "-req", "-in", prefix + ".csr", "-CA", ca_prefix + ".pem", "-CAkey", ca_prefix + ".key",
           "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", prefix + ".pem"});
}

}  // namespace

TlsCerts make_tls_certs(const std::string& dir) {
  make_ca(dir + "/ca", "/CN=drpc-test-ca");
  make_ca(dir + "/other_ca", "/CN=someone-else-ca");
  make_signed(dir, dir + "/worker", dir + "/ca");
  make_signed(dir, dir + "/impostor", dir + "/other_ca");
  return TlsCerts{dir + "/ca.pem",       dir + "/worker.pem",    dir + "/worker.key",
                  dir + "/other_ca.pem", dir + "/impostor.pem", dir + "/impostor.key"};
}

std::string make_temp_dir(const std::string& name) {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/" + name + "XXXXXX";
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a directory like " + tmpl);
  return tmpl;
}

}  // namespace testing
}  // namespace drpc
