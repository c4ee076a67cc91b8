#include "psctl/output.h"

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json_text.h"
#include "google/protobuf/util/json_util.h"

namespace downpour {
namespace {

// A JSON value as parsed, objects keeping their keys' order (protobuf's
// field order), so that YAML lists fields as JSON does.
struct Node {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  std::string text;  // kBool, kNumber: as written; kString: decoded
  std::vector<std::unique_ptr<Node>> items;                           // kArray
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> fields;  // kObject
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view in) : in_(in) {}

  absl::StatusOr<std::unique_ptr<Node>> Parse() {
    auto node = Value(0);
    Space();
    if (node != nullptr && pos_ != in_.size()) Fail("trailing text");
    if (!error_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("not JSON at offset ", pos_, ": ", error_));
    }
    return node;
  }

 private:
  void Fail(const char* why) {
    if (error_.empty()) error_ = why;
  }
  void Space() {
    while (pos_ < in_.size() && absl::ascii_isspace(in_[pos_])) ++pos_;
  }
  bool Eat(char c) {
    Space();
    if (pos_ < in_.size() && in_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::unique_ptr<Node> Value(int depth) {
    if (depth > 100) {
      Fail("nested too deep");
      return nullptr;
    }
    Space();
    auto node = std::make_unique<Node>();
    if (pos_ >= in_.size()) {
      Fail("unexpected end");
      return nullptr;
    }
    const char c = in_[pos_];
    if (c == '{') {
      ++pos_;
      node->kind = Node::kObject;
      if (Eat('}')) return node;
      do {
        Space();
        std::string key;
        if (!String(&key) || !Eat(':')) {
          Fail("expected \"key\":");
          return nullptr;
        }
        auto value = Value(depth + 1);
        if (value == nullptr) return nullptr;
        node->fields.emplace_back(std::move(key), std::move(value));
      } while (Eat(','));
      if (!Eat('}')) Fail("expected , or }");
    } else if (c == '[') {
      ++pos_;
      node->kind = Node::kArray;
      if (Eat(']')) return node;
      do {
        auto value = Value(depth + 1);
        if (value == nullptr) return nullptr;
        node->items.push_back(std::move(value));
      } while (Eat(','));
      if (!Eat(']')) Fail("expected , or ]");
    } else if (c == '"') {
      node->kind = Node::kString;
      if (!String(&node->text)) Fail("bad string");
    } else {
      size_t end = pos_;
      while (end < in_.size() &&
             (absl::ascii_isalnum(in_[end]) || in_[end] == '-' ||
              in_[end] == '+' || in_[end] == '.')) {
        ++end;
      }
      node->text = std::string(in_.substr(pos_, end - pos_));
      pos_ = end;
      if (node->text == "true" || node->text == "false") {
        node->kind = Node::kBool;
      } else if (node->text == "null") {
        node->kind = Node::kNull;
      } else if (!node->text.empty() &&
                 (absl::ascii_isdigit(node->text[0]) || node->text[0] == '-')) {
        node->kind = Node::kNumber;
      } else {
        Fail("unexpected token");
        return nullptr;
      }
    }
    return error_.empty() ? std::move(node) : nullptr;
  }

  // A JSON string at pos_, decoded to UTF-8.
  bool String(std::string* out) {
    if (pos_ >= in_.size() || in_[pos_] != '"') return false;
    ++pos_;
    while (pos_ < in_.size() && in_[pos_] != '"') {
      char c = in_[pos_++];
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) return false;
      c = in_[pos_++];
      switch (c) {
        case 'n':
          out->push_back('\n');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'u': {
          if (pos_ + 4 > in_.size()) return false;
          const unsigned cp =
              std::stoul(std::string(in_.substr(pos_, 4)), nullptr, 16);
          pos_ += 4;
          // protobuf escapes only control characters and a few ASCII ones
          // this way; anything else arrives as UTF-8 already.
          AppendUtf8(cp, out);
          break;
        }
        default:  // " \ /
          out->push_back(c);
      }
    }
    if (pos_ >= in_.size()) return false;
    ++pos_;
    return true;
  }

  absl::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

// A string as YAML reads it back: plain where that is unambiguous, else
// double-quoted with JSON's escapes (a subset of YAML's).
std::string YamlString(const std::string& s) {
  static const char* const kWords[] = {"true", "false", "yes", "no", "on",
                                       "off",  "null",  "~",   "y",  "n"};
  bool plain = !s.empty() && (absl::ascii_isalpha(s[0]) || s[0] == '_' ||
                              s[0] == '/' || s[0] == '.');
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.' ||
          c == '/' || c == '@')) {
      plain = false;
    }
  }
  for (const char* w : kWords) {
    if (absl::AsciiStrToLower(s) == w) plain = false;
  }
  if (plain) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

