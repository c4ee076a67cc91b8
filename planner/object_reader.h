// Reads typed members of a JSON object (planner/json.h) for the planner's
// files, so that every error names the file, the field's path from the
// document's root and its line.
//
//   ObjectReader r(doc, "model file 'm.json'");
//   const int64_t batch = r.Int("batch", /*min=*/1);
//   const std::string name = r.OptionalString("name", "model");
//   DP_RETURN_IF_ERROR(r.Finish());   // the first error, or unknown fields
//
// Errors are kInvalidArgument: "model file 'm.json': field 'layers[2]'
// (line 4): must be an integer >= 1, is -3".
//
// Thread-compatible: a reader belongs to one thread.
#ifndef DOWNPOUR_PLANNER_OBJECT_READER_H_
#define DOWNPOUR_PLANNER_OBJECT_READER_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "planner/json.h"

namespace downpour {
namespace planner {

// Reads the members of one object, collecting the first error; every error
// names `where` (e.g. "model file 'm.json'") and the field's path from the
// document's root ("layers[2]", "network.latency_us.median"). A value that
// is not an object makes every read fail with that error. After the reads,
// Finish() also refuses members that were never asked for (a misspelt
// field is an error, not a silent default).
class ObjectReader {
 public:
  // `value` must outlive the reader. `path` is the object's own path ("" for
  // the root).
  ObjectReader(const Json& value, std::string where, std::string path = "");

  // Required members (a missing one is an error; the value returned then is
  // 0 or empty and the caller goes on to Finish()).
  double Number(absl::string_view field,
                double min = -std::numeric_limits<double>::infinity(),
                double max = std::numeric_limits<double>::infinity());
  int64_t Int(absl::string_view field,
              int64_t min = std::numeric_limits<int64_t>::min(),
              int64_t max = std::numeric_limits<int64_t>::max());
  std::string String(absl::string_view field);
  // The member itself, of any kind (nullptr and an error if missing).
  const Json* Value(absl::string_view field);

  // Optional members: `fallback` when missing, an error when present with
  // the wrong kind or range.
  double OptionalNumber(absl::string_view field, double fallback,
                        double min = -std::numeric_limits<double>::infinity(),
                        double max = std::numeric_limits<double>::infinity());
  int64_t OptionalInt(absl::string_view field, int64_t fallback,
                      int64_t min = std::numeric_limits<int64_t>::min(),
                      int64_t max = std::numeric_limits<int64_t>::max());
  std::string OptionalString(absl::string_view field,
                             absl::string_view fallback);
  bool OptionalBool(absl::string_view field, bool fallback);
  const Json* OptionalValue(absl::string_view field);  // nullptr if missing

  // The path of a member or of an array item below this object, for nested
  // readers and errors: Path("layers") = "layers", Item("layers", 2) =
  // "layers[2]".
  std::string Path(absl::string_view field) const;
  std::string Item(absl::string_view field, size_t index) const;
  // Records an error about member `field` (unless one is recorded already):
  // "<where>: field '<path>' (line L): <what>".
  void Fail(absl::string_view field, const Json* at, absl::string_view what);
  // Records another reader's error (nested objects), if it has one.
  void Merge(const absl::Status& nested);

  // The first error recorded, else kInvalidArgument naming the first member
  // no read asked for, else OK.
  absl::Status Finish();
  const absl::Status& status() const { return status_; }

 private:
  const Json* Lookup(absl::string_view field, bool required);

  const Json& value_;
  const std::string where_;
  const std::string path_;
  std::vector<std::string> asked_;
  absl::Status status_;
};

// "<where>: field '<path>' (line L): <what>" as kInvalidArgument; the line
// is left out when `at` is null or was not parsed.
absl::Status FieldError(absl::string_view where, absl::string_view path,
                        const Json* at, absl::string_view what);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_OBJECT_READER_H_
