#pragma once

// What a job requires of every connection (to the store and between workers): a shared
// token, and optionally TLS with certificates signed by the job's CA. No gRPC type here.

#include <string>

namespace drpc {

struct SecurityOptions {
  // A shared secret every connection must present; empty: none is required. Give it
  // through a file or the environment (read_job_token), never a command-line flag: `ps` shows
  // flags to every user of the machine.
  std::string token;
  // TLS: this process's certificate chain and private key, and the CA that must have
  // signed every peer's certificate (PEM files). All three, or none for plaintext.
  // Connections are mutually authenticated: each side verifies the other.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // The name peers' certificates must carry (subjectAltName). Empty: the host that is
  // dialled, as in HTTPS; a fixed name lets one job certificate serve every address.
  std::string tls_server_name;

  // Throws kBadArgument when only some of the TLS files are given.
  bool tls() const;
};

// The job token from `file` when given (trailing whitespace trimmed), else from the
// environment variable `env_var`, else empty. Throws kBadArgument naming a file that
// cannot be read or is empty.
std::string read_job_token(const std::string& file, const char* env_var);

// Whether `presented` equals `expected`, in time independent of where they differ.
bool token_matches(const std::string& presented, const std::string& expected);

}  // namespace drpc
