#include "server/internal/dispatcher.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace downpour {
namespace server_internal {

Dispatcher::Dispatcher(NodeId self, size_t max_message_bytes, BufferPool* pool,
                       const PluginRegistry* plugins,
                       const PinOptions& pin_options)
    : self_(self),
      max_message_bytes_(max_message_bytes),
      pool_(pool),
      plugins_(plugins),
      pin_options_(pin_options) {}

absl::Status Dispatcher::ApplyMap(const proto::ClusterMap& map) {
  absl::Status first_error;
  for (const proto::TableMap& table : map.tables()) {
    const TableId id = table.spec().id();
    {
      absl::MutexLock lock(&mu_);
      if (tables_.contains(id)) continue;
    }
    std::vector<KeyRange> owned;
    for (const proto::RangeAssignment& r : table.ranges()) {
      if (r.primary() == self_) owned.push_back(KeyRange{r.begin(), r.end()});
    }
    // Built outside the lock: a large dense table takes a while to
    // initialize, and the data thread must keep serving meanwhile.
    auto shard =
        TableShard::Create(table.spec(), owned, plugins_, pin_options_);
    if (!shard.ok()) {
      DP_LOG(ERROR) << "cannot serve table '" << table.spec().name()
                    << "': " << shard.status();
      if (first_error.ok()) first_error = shard.status();
      continue;
    }
    DP_LOG(INFO) << "serving table '" << table.spec().name() << "' (id " << id
                 << ", " << owned.size() << " ranges, " << (*shard)->rows()
                 << " rows allocated)";
    absl::MutexLock lock(&mu_);
    tables_.emplace(id, std::shared_ptr<TableShard>(std::move(*shard)));
  }
  absl::MutexLock lock(&mu_);
  if (map.epoch() > epoch_) epoch_ = map.epoch();
  return first_error;
}

Epoch Dispatcher::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::shared_ptr<TableShard> Dispatcher::Lookup(TableId id, Epoch* epoch) const {
  absl::MutexLock lock(&mu_);
  *epoch = epoch_;
  auto it = tables_.find(id);
  return it == tables_.end() ? nullptr : it->second;
}

void Dispatcher::Handle(const IncomingMessage& request, OutgoingReply* reply,
                        std::vector<DeferredReply>* released) {
  const int op = request.header.op();
  requests_by_op_[op >= 0 && op < 8 ? op : 0].fetch_add(
      1, std::memory_order_relaxed);
  reply->header.set_server_id(self_);
  const size_t first_released = released->size();
  absl::StatusOr<Validated> v = Validate(request);
  if (v.ok()) Apply(*v, request, reply, released);
  const Epoch server_epoch = epoch();
  reply->header.set_server_epoch(server_epoch);
  for (size_t i = first_released; i < released->size(); ++i) {
    OutgoingReply& r = (*released)[i].reply;
    r.header.set_server_id(self_);
    r.header.set_server_epoch(server_epoch);
  }
  if (!v.ok()) {
    reply->deferred = false;
    errors_.fetch_add(1, std::memory_order_relaxed);
    reply->header.set_status_code(static_cast<int>(v.status().code()));
    reply->header.set_status_message(std::string(v.status().message()));
    reply->values = Payload();
  }
}

namespace {

std::string RangesString(const std::vector<KeyRange>& ranges) {
  if (ranges.empty()) return "none";
  std::string s;
  for (const KeyRange& r : ranges) {
    absl::StrAppend(&s, s.empty() ? "" : " ", "[", r.begin, ", ", r.end, ")");
  }
  return s;
}

}  // namespace

absl::StatusOr<Dispatcher::Validated> Dispatcher::Validate(
    const IncomingMessage& request) const {
  const proto::DataHeader& h = request.header;
  if (h.op() <= proto::OP_UNSPECIFIED || h.op() > proto::VECTOR) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown operation ", static_cast<int>(h.op())));
  }
  Validated v;
  v.op = h.op();
  Epoch epoch;
  v.shard = Lookup(h.table_id(), &epoch);
  if (v.shard == nullptr) {
    if (h.epoch() > epoch) {
      return absl::UnavailableError(absl::StrCat(
          "server ", self_, " has applied epoch ", epoch,
          " but the request is from epoch ", h.epoch(), "; retry"));
    }
    return absl::NotFoundError(
        absl::StrCat("unknown table id ", h.table_id(), " on server ", self_));
  }
  TableShard& shard = *v.shard;
  const proto::TableSpec& spec = shard.spec();
  if (v.op == proto::VECTOR) return ValidateVector(std::move(v), request);
  if (h.vector_id() >= shard.num_vectors()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "' has ", shard.num_vectors(),
        " vectors; the request names vector ", h.vector_id()));
  }
  if (h.vector_id() != 0 && (v.op == proto::PUSH || v.op == proto::PUSH_PULL)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "': push applies the update handler to the "
        "parameters (vector 0), not to vector ", h.vector_id()));
  }
  if (h.round() < 0 || (h.round() > 0 && v.op != proto::ADD)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "round ", h.round(), ": only an ADD may carry a round, and it is > 0"));
  }
  v.vector = h.vector_id();
  const size_t width = shard.width();
  if (h.width() != width) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", spec.name(), "' has width ", width,
                     ", the request says ", h.width()));
  }
  const KeyRange space = shard.key_space();
  auto not_owner = [&](Key key) {
    return absl::AbortedError(absl::StrCat(
        "not owner: server ", self_, " does not own key ", key, " of table '",
        spec.name(), "' (owns ", RangesString(shard.held()), "), epoch ",
        epoch));
  };
  auto outside = [&](Key key) {
    return absl::OutOfRangeError(
        absl::StrCat("key ", key, " is outside the key space [0, ", space.end,
                     ") of table '", spec.name(), "'"));
  };

  if (h.is_range()) {
    if (!request.keys.empty()) {
      return absl::InvalidArgumentError("a range operation carries no keys");
    }
    if (h.range_begin() >= h.range_end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty or inverted range [", h.range_begin(), ", ",
                       h.range_end(), ")"));
    }
    if (h.range_end() > space.end) return outside(h.range_end() - 1);
    v.range = shard.Find(h.range_begin());
    if (v.range == nullptr) return not_owner(h.range_begin());
    if (h.range_end() > v.range->range().end) {
      return not_owner(v.range->range().end);
    }
    v.is_range = true;
    v.begin = h.range_begin();
    v.end = h.range_end();
    v.n = v.end - v.begin;
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", v.begin, ", ", v.end, ") holds ", v.n,
                       " keys, the header says ", h.num_keys()));
    }
  } else {
    v.keys = request.keys;
    v.n = v.keys.size();
    if (h.num_keys() != v.n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the keys frame holds ", v.n, " keys, the header says ",
          h.num_keys()));
    }
    for (Key k : v.keys) {
      if (k >= space.end) return outside(k);
      if (v.range != nullptr && v.range->range().Contains(k)) continue;
      TableShard::Range* r = shard.Find(k);
      if (r == nullptr) return not_owner(k);
      if (v.range != nullptr) {
        // Every range is replicated and moved on its own, so one request
        // speaks for one range; the client SDK splits batches that way.
        const KeyRange a = v.range->range(), b = r->range();
        return absl::InvalidArgumentError(absl::StrCat(
            "the keys of one request must lie in one range of table '",
            spec.name(), "': key ", v.keys[0], " is in [", a.begin, ", ",
            a.end, "), key ", k, " in [", b.begin, ", ", b.end, ")"));
      }
      v.range = r;
    }
  }
  if (h.round() > 0 && v.range != nullptr) {
    DP_RETURN_IF_ERROR(v.range->rounds.Check(v.vector, h.round(), spec.name()));
  }
  // n <= 2^64 and width <= 2^20, so compare in 128 bits.
  const unsigned __int128 floats = static_cast<unsigned __int128>(v.n) * width;
  if (floats * sizeof(float) > max_message_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(v.n, " keys of width ", width,
                     " exceed the message limit of ", max_message_bytes_,
                     " bytes"));
  }
  v.floats = static_cast<size_t>(floats);
  const size_t expected = OpWrites(v.op) ? v.floats : 0;
  if (request.values.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the values frame holds ", request.values.size(), " floats, expected ",
        expected, " (", OpWrites(v.op) ? v.n : 0, " keys x width ", width,
        ") for table '", spec.name(), "'"));
  }
  v.values = request.values.data();

  v.clocked = h.worker_clock() >= 0 && shard.tracked_ranks() > 0;
  if (v.clocked &&
      (h.worker_rank() < 0 || h.worker_rank() >= shard.tracked_ranks())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", h.worker_rank(), " outside [0, ",
                     shard.tracked_ranks(), ") of table '", spec.name(), "'"));
  }
  v.synced = v.clocked && spec.sync_workers() > 0 &&
             (v.op == proto::PUSH || v.op == proto::PUSH_PULL);
  // Dense tables aggregate per key range (push, or push-pull answered once
  // the step is applied); sparse tables per key batch, one per worker and
  // range and clock (see TableShard::PushSyncedKeys), push only.
  const bool sparse = spec.kind() == proto::SPARSE;
  if (v.synced &&
      (v.is_range == sparse || (sparse && v.op == proto::PUSH_PULL))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name(), "' aggregates synchronously: ",
        sparse ? "push key batches, without pull"
               : "push or push-pull key ranges"));
  }
  if (v.synced && !v.is_range && v.range == nullptr) {
    // An empty key batch still counts the rank for the step: it speaks for
    // the range the sender routed it to, which for a server holding one
    // range of the table is that one.
    if (shard.ranges().size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name(), "': an empty synced key batch names no "
          "range, and server ", self_, " holds ", shard.ranges().size()));
    }
    v.range = shard.ranges().begin()->second.get();
  }
  return v;
}

