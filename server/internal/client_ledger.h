// Which writes of each client a range has applied, so that a write the
// client retries (after losing the primary, or a reply) is applied once.
//
// Every write from the client SDK carries the client's random id, its own
// sequence number (a retry carries the same one) and the client's low mark:
// the smallest sequence number it may still retry. Per client the ledger
// keeps the sequence numbers applied at or above the low mark, and for
// VECTOR commands the dot products they replied (a retried command gets the
// same answer). The ledger is part of the range's state: it travels with
// the range to backups (so that a promoted backup recognises a retry of a
// write its old primary applied) and into checkpoints.
//
// Clients silent for longer than `idle_expiry` are forgotten: a client
// retries a write only until that write's deadline, far shorter.
//
// Thread-compatible: the server's data thread owns it.
#ifndef DOWNPOUR_SERVER_INTERNAL_CLIENT_LEDGER_H_
#define DOWNPOUR_SERVER_INTERNAL_CLIENT_LEDGER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/downpour.pb.h"

namespace downpour {
namespace server_internal {

class ClientLedger {
 public:
  explicit ClientLedger(absl::Duration idle_expiry = absl::Minutes(10))
      : idle_expiry_(idle_expiry) {}

  // The record of (client, seq) if that write was applied, else nullptr; a
  // record holds the dot products a VECTOR command replied (empty for other
  // writes). Raises the client's low mark to `low_seq` (forgetting the
  // writes below it) and notes the client as active at `now`.
  const std::vector<double>* Find(uint64_t client, uint64_t seq,
                                  uint64_t low_seq, absl::Time now);
  // Records (client, seq) as applied. REQUIRES: Find returned nullptr.
  void Record(uint64_t client, uint64_t seq, absl::Span<const double> scalars,
              absl::Time now);

  // Writes held, over all clients.
  size_t size() const { return records_; }

  // The ledger as part of a range's copy (RangeLedgers.writers).
  void Export(proto::RangeLedgers* out) const;
  // Replaces the ledger with an exported one; `now` counts as the clients'
  // last activity.
  void Import(const proto::RangeLedgers& in, absl::Time now);

 private:
  struct Client {
    uint64_t low = 0;
    absl::Time last_seen;
    absl::flat_hash_map<uint64_t, std::vector<double>> applied;
  };
  void ForgetIdle(absl::Time now);

  const absl::Duration idle_expiry_;
  absl::flat_hash_map<uint64_t, Client> clients_;
  size_t records_ = 0;
  size_t until_sweep_ = 4096;
};

}  // namespace server_internal
}  // namespace downpour

#endif  // DOWNPOUR_SERVER_INTERNAL_CLIENT_LEDGER_H_