std::string Scalar(const Node& n) {
  switch (n.kind) {
    case Node::kNull:
      return "null";
    case Node::kString:
      return YamlString(n.text);
    case Node::kArray:
      return "[]";
    case Node::kObject:
      return "{}";
    default:
      return n.text;
  }
}

bool IsBlock(const Node& n) {
  return (n.kind == Node::kObject && !n.fields.empty()) ||
         (n.kind == Node::kArray && !n.items.empty());
}

// Appends `n` (a non-empty object or array) at `indent` spaces. `first`:
// the prefix of its first line ("- " of an enclosing list item), which
// already stands where the indent would.
void Block(const Node& n, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  bool first = true;
  auto lead = [&]() -> std::string {
    // The first line of an item of a list continues the "- " before it.
    std::string p = first ? "" : pad;
    first = false;
    return p;
  };
  if (n.kind == Node::kObject) {
    for (const auto& [key, value] : n.fields) {
      absl::StrAppend(out, lead(), YamlString(key), ":");
      if (IsBlock(*value)) {
        absl::StrAppend(out, "\n");
        // Lists under a key sit at the key's indent, as kubectl prints them.
        const int inner = value->kind == Node::kArray ? indent : indent + 2;
        out->append(inner, ' ');
        Block(*value, inner, out);
      } else {
        absl::StrAppend(out, " ", Scalar(*value), "\n");
      }
    }
  } else {
    for (const auto& item : n.items) {
      absl::StrAppend(out, lead(), "- ");
      if (IsBlock(*item)) {
        Block(*item, indent + 2, out);
      } else {
        absl::StrAppend(out, Scalar(*item), "\n");
      }
    }
  }
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view name) {
  if (name.empty() || name == "text") return OutputFormat::kText;
  if (name == "wide") return OutputFormat::kWide;
  if (name == "json") return OutputFormat::kJson;
  if (name == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(absl::StrCat(
      "output format '", name, "': json, yaml or wide (default: text)"));
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string json;
  // Printing a valid message cannot fail (no Any fields of unknown types).
  (void)google::protobuf::util::MessageToJsonString(message, &json, o);
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return json;
}

absl::StatusOr<std::string> JsonToYaml(absl::string_view json) {
  absl::StatusOr<std::unique_ptr<Node>> root = JsonParser(json).Parse();
  if (!root.ok()) return root.status();
  std::string out;
  if (IsBlock(**root)) {
    Block(**root, 0, &out);
  } else {
    out = Scalar(**root) + "\n";
  }
  return out;
}

std::string ToYaml(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> yaml = JsonToYaml(ToJson(message));
  return yaml.ok() ? *yaml : "";
}

int PrintOutput(const google::protobuf::Message& message, OutputFormat format,
                const std::function<std::string(bool wide)>& text) {
  std::string out;
  switch (format) {
    case OutputFormat::kText:
    case OutputFormat::kWide:
      out = text(format == OutputFormat::kWide);
      break;
    case OutputFormat::kJson:
      out = ToJson(message);
      break;
    case OutputFormat::kYaml: {
      absl::StatusOr<std::string> yaml = JsonToYaml(ToJson(message));
      if (!yaml.ok()) {
        std::fprintf(stderr, "psctl: %s\n", yaml.status().ToString().c_str());
        return kExitFailed;
      }
      out = *std::move(yaml);
      break;
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace downpour
