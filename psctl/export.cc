#include "psctl/export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "cluster/scheduler_client.h"
#include "cluster/server_admin_client.h"
#include "common/status_macros.h"
#include "common/types.h"
#include "psctl/npy.h"
#include "storage/checkpoint_store.h"
#include "storage/database.h"

namespace downpour {
namespace {

// Collects rows for the files: dense rows stream straight to the file (the
// ranges come in key order), sparse ones are gathered and sorted.
class Sink {
 public:
  Sink(const proto::TableSpec& spec, const ExportOptions& o)
      : spec_(spec), out_(o.out), width_(spec.width()) {}

  absl::Status Begin() {
    if (spec_.kind() == proto::DENSE) {
      result_.files.push_back(out_ + ".npy");
      return dense_.Open(out_ + ".npy", "<f4", {spec_.num_keys(), width_});
    }
    return absl::OkStatus();
  }
  // `count` rows: dense ones from `first_key`, or sparse ones with `keys`.
  absl::Status Add(uint64_t first_key, uint64_t count, const Key* keys,
                   const float* values) {
    result_.rows += count;
    if (spec_.kind() == proto::DENSE) {
      if (first_key != next_key_) {
        return absl::DataLossError(
            absl::StrCat("table '", spec_.name(), "': rows from key ",
                         first_key, " where key ", next_key_, " was expected"));
      }
      next_key_ += count;
      return dense_.Write(values, count * width_ * sizeof(float));
    }
    keys_.insert(keys_.end(), keys, keys + count);
    values_.insert(values_.end(), values, values + count * width_);
    return absl::OkStatus();
  }
  absl::StatusOr<ExportResult> Finish() {
    result_.width = width_;
    result_.sparse = spec_.kind() == proto::SPARSE;
    if (!result_.sparse) {
      DP_RETURN_IF_ERROR(dense_.Close());
      return result_;
    }
    std::vector<size_t> order(keys_.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return keys_[a] < keys_[b]; });
    NpyWriter k, v;
    DP_RETURN_IF_ERROR(k.Open(out_ + ".keys.npy", "<u8", {keys_.size()}));
    DP_RETURN_IF_ERROR(
        v.Open(out_ + ".values.npy", "<f4", {keys_.size(), width_}));
    for (size_t i : order) {
      DP_RETURN_IF_ERROR(k.Write(&keys_[i], sizeof(Key)));
      DP_RETURN_IF_ERROR(v.Write(&values_[i * width_], width_ * sizeof(float)));
    }
    DP_RETURN_IF_ERROR(k.Close());
    DP_RETURN_IF_ERROR(v.Close());
    result_.files = {out_ + ".keys.npy", out_ + ".values.npy"};
    return result_;
  }

 private:
  const proto::TableSpec spec_;
  const std::string out_;
  const uint64_t width_;
  NpyWriter dense_;
  uint64_t next_key_ = 0;
  std::vector<Key> keys_;
  std::vector<float> values_;
  ExportResult result_;
};

}  // namespace

absl::StatusOr<ExportResult> ExportFromCluster(
    const std::string& scheduler_address, const ClusterAuth& auth,
    const ExportOptions& options) {
  SchedulerClient scheduler(scheduler_address, absl::Seconds(10), auth);
  DP_ASSIGN_OR_RETURN(proto::ClusterMap map, scheduler.GetClusterMap());
  const proto::TableMap* table = nullptr;
  for (const auto& t : map.tables()) {
    if (t.spec().name() == options.table) table = &t;
  }
  if (table == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no table '", options.table, "' in the cluster"));
  }
  std::map<NodeId, std::string> admin;
  for (const auto& n : map.nodes()) admin[n.id()] = n.admin_address();
  Sink sink(table->spec(), options);
  DP_RETURN_IF_ERROR(sink.Begin());
  std::map<std::string, std::unique_ptr<ServerAdminClient>> clients;
  std::vector<Key> keys;
  std::vector<float> values;
  for (const proto::RangeAssignment& r : table->ranges()) {
    if (r.lost()) {
      return absl::DataLossError(absl::StrCat("table '", options.table,
                                              "' keys [", r.begin(), ", ",
                                              r.end(), ") are lost"));
    }
    const std::string& address = admin[r.primary()];
    auto& client = clients[address];
    if (client == nullptr) {
      client = std::make_unique<ServerAdminClient>(address, auth);
    }
    proto::ExportRowsRequest req;
    req.set_table_id(table->spec().id());
    req.set_range_begin(r.begin());
    req.set_max_bytes(4 << 20);
    for (bool done = false; !done;) {
      DP_ASSIGN_OR_RETURN(proto::ExportRowsReply chunk,
                          client->ExportRows(req, absl::Seconds(60)));
      if (chunk.keys().size() % sizeof(Key) != 0 ||
          chunk.values().size() % sizeof(float) != 0) {
        return absl::DataLossError("export: a chunk of a partial key or value");
      }
      // Copied out of the reply's strings, which are not aligned for
      // floats. (A dense chunk has no keys: memcpy must not see the null
      // data() of an empty vector, which UBSan reports.)
      keys.resize(chunk.keys().size() / sizeof(Key));
      if (!keys.empty()) {
        std::memcpy(keys.data(), chunk.keys().data(),
                    keys.size() * sizeof(Key));
      }
      values.resize(chunk.values().size() / sizeof(float));
      if (!values.empty()) {
        std::memcpy(values.data(), chunk.values().data(),
                    values.size() * sizeof(float));
      }
      if (values.size() != chunk.count() * table->spec().width()) {
        return absl::DataLossError("export: a chunk of the wrong size");
      }
      DP_RETURN_IF_ERROR(sink.Add(chunk.first_key(), chunk.count(), keys.data(),
                                  values.data()));
      done = chunk.done();
      req.set_cursor(chunk.next_cursor());
    }
  }
  return sink.Finish();
}