absl::StatusOr<Dispatcher::Validated> Dispatcher::ValidateVector(
    Validated v, const IncomingMessage& request) const {
  const proto::VectorCommand& cmd = request.header.vector_command();
  const TableShard& shard = *v.shard;
  const std::string& name = shard.spec().name();
  if (!request.keys.empty() || !request.values.empty()) {
    return absl::InvalidArgumentError(
        "a vector command carries no keys and no values");
  }
  if (shard.spec().kind() != proto::DENSE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name, "' is sparse: vector commands need a dense table"));
  }
  const Key space_end = shard.key_space().end;
  if (cmd.end() != 0 && (cmd.begin() >= cmd.end() || cmd.end() > space_end)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vector command range [", cmd.begin(), ", ", cmd.end(),
        ") is empty or outside [0, ", space_end, ") of table '", name, "'"));
  }
  DP_ASSIGN_OR_RETURN(VectorKernel kernel,
                      VectorKernel::Create(cmd, shard.num_vectors()),
                      "table '", name, "'");
  v.kernel = std::move(kernel);
  return v;
}

void Dispatcher::Apply(const Validated& v, const IncomingMessage& request,
                       OutgoingReply* reply,
                       std::vector<DeferredReply>* released) {
  if (v.op == proto::VECTOR) return ApplyVector(v, request, reply);
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  reply->header.set_num_keys(v.n);
  reply->header.set_width(shard.width());
  if (h.round() > 0 && v.n > 0 &&
      !v.range->rounds.FirstInRound(v.vector, h.round(), h.task_id(),
                                    v.is_range ? v.begin : v.keys[0])) {
    // A backup copy's or a late task's gradient: acknowledged, not applied.
    shard.CountDroppedTaskAdd();
    reply->header.set_discarded(true);
    return;
  }
  if (v.synced) return ApplySynced(v, request, reply, released);
  RangeStore& store = v.range->store;
  const float* in = v.values;
  switch (v.op) {
    case proto::PUT:
      v.is_range ? store.PutRange(v.begin, v.end, in, v.vector)
                 : store.Put(v.keys, in, v.vector);
      break;
    case proto::ADD:
      v.is_range ? store.AddRange(v.begin, v.end, in, v.vector)
                 : store.Add(v.keys, in, v.vector);
      break;
    case proto::PUSH:
    case proto::PUSH_PULL:
      v.is_range ? store.PushRange(v.begin, v.end, in) : store.Push(v.keys, in);
      break;
    default:
      break;
  }
  if (v.clocked && OpWrites(v.op)) {
    shard.RecordApplied(h.worker_rank(), h.worker_clock());
  }
  if (v.clocked && OpReads(v.op)) {
    reply->header.set_staleness(shard.ObservePull(h.worker_clock()));
  }
  if (OpReads(v.op)) {
    if (v.is_range) {
      reply->values = ReadRange(store, v.begin, v.end, v.floats, v.vector);
    } else {
      Buffer out = pool_->Acquire(v.floats * sizeof(float));
      store.Get(v.keys, reinterpret_cast<float*>(out.data()), v.vector);
      reply->values = Payload::Own(std::move(out));
    }
  }
}

