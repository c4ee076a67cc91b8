// gRPC channels the way every client here makes them (scheduler client,
// Sandblaster workers, tools, tests): the cluster's security applied to
// every call, so that no call site can forget it.
//
//   auto channel = NewGrpcChannel("127.0.0.1:7070", auth);
//   auto stub = proto::Scheduler::NewStub(channel);
//
//  - TLS when `auth.tls_enabled()`: servers are verified against the CA (by
//    the host dialled, or TlsMaterial::server_name); this node's certificate
//    is presented when it has one (required under mutual TLS).
//  - the cluster token in every call's "authorization" metadata when
//    `auth.enabled()`.
//  - a failed connection whose cause is probably the security set-up (the
//    peer closed a plaintext connection, a certificate it did not accept or
//    that this node does not trust) keeps its code (UNAVAILABLE) and gets
//    the likely cause and the flag to check appended to its message.
#ifndef DOWNPOUR_COMMON_GRPC_CHANNEL_H_
#define DOWNPOUR_COMMON_GRPC_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/auth.h"
#include "grpcpp/grpcpp.h"

namespace downpour {

// A channel to `target` ("host:port"). Connects lazily; never fails here
// (errors come back from the calls). Thread-safe, like every gRPC channel.
std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& target,
                                              const ClusterAuth& auth);

// What a call on a channel configured by `auth` that failed with `code` and
// `message` (gRPC's) most likely failed of, when that is the TLS set-up:
// " (<cause>: <what to check>)", else "". Exposed for tests.
std::string SecurityHint(const ClusterAuth& auth, grpc::StatusCode code,
                         absl::string_view message);

}  // namespace downpour

#endif  // DOWNPOUR_COMMON_GRPC_CHANNEL_H_
