#include "server/internal/client_ledger.h"

#include <algorithm>

namespace downpour {
namespace server_internal {

const std::vector<double>* ClientLedger::Find(uint64_t client, uint64_t seq,
                                              uint64_t low_seq,
                                              absl::Time now) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return nullptr;
  Client& c = it->second;
  c.last_seen = now;
  if (low_seq > c.low) {
    c.low = low_seq;
    for (auto a = c.applied.begin(); a != c.applied.end();) {
      if (a->first < low_seq) {
        c.applied.erase(a++);
        --records_;
      } else {
        ++a;
      }
    }
  }
  auto a = c.applied.find(seq);
  return a == c.applied.end() ? nullptr : &a->second;
}

void ClientLedger::Record(uint64_t client, uint64_t seq,
                          absl::Span<const double> scalars, absl::Time now) {
  Client& c = clients_[client];
  c.last_seen = now;
  auto [it, inserted] =
      c.applied.try_emplace(seq, scalars.begin(), scalars.end());
  if (inserted) ++records_;
  if (--until_sweep_ == 0) {
    until_sweep_ = 4096;
    ForgetIdle(now);
  }
}

void ClientLedger::ForgetIdle(absl::Time now) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (now - it->second.last_seen > idle_expiry_) {
      records_ -= it->second.applied.size();
      clients_.erase(it++);
    } else {
      ++it;
    }
  }
}

void ClientLedger::Export(proto::RangeLedgers* out) const {
  for (const auto& [id, c] : clients_) {
    proto::RangeLedgers::Writer* w = out->add_writers();
    w->set_client_id(id);
    w->set_low_seq(c.low);
    std::vector<uint64_t> seqs;
    for (const auto& [seq, scalars] : c.applied) seqs.push_back(seq);
    std::sort(seqs.begin(), seqs.end());
    for (uint64_t seq : seqs) {
      w->add_seqs(seq);
      const std::vector<double>& scalars = c.applied.at(seq);
      if (scalars.empty()) continue;
      w->add_scalar_seqs(seq);
      w->add_scalar_counts(static_cast<uint32_t>(scalars.size()));
      for (double d : scalars) w->add_scalars(d);
    }
  }
}

void ClientLedger::Import(const proto::RangeLedgers& in, absl::Time now) {
  clients_.clear();
  records_ = 0;
  for (const proto::RangeLedgers::Writer& w : in.writers()) {
    Client& c = clients_[w.client_id()];
    c.low = w.low_seq();
    c.last_seen = now;
    for (uint64_t seq : w.seqs()) {
      if (c.applied.try_emplace(seq).second) ++records_;
    }
    int next = 0;
    for (int i = 0; i < w.scalar_seqs_size(); ++i) {
      const uint32_t n = i < w.scalar_counts_size() ? w.scalar_counts(i) : 0;
      std::vector<double>& s = c.applied[w.scalar_seqs(i)];
      for (uint32_t j = 0; j < n && next < w.scalars_size(); ++j) {
        s.push_back(w.scalars(next++));
      }
    }
  }
}

}  // namespace server_internal
}  // namespace downpour