void Dispatcher::ApplySynced(const Validated& v, const IncomingMessage& request,
                             OutgoingReply* reply,
                             std::vector<DeferredReply>* released) {
  const proto::DataHeader& h = request.header;
  TableShard& shard = *v.shard;
  const bool pull = v.op == proto::PUSH_PULL;
  const size_t first_waiter = waiters_.size();
  const TableShard::SyncOutcome outcome =
      v.is_range
          ? shard.PushSynced(*v.range, v.begin, v.end, h.worker_rank(),
                             h.worker_clock(), v.values,
                             pull ? request.reply_token : 0, &waiters_)
          : shard.PushSyncedKeys(*v.range, v.keys, h.worker_rank(),
                                 h.worker_clock(), v.values, 0, &waiters_,
                                 &applied_keys_);
  reply->header.set_discarded(outcome.result ==
                              TableShard::SyncResult::kDiscarded);
  if (outcome.result == TableShard::SyncResult::kHeld) {
    reply->deferred = pull;
    return;
  }
  // The step is applied (or was, for a late push): the values are what a
  // pull at the next clock reads, for this request if it asks and for every
  // PushPull that waited for the step (whatever op completed it).
  const Clock next = h.worker_clock() + 1;
  RangeStore& store = v.range->store;
  if (pull) {
    reply->header.set_staleness(shard.ObservePull(next));
    reply->values = ReadRange(store, v.begin, v.end, v.floats);
  }
  for (size_t i = first_waiter; i < waiters_.size(); ++i) {
    DeferredReply d;
    d.reply_token = waiters_[i];
    d.reply.header.set_num_keys(v.n);
    d.reply.header.set_width(shard.width());
    d.reply.header.set_staleness(shard.ObservePull(next));
    d.reply.values = ReadRange(store, v.begin, v.end, v.floats);
    released->push_back(std::move(d));
  }
  waiters_.resize(first_waiter);
}

