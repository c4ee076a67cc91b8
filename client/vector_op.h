// Server-side vector algebra through a Client (Sandblaster L-BFGS): one
// command over a key range of a table's named vectors, run next to the
// data by every server owning part of it; only the command and the scalars
// travel. Not part of the installed SDK (it speaks proto::VectorCommand).
//
//   proto::VectorCommand c;
//   c.set_update(proto::VectorCommand::AXPY); c.set_dst(1); c.set_a(2);
//   c.set_alpha(-0.25); c.add_dot_x(1); c.add_dot_y(1);
//   absl::StatusOr<std::vector<double>> dots = VectorOp(*client, table, c);
//
// Thread-safe as the Client is.
#ifndef DOWNPOUR_CLIENT_VECTOR_OP_H_
#define DOWNPOUR_CLIENT_VECTOR_OP_H_

#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/downpour.pb.h"

namespace downpour {

// Sends `command` to every server owning keys of `t` in [command.begin,
// command.end) (end 0: to the end of the key space), one part per range,
// through the same routing and retries as every other operation (a write
// carries its sequence number, so a range that ran it answers a retry with
// its first result). Blocks until every part answered. Returns the dot
// products the command asks for, each the sum of the ranges' partial sums
// in key order (repeatable wherever the ranges live).
// Errors: kInvalidArgument for a range outside the key space or a bad
// command (the servers check it); others as for any operation. A server
// that failed may have applied the command or not; the others did.
absl::StatusOr<std::vector<double>> VectorOp(
    Client& client, const Table& t, const proto::VectorCommand& command);

// Gives VectorOp the client's private entry; nothing else.
class VectorOps {
 private:
  friend absl::StatusOr<std::vector<double>> VectorOp(
      Client& client, const Table& t, const proto::VectorCommand& command);
  static Ticket Submit(Client& client, const Table& t, VectorRequest* r) {
    return client.SubmitVector(t, r);
  }
};

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_VECTOR_OP_H_
