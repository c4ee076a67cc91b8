#include "scheduler/state_store.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace downpour {
namespace {

constexpr char kState[] = "state";
constexpr char kClocks[] = "clocks";
constexpr char kManifest[] = "manifest/";

std::string ManifestKey(uint64_t id) {
  std::string k = kManifest;
  storage::AppendBigEndian64(&k, id);
  return k;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(
    const std::string& dir) {
  auto db = storage::Database::Open(dir, {});
  if (!db.ok()) {
    if (db.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("state dir ", dir,
                       " is in use: another ps_scheduler is running on it (",
                       db.status().message(), ")"));
    }
    return Annotate(db.status(), absl::StrCat("open state dir ", dir));
  }
  return std::unique_ptr<StateStore>(new StateStore(*std::move(db)));
}

absl::StatusOr<std::optional<proto::SchedulerState>> StateStore::LoadState() {
  absl::StatusOr<std::string> bytes = db_->Get(kState);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kNotFound) {
      return std::optional<proto::SchedulerState>();
    }
    return bytes.status();
  }
  proto::SchedulerState state;
  if (!state.ParseFromString(*bytes) || state.format() != 1) {
    return absl::DataLossError(
        absl::StrCat("state dir ", dir(), ": unreadable scheduler state"));
  }
  return std::optional<proto::SchedulerState>(std::move(state));
}

absl::StatusOr<proto::SchedulerClocks> StateStore::LoadClocks() {
  proto::SchedulerClocks clocks;
  absl::StatusOr<std::string> bytes = db_->Get(kClocks);
  if (!bytes.ok()) {
    if (bytes.status().code() == absl::StatusCode::kNotFound) return clocks;
    return bytes.status();
  }
  if (!clocks.ParseFromString(*bytes)) {
    return absl::DataLossError(
        absl::StrCat("state dir ", dir(), ": unreadable worker clocks"));
  }
  return clocks;
}

absl::StatusOr<std::vector<proto::CheckpointManifest>>
StateStore::LoadManifests() {
  std::vector<proto::CheckpointManifest> out;
  absl::Status bad;
  DP_RETURN_IF_ERROR(
      db_->Scan(kManifest, [&](absl::string_view k, absl::string_view v) {
        proto::CheckpointManifest m;
        if (!m.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
          bad = absl::DataLossError(absl::StrCat(
              "state dir ", dir(), ": unreadable checkpoint manifest ",
              storage::ReadBigEndian64(k.substr(sizeof(kManifest) - 1))));
          return false;
        }
        out.push_back(std::move(m));
        return true;
      }));
  DP_RETURN_IF_ERROR(bad);
  return out;
}

absl::Status StateStore::SaveState(const std::string& state) {
  return db_->Put(kState, state, {.sync = true});
}

absl::Status StateStore::SaveClocks(const proto::SchedulerClocks& clocks) {
  return db_->Put(kClocks, clocks.SerializeAsString(), {.sync = false});
}

absl::Status StateStore::SaveManifest(const proto::CheckpointManifest& m) {
  return db_->Put(ManifestKey(m.id()), m.SerializeAsString(), {.sync = true});
}

absl::Status StateStore::DeleteManifest(uint64_t id) {
  return db_->Delete(ManifestKey(id), {.sync = true});
}

}  // namespace downpour