void Dispatcher::ApplyVector(const Validated& v, const IncomingMessage& request,
                             OutgoingReply* reply) {
  const proto::VectorCommand& cmd = request.header.vector_command();
  const Key lo = cmd.begin();
  const Key hi = cmd.end() == 0 ? v.shard->key_space().end : cmd.end();
  const bool writes_params =
      cmd.update() != proto::VectorCommand::NONE && cmd.dst() == 0;
  std::vector<double> partials(v.kernel->num_dots(), 0.0);
  // Held ranges in key order, so the partial sums add up the same way
  // wherever the command runs.
  for (const auto& [begin, range] : v.shard->ranges()) {
    const KeyRange r = range->range();
    if (r.end <= lo || r.begin >= hi) continue;
    range->store.RunVector(lo, hi, *v.kernel, writes_params, partials.data());
    if (cmd.update() == proto::VectorCommand::ZERO && cmd.open_round() > 0) {
      range->rounds.Open(cmd.dst(), cmd.open_round());
    }
  }
  for (double p : partials) reply->header.add_scalars(p);
}

Payload Dispatcher::ReadRange(RangeStore& store, Key begin, Key end,
                              size_t floats, uint32_t vector) {
  if (vector == 0) {
    if (auto pinned = store.PinRows(begin, end)) {
      // Sent from the table's memory: copying large replies into a send
      // buffer kept one-server pulls under 70% of raw ZeroMQ
      // (docs/BENCHMARKS.md).
      return Payload::Borrow(pinned->data, pinned->bytes,
                             std::move(pinned->release));
    }
  }
  Buffer out = pool_->Acquire(floats * sizeof(float));
  store.GetRange(begin, end, reinterpret_cast<float*>(out.data()), vector);
  return Payload::Own(std::move(out));
}

void Dispatcher::FillStats(proto::ServerStats* stats) const {
  stats->set_node_id(self_);
  for (int op = proto::PUT; op <= proto::VECTOR; ++op) {
    (*stats->mutable_requests_by_op())[proto::Op_Name(
        static_cast<proto::Op>(op))] = requests_by_op_[op].load();
  }
  stats->set_errors(errors_.load());
  absl::MutexLock lock(&mu_);
  stats->set_epoch(epoch_);
  for (const auto& [id, shard] : tables_) {
    proto::TableStats* t = stats->add_tables();
    t->set_name(shard->spec().name());
    t->set_id(id);
    t->set_rows(shard->rows());
    t->set_value_bytes(shard->value_bytes());
    t->set_state_bytes(shard->state_bytes());
    t->set_allocated_bytes(shard->allocated_bytes());
    t->set_max_staleness(shard->max_staleness());
    t->set_tracked_pulls(shard->tracked_pulls());
    t->set_discarded_pushes(shard->discarded_pushes());
    t->set_aggregated_steps(shard->aggregated_steps());
    t->set_dropped_task_adds(shard->dropped_task_adds());
    t->set_zero_copy_replies(shard->zero_copy_replies());
    t->set_pin_waits(shard->pin_waits());
    t->set_pin_copies(shard->pin_copies());
    t->set_pinned_replies(shard->pinned_replies());
  }
}

}  // namespace server_internal
}  // namespace downpour
