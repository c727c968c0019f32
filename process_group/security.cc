#include "process_group/security.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "process_group/grpc_security.h"

namespace drpc {
namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kBadArgument, "cannot read " + what + " file '" + path + "'");
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

}  // namespace

bool SecurityOptions::tls() const {
  const int given = !tls_cert_file.empty() + !tls_key_file.empty() + !tls_ca_file.empty();
  if (given != 0 && given != 3) {
    throw Error(ErrorKind::kBadArgument,
                "TLS needs a certificate, a key and a CA file; got only " +
                    std::string(tls_cert_file.empty() ? "" : "certificate ") +
                    (tls_key_file.empty() ? "" : "key ") + (tls_ca_file.empty() ? "" : "CA"));
  }
  return given == 3;
}

std::string read_job_token(const std::string& file, const char* env_var) {
  if (!file.empty()) {
    std::string token = read_file(file, "token");
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.empty()) throw Error(ErrorKind::kBadArgument, "token file '" + file + "' is empty");
    return token;
  }
  const char* value = env_var ? std::getenv(env_var) : nullptr;
  return value ? value : "";
}

bool token_matches(const std::string& presented, const std::string& expected) {
  // Compare every byte whatever the lengths, so timing reveals neither.
  unsigned char diff = presented.size() != expected.size();
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < presented.size() ? presented[i] : 0));
  }
  return diff == 0;
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const SecurityOptions& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = read_file(security.tls_ca_file, "TLS CA");
  ssl.pem_key_cert_pairs.push_back({read_file(security.tls_key_file, "TLS key"),
                                    read_file(security.tls_cert_file, "TLS certificate")});
  return grpc::SslServerCredentials(ssl);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const SecurityOptions& security,
                                                              grpc::ChannelArguments* args) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read_file(security.tls_ca_file, "TLS CA");
  ssl.pem_private_key = read_file(security.tls_key_file, "TLS key");
  ssl.pem_cert_chain = read_file(security.tls_cert_file, "TLS certificate");
  if (!security.tls_server_name.empty()) {
    args->SetSslTargetNameOverride(security.tls_server_name);
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace drpc
