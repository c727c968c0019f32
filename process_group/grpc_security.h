#pragma once

// Internal to //process_group: SecurityOptions as gRPC credentials, for the store and the
// transport alike.

#include <grpcpp/grpcpp.h>

#include <memory>

#include "process_group/security.h"

namespace drpc {

// The metadata key that carries the job token on store calls.
constexpr char kTokenMetadataKey[] = "drpc-token";

// Plaintext, or TLS requiring and verifying the client's certificate. Throws
// kBadArgument naming a TLS file that cannot be read.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const SecurityOptions& security);

// Plaintext, or TLS presenting our certificate and verifying the server's against the
// CA; sets the name to verify in `args` when tls_server_name is given.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const SecurityOptions& security,
                                                              grpc::ChannelArguments* args);

}  // namespace drpc
