#include "planner/object_reader.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace downpour {
namespace planner {

absl::Status FieldError(absl::string_view where, absl::string_view path,
                        const Json* at, absl::string_view what) {
  std::string line;
  if (at != nullptr && at->line() > 0) {
    line = absl::StrCat(" (line ", at->line(), ")");
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": field '", path, "'", line, ": ", what));
}

namespace {

const char* KindName(Json::Kind k) {
  switch (k) {
    case Json::Kind::kNull:
      return "null";
    case Json::Kind::kBool:
      return "a boolean";
    case Json::Kind::kNumber:
      return "a number";
    case Json::Kind::kString:
      return "a string";
    case Json::Kind::kArray:
      return "an array";
    case Json::Kind::kObject:
      return "an object";
  }
  return "?";
}

std::string Shown(double v) { return absl::StrFormat("%.10g", v); }

}  // namespace

ObjectReader::ObjectReader(const Json& value, std::string where,
                           std::string path)
    : value_(value), where_(std::move(where)), path_(std::move(path)) {
  if (!value_.is_object()) {
    status_ = path_.empty() ? absl::InvalidArgumentError(absl::StrCat(
                                  where_, ": must be a JSON object, is ",
                                  KindName(value_.kind())))
                            : FieldError(where_, path_, &value_,
                                         absl::StrCat("must be an object, is ",
                                                      KindName(value_.kind())));
  }
}

std::string ObjectReader::Path(absl::string_view field) const {
  return path_.empty() ? std::string(field) : absl::StrCat(path_, ".", field);
}

std::string ObjectReader::Item(absl::string_view field, size_t index) const {
  return absl::StrCat(Path(field), "[", index, "]");
}

void ObjectReader::Fail(absl::string_view field, const Json* at,
                        absl::string_view what) {
  if (status_.ok()) status_ = FieldError(where_, Path(field), at, what);
}

void ObjectReader::Merge(const absl::Status& nested) {
  if (status_.ok() && !nested.ok()) status_ = nested;
}

const Json* ObjectReader::Lookup(absl::string_view field, bool required) {
  asked_.emplace_back(field);
  if (!value_.is_object()) return nullptr;
  const Json* v = value_.Find(field);
  if (v == nullptr && required) Fail(field, nullptr, "missing");
  return v;
}

double ObjectReader::Number(absl::string_view field, double min, double max) {
  const Json* v = Lookup(field, true);
  if (v == nullptr) return 0;
  return OptionalNumber(field, 0, min, max);
}

double ObjectReader::OptionalNumber(absl::string_view field, double fallback,
                                    double min, double max) {
  const Json* v = Lookup(field, false);
  if (v == nullptr) return fallback;
  if (!v->is_number()) {
    Fail(field, v, absl::StrCat("must be a number, is ", KindName(v->kind())));
    return fallback;
  }
  if (v->number() < min || v->number() > max) {
    std::string range;
    if (std::isfinite(min) && std::isfinite(max)) {
      range = absl::StrCat("in [", Shown(min), ", ", Shown(max), "]");
    } else if (std::isfinite(min)) {
      range = absl::StrCat(">= ", Shown(min));
    } else {
      range = absl::StrCat("<= ", Shown(max));
    }
    Fail(field, v,
         absl::StrCat("must be ", range, ", is ", Shown(v->number())));
    return fallback;
  }
  return v->number();
}

int64_t ObjectReader::Int(absl::string_view field, int64_t min, int64_t max) {
  const Json* v = Lookup(field, true);
  if (v == nullptr) return 0;
  return OptionalInt(field, 0, min, max);
}

int64_t ObjectReader::OptionalInt(absl::string_view field, int64_t fallback,
                                  int64_t min, int64_t max) {
  const Json* v = Lookup(field, false);
  if (v == nullptr) return fallback;
  if (!v->is_number() || v->number() != std::floor(v->number()) ||
      std::fabs(v->number()) > 9007199254740992.0) {
    Fail(field, v,
         v->is_number()
             ? absl::StrCat("must be an integer, is ", Shown(v->number()))
             : absl::StrCat("must be an integer, is ", KindName(v->kind())));
    return fallback;
  }
  const auto i = static_cast<int64_t>(v->number());
  if (i < min || i > max) {
    std::string range = max == std::numeric_limits<int64_t>::max()
                            ? absl::StrCat(">= ", min)
                            : absl::StrCat("in [", min, ", ", max, "]");
    Fail(field, v, absl::StrCat("must be an integer ", range, ", is ", i));
    return fallback;
  }
  return i;
}

std::string ObjectReader::String(absl::string_view field) {
  const Json* v = Lookup(field, true);
  if (v == nullptr) return "";
  return OptionalString(field, "");
}

std::string ObjectReader::OptionalString(absl::string_view field,
                                         absl::string_view fallback) {
  const Json* v = Lookup(field, false);
  if (v == nullptr) return std::string(fallback);
  if (!v->is_string()) {
    Fail(field, v, absl::StrCat("must be a string, is ", KindName(v->kind())));
    return std::string(fallback);
  }
  return v->string();
}

bool ObjectReader::OptionalBool(absl::string_view field, bool fallback) {
  const Json* v = Lookup(field, false);
  if (v == nullptr) return fallback;
  if (!v->is_bool()) {
    Fail(field, v,
         absl::StrCat("must be true or false, is ", KindName(v->kind())));
    return fallback;
  }
  return v->boolean();
}

const Json* ObjectReader::Value(absl::string_view field) {
  return Lookup(field, true);
}

const Json* ObjectReader::OptionalValue(absl::string_view field) {
  return Lookup(field, false);
}

absl::Status ObjectReader::Finish() {
  if (!status_.ok()) return status_;
  for (const auto& [key, v] : value_.members()) {
    bool known = false;
    for (const std::string& a : asked_) known = known || a == key;
    if (!known) {
      std::string names;
      for (const std::string& a : asked_) {
        if (names.find(absl::StrCat("'", a, "'")) != std::string::npos) {
          continue;
        }
        absl::StrAppend(&names, names.empty() ? "" : ", ", "'", a, "'");
      }
      return FieldError(
          where_, Path(key), &v,
          absl::StrCat("unknown field (known here: ", names, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace planner
}  // namespace downpour
