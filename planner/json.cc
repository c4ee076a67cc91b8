#include "planner/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_text.h"

namespace downpour {
namespace planner {

Json Json::Bool(bool b) {
  Json j;
  j.kind_ = Kind::kBool;
  j.bool_ = b;
  return j;
}

Json Json::Number(double v) {
  Json j;
  j.kind_ = Kind::kNumber;
  j.number_ = v;
  return j;
}

Json Json::String(std::string s) {
  Json j;
  j.kind_ = Kind::kString;
  j.string_ = std::move(s);
  return j;
}

Json Json::Array() {
  Json j;
  j.kind_ = Kind::kArray;
  return j;
}

Json Json::Object() {
  Json j;
  j.kind_ = Kind::kObject;
  return j;
}

const Json* Json::Find(absl::string_view key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

Json& Json::Set(std::string key, Json value) {
  for (auto& [k, v] : members_) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  members_.emplace_back(std::move(key), std::move(value));
  return *this;
}

Json& Json::Append(Json value) {
  items_.push_back(std::move(value));
  return *this;
}

namespace {

std::string FormatNumber(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) <= 9007199254740992.0) {
    return absl::StrFormat("%.0f", v);
  }
  return absl::StrFormat("%.10g", v);
}

}  // namespace

void Json::DumpTo(std::string* out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * d), ' ');
  };
  switch (kind_) {
    case Kind::kNull:
      out->append("null");
      return;
    case Kind::kBool:
      out->append(bool_ ? "true" : "false");
      return;
    case Kind::kNumber:
      out->append(FormatNumber(number_));
      return;
    case Kind::kString:
      AppendJsonString(string_, out);
      return;
    case Kind::kArray: {
      // Arrays of numbers stay on one line: a plot's series, layer sizes.
      bool flat = true;
      for (const Json& v : items_) flat = flat && v.is_number();
      out->push_back('[');
      for (size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out->append(flat && indent > 0 ? ", " : ",");
        if (!flat) newline(depth + 1);
        items_[i].DumpTo(out, indent, depth + 1);
      }
      if (!flat && !items_.empty()) newline(depth);
      out->push_back(']');
      return;
    }
    case Kind::kObject:
      out->push_back('{');
      for (size_t i = 0; i < members_.size(); ++i) {
        if (i > 0) out->push_back(',');
        newline(depth + 1);
        AppendJsonString(members_[i].first, out);
        out->append(indent > 0 ? ": " : ":");
        members_[i].second.DumpTo(out, indent, depth + 1);
      }
      if (!members_.empty()) newline(depth);
      out->push_back('}');
      return;
  }
}

std::string Json::Dump(int indent) const {
  std::string out;
  DumpTo(&out, indent, 0);
  return out;
}

// A recursive-descent parser over the whole text.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    Json v;
    if (absl::Status s = ParseValue(0, &v); !s.ok()) return s;
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    int line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ", column ", column, ": ", what));
  }

  int Line() const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      line += text_[i] == '\n';
    }
    return line;
  }

  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status ParseValue(int depth, Json* out) {
    if (depth > 64) return Error("nested more than 64 deep");
    SkipSpace();
    if (pos_ >= text_.size()) return Error("unexpected end of text");
    const int line = Line();
    const char c = text_[pos_];
    absl::Status s;
    if (c == '{') {
      s = ParseObject(depth, out);
    } else if (c == '[') {
      s = ParseArray(depth, out);
    } else if (c == '"') {
      std::string str;
      s = ParseString(&str);
      *out = Json::String(std::move(str));
    } else if (Consume("true")) {
      *out = Json::Bool(true);
    } else if (Consume("false")) {
      *out = Json::Bool(false);
    } else if (Consume("null")) {
      *out = Json();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      s = ParseNumber(out);
    } else {
      return Error(absl::StrFormat("unexpected character '%c'", c));
    }
    out->line_ = line;
    return s;
  }

  absl::Status ParseObject(int depth, Json* out) {
    *out = Json::Object();
    ++pos_;  // '{'
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') {
        return Error("expected a quoted member name");
      }
      std::string key;
      if (absl::Status s = ParseString(&key); !s.ok()) return s;
      if (out->Find(key) != nullptr) {
        return Error(absl::StrCat("member \"", key, "\" appears twice"));
      }
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') {
        return Error("expected ':' after a member name");
      }
      ++pos_;
      Json v;
      if (absl::Status s = ParseValue(depth + 1, &v); !s.ok()) return s;
      out->members_.emplace_back(std::move(key), std::move(v));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in an object");
    }
  }

  absl::Status ParseArray(int depth, Json* out) {
    *out = Json::Array();
    ++pos_;  // '['
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      Json v;
      if (absl::Status s = ParseValue(depth + 1, &v); !s.ok()) return s;
      out->items_.push_back(std::move(v));
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in an array");
    }
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < text_.size()) {
      const char c = text_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("control character in a string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) break;
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (pos_ + 4 > text_.size()) return Error("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[pos_++];
            code <<= 4;
            if (h >= '0' && h <= '9') {
              code |= h - '0';
            } else if (h >= 'a' && h <= 'f') {
              code |= h - 'a' + 10;
            } else if (h >= 'A' && h <= 'F') {
              code |= h - 'A' + 10;
            } else {
              return Error("bad \\u escape");
            }
          }
          AppendUtf8(code, out);
          break;
        }
        default:
          return Error(absl::StrFormat("bad escape '\\%c'", e));
      }
    }
    return Error("unterminated string");
  }

  absl::Status ParseNumber(Json* out) {
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        ++pos_;
      }
      return pos_ > from;
    };
    if (!digits()) return Error("expected digits");
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (!digits()) return Error("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      if (!digits()) return Error("expected digits in the exponent");
    }
    const std::string number(text_.substr(start, pos_ - start));
    const double v = std::strtod(number.c_str(), nullptr);
    if (!std::isfinite(v)) {
      pos_ = start;
      return Error("number out of range");
    }
    *out = Json::Number(v);
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<Json> ParseJson(absl::string_view text) {
  return JsonParser(text).ParseDocument();
}

}  // namespace planner
}  // namespace downpour