absl::StatusOr<ExportResult> ExportFromCheckpoint(
    const std::vector<std::string>& data_dirs, uint64_t checkpoint,
    const ExportOptions& options) {
  struct Dir {
    std::unique_ptr<storage::Database> db;
    std::unique_ptr<storage::CheckpointStore> store;
  };
  std::vector<Dir> dirs;
  std::map<uint64_t, int> parts;  // checkpoint id -> dirs holding it
  for (const std::string& path : data_dirs) {
    Dir d;
    DP_ASSIGN_OR_RETURN(d.db,
                        storage::Database::Open(path, {.read_only = true}));
    d.store = std::make_unique<storage::CheckpointStore>(d.db.get());
    DP_ASSIGN_OR_RETURN(std::vector<uint64_t> ids, d.store->FinishedParts());
    for (uint64_t id : ids) parts[id]++;
    dirs.push_back(std::move(d));
  }
  // A range of the table in one dir's part.
  struct Found {
    size_t dir;
    proto::CheckpointPart::Range range;
  };
  // The table's ranges in checkpoint `id`, sorted, if they tile it.
  auto collect = [&](uint64_t id, std::vector<Found>* found,
                     proto::TableSpec* spec, int64_t* clock) -> absl::Status {
    found->clear();
    for (size_t i = 0; i < dirs.size(); ++i) {
      absl::StatusOr<proto::CheckpointPart> part = dirs[i].store->ReadPart(id);
      if (!part.ok()) continue;
      *clock = part->clock();
      for (const auto& r : part->ranges()) {
        if (r.spec().name() == options.table) {
          found->push_back({i, r});
          *spec = r.spec();
        }
      }
    }
    std::sort(found->begin(), found->end(), [](const Found& a, const Found& b) {
      return a.range.begin() < b.range.begin();
    });
    if (found->empty()) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint ", id, " holds no table '", options.table, "'"));
    }
    const Key end =
        spec->kind() == proto::DENSE ? spec->num_keys() : kKeySpaceEnd;
    Key at = 0;
    for (const Found& f : *found) {
      if (f.range.begin() != at) break;
      at = f.range.end();
    }
    if (at != end) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint ", id, " of table '", options.table, "': keys from ", at,
          " are in none of the data dirs given"));
    }
    return absl::OkStatus();
  };
  std::vector<Found> found;
  proto::TableSpec spec;
  int64_t clock = -1;
  absl::Status status = absl::NotFoundError(absl::StrCat(
      "no finished checkpoint in ", data_dirs.size(), " data dirs"));
  if (checkpoint != 0) {
    status = collect(checkpoint, &found, &spec, &clock);
  } else {
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      status = collect(it->first, &found, &spec, &clock);
      if (status.ok()) {
        checkpoint = it->first;
        break;
      }
    }
  }
  DP_RETURN_IF_ERROR(status);
  Sink sink(spec, options);
  DP_RETURN_IF_ERROR(sink.Begin());
  for (const Found& f : found) {
    DP_RETURN_IF_ERROR(dirs[f.dir].store->ReadChunks(
        checkpoint, spec.id(), f.range.begin(), f.range.chunks(),
        [&](const storage::StoredChunk& c) {
          // Admission counters of a bounded table are not parameters. (Its
          // cold tier is a copy beside the checkpoint, which this export
          // does not read: export from a running cluster for those rows.)
          if (c.info.kind() == proto::RowChunkInfo::PENDING) {
            return absl::OkStatus();
          }
          // The parameters are the chunk's first block.
          return sink.Add(c.info.first_key(), c.info.count(), c.keys.data(),
                          c.data.data());
        }));
  }
  DP_ASSIGN_OR_RETURN(ExportResult result, sink.Finish());
  result.checkpoint = checkpoint;
  result.clock = clock;
  return result;
}

}  // namespace downpour
