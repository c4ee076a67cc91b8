// The scheduler's checks of what peers send on the control plane: every
// string (node, table, vector, handler, parameter and barrier names,
// endpoints) bounded in length and characters, roles, waits, and the size
// of the cluster map that peers' requests make. Pure functions, apart from
// the scheduler's state, so that they can be unit-tested (and fuzzed);
// thread-safe.
//
//   DP_RETURN_IF_ERROR(CheckRegisterRequest(req));         // Register
//   DP_RETURN_IF_ERROR(CheckTableStrings(spec));            // CreateTable
//   DP_ASSIGN_OR_RETURN(absl::Duration wait,
//                       CheckWait("barrier", req.timeout_ms(), default));
//
// Every error is kInvalidArgument and names the field, its size or the
// first bad character, and the limit: "register: node name of 1048576
// bytes, at most 253". A message never echoes a peer's string unchecked
// (Printable).
#ifndef DOWNPOUR_SCHEDULER_REQUEST_CHECKS_H_
#define DOWNPOUR_SCHEDULER_REQUEST_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Node names: a DNS name's length, since pods are named by their hostname.
inline constexpr size_t kMaxNodeNameBytes = 253;
// Table, named-vector and barrier names.
inline constexpr size_t kMaxNameBytes = 128;
// Handler names ("plugin:<name>") and handler parameter names.
inline constexpr size_t kMaxHandlerNameBytes = 128;
inline constexpr size_t kMaxParamNameBytes = 64;
inline constexpr int kMaxHandlerParams = 32;
// Data and admin endpoints ("tcp://10.1.2.3:40000", "host:port").
inline constexpr size_t kMaxEndpointBytes = 256;
// Plugins one server may announce.
inline constexpr int kMaxPluginsPerNode = 32;
// A server's announced request limit: 0 (unknown) or at least this.
inline constexpr uint64_t kMinMessageBytes = uint64_t{64} << 10;
// The longest a peer may ask the scheduler to hold a call open (WaitClock,
// Barrier, CreateTable); the SDK's SchedulerClient cuts longer waits into
// calls of kMaxSchedulerWait, which scheduler_test checks equals this.
inline constexpr absl::Duration kMaxWait = absl::Minutes(10);
// Table failures one AckEpoch may report, and the bytes kept of each
// message.
inline constexpr int kMaxTableFailures = 1024;
inline constexpr size_t kMaxFailureMessageBytes = 1024;

// `name` as a name of `what` ("node name", "table name", ...): at most
// `max_bytes` bytes of ASCII letters, digits and "._-:/@+=", and not empty
// unless `may_be_empty`. kInvalidArgument otherwise, naming the length or
// the first bad character and its position.
absl::Status CheckName(absl::string_view what, absl::string_view name,
                       size_t max_bytes, bool may_be_empty = false);

// Role known (SERVER, WORKER or CLIENT; "role 77" is refused), name,
// endpoints (a server needs a data endpoint), plugin names, the announced
// message limit. kInvalidArgument.
absl::Status CheckRegisterRequest(const proto::RegisterRequest& req);

// The strings of a table declaration: its name, its named vectors', its
// handler's and the handler parameters' names, and how many parameters.
// The rest of the spec is ValidateTableShape's (table_spec.h). kInvalidArgument
// naming the table (as far as its name can be shown).
absl::Status CheckTableStrings(const proto::TableSpec& spec);

// Barrier name and count (1 .. max_nodes). kInvalidArgument.
absl::Status CheckBarrierRequest(const proto::BarrierRequest& req,
                                 int max_nodes);

// The L-BFGS history a coordinator may record (lbfgs/lbfgs.h allows 1..29).
inline constexpr int kMaxLbfgsHistory = 29;

// A Sandblaster coordinator's state sent with a checkpoint (empty table:
// none): table name, history in 1 .. kMaxLbfgsHistory, at most that many
// pairs with distinct slots below it, iteration, round and evaluations not
// negative, and every scalar finite. kInvalidArgument naming the field.
absl::Status CheckLbfgsState(const proto::LbfgsState& state);

// How long a call may wait: `timeout_ms` <= 0 means `fallback`; above
// kMaxWait is kInvalidArgument (a peer cannot pin a scheduler thread for
// days).
absl::StatusOr<absl::Duration> CheckWait(absl::string_view what,
                                         int64_t timeout_ms,
                                         absl::Duration fallback);

// The failures a server reports with AckEpoch: at most kMaxTableFailures,
// each with an error code (not OK, a known code). kInvalidArgument.
absl::Status CheckTableFailures(const proto::AckEpochRequest& req);

// Whether a presented job token equals the expected one: SecretsEqual
// (common/auth.h), constant time like every secret comparison.
bool TokensMatch(absl::string_view presented, absl::string_view expected);

// `s` cut to `max_bytes` with every byte outside printable ASCII shown as
// \xNN, for logs and error messages that quote a peer.
std::string Printable(absl::string_view s, size_t max_bytes = 200);

// The cluster map stays far below gRPC's 4 MiB message limit whatever
// peers send: kResourceExhausted naming `what` if adding `added_bytes` to
// a map of `map_bytes` would pass `max_map_bytes`.
absl::Status CheckMapGrowth(absl::string_view what, size_t map_bytes,
                            size_t added_bytes, size_t max_map_bytes);

}  // namespace downpour

#endif  // DOWNPOUR_SCHEDULER_REQUEST_CHECKS_H_
