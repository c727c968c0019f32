#pragma once

#include <string>

namespace drpc {
namespace testing {

// PEM files for TLS tests, made with the openssl command in `dir`: a job CA and a
// certificate signed by it (subjectAltName localhost and 127.0.0.1), and an impostor
// certificate signed by a different CA. Throws std::runtime_error if openssl fails.
struct TlsCerts {
  std::string ca, cert, key;              // the job's CA; a certificate it signed, and its key
  std::string other_ca;                   // an unrelated CA
  std::string impostor_cert, impostor_key;  // signed by other_ca
};
TlsCerts make_tls_certs(const std::string& dir);

// A fresh directory under the test's temporary directory.
std::string make_temp_dir(const std::string& name);

}  // namespace testing
}  // namespace drpc
