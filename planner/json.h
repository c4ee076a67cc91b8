// JSON for the planner's files (the model description, the calibration) and
// for `psctl plan --json`: a value type, a parser that remembers the line of
// every value, a writer, and a reader of objects whose errors name the file
// and the field.
//
//   DP_ASSIGN_OR_RETURN(Json doc, ParseJson(text), "model file 'm.json'");
//   ObjectReader r(doc, "model file 'm.json'");
//   const int64_t batch = r.Int("batch", /*min=*/1);
//   const std::string name = r.OptionalString("name", "model");
//   DP_RETURN_IF_ERROR(r.Finish());   // the first error, or unknown fields
//
// Errors are kInvalidArgument: "model file 'm.json': field 'layers[2]'
// (line 4): must be an integer >= 1, got -3".
//
// Thread-safety: values are plain data (no sharing); a reader belongs to one
// thread.
#ifndef DOWNPOUR_PLANNER_JSON_H_
#define DOWNPOUR_PLANNER_JSON_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace downpour {
namespace planner {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  Json() = default;  // null
  static Json Bool(bool b);
  static Json Number(double v);
  static Json String(std::string s);
  static Json Array();
  static Json Object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  bool is_number() const { return kind_ == Kind::kNumber; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  // REQUIRES: the matching kind (else the zero value).
  bool boolean() const { return bool_; }
  double number() const { return number_; }
  const std::string& string() const { return string_; }
  const std::vector<Json>& items() const { return items_; }
  const std::vector<std::pair<std::string, Json>>& members() const {
    return members_;
  }
  // The member named `key` of an object, or nullptr.
  const Json* Find(absl::string_view key) const;
  // Objects: sets `key` (replacing an existing member, else appending, so
  // members keep the order they were first set in). Arrays: appends.
  // Both return *this for chaining. REQUIRES: the matching kind.
  Json& Set(std::string key, Json value);
  Json& Append(Json value);

  // 1-based line of the value's first character in the parsed text; 0 for
  // values built in code.
  int line() const { return line_; }
  // The text: indent 0 writes one line, otherwise nested lines indented by
  // that many spaces. Numbers that are integers up to 2^53 print without a
  // fraction, others with 10 significant digits; NaN and infinities (which
  // JSON cannot hold) print as null.
  std::string Dump(int indent = 2) const;

 private:
  friend class JsonParser;
  void DumpTo(std::string* out, int indent, int depth) const;

  Kind kind_ = Kind::kNull;
  bool bool_ = false;
  double number_ = 0;
  std::string string_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
  int line_ = 0;
};

// Parses one JSON value (RFC 8259; nesting at most 64 deep; duplicate
// object keys are an error). kInvalidArgument "line L, column C: what".
absl::StatusOr<Json> ParseJson(absl::string_view text);

}  // namespace planner
}  // namespace downpour

#endif  // DOWNPOUR_PLANNER_JSON_H_
