#include "clicklog/tsv_reader.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace downpour {
namespace clicklog {
namespace {

constexpr int kFields = 1 + kNumDense + kNumCategorical;

// "label", "I1".."I13", "C1".."C26": Criteo's own names for the columns.
std::string FieldName(int field) {
  if (field == 0) return "label";
  if (field <= kNumDense) return absl::StrCat("I", field);
  return absl::StrCat("C", field - kNumDense);
}

bool ParseHex(absl::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

bool ParseCount(absl::string_view s, int64_t* out) {
  // Digits with an optional sign; SimpleAtoi alone would accept spaces.
  if (s.empty()) return false;
  const size_t first = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (first == s.size()) return false;
  for (size_t i = first; i < s.size(); ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
  }
  return absl::SimpleAtoi(s, out);
}

}  // namespace

void AppendTsvLine(const ClickBatchView& batch, size_t r, std::string* out) {
  absl::StrAppend(out, batch.labels[r] > 0.5f ? "1" : "0");
  for (int j = 0; j < kNumDense; ++j) {
    absl::StrAppend(out, "\t", batch.counts[r * kNumDense + j]);
  }
  for (int c = 0; c < kNumCategorical; ++c) {
    const int64_t id = batch.categorical[r * kNumCategorical + c];
    out->push_back('\t');
    if (id != kMissingId) {
      absl::StrAppendFormat(out, "%08x", static_cast<uint64_t>(id));
    }
  }
  out->push_back('\n');
}

absl::StatusOr<std::unique_ptr<CriteoTsvReader>> CriteoTsvReader::Open(
    const std::string& path, const TsvReaderOptions& options) {
  auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
  if (!in->is_open()) {
    const int err = errno;
    const std::string message =
        absl::StrCat("open click log '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message)
                         : absl::FailedPreconditionError(message);
  }
  return FromStream(std::move(in), path, options);
}

absl::StatusOr<std::unique_ptr<CriteoTsvReader>> CriteoTsvReader::FromStream(
    std::unique_ptr<std::istream> in, const std::string& name,
    const TsvReaderOptions& options) {
  if (options.num_shards < 1 || options.rank < 0 ||
      options.rank >= options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("click log '", name, "': rank ", options.rank, " of ",
                     options.num_shards, " shards"));
  }
  return std::unique_ptr<CriteoTsvReader>(
      new CriteoTsvReader(std::move(in), name, options));
}

CriteoTsvReader::CriteoTsvReader(std::unique_ptr<std::istream> in,
                                 std::string name,
                                 const TsvReaderOptions& options)
    : in_(std::move(in)), name_(std::move(name)), options_(options) {}

absl::StatusOr<size_t> CriteoTsvReader::Read(const ClickBatchView& out) {
  if (!error_.ok()) return error_;
  if (out.dense.size() < out.rows * kNumDense ||
      out.categorical.size() < out.rows * kNumCategorical ||
      out.labels.size() < out.rows ||
      (!out.counts.empty() && out.counts.size() < out.rows * kNumDense)) {
    return absl::InvalidArgumentError(
        absl::StrCat("click log '", name_, "': batch spans too short for ",
                     out.rows, " rows"));
  }
  size_t r = 0;
  while (r < out.rows && std::getline(*in_, buffer_)) {
    const uint64_t index = line_++;
    if (index % static_cast<uint64_t>(options_.num_shards) !=
        static_cast<uint64_t>(options_.rank)) {
      continue;
    }
    if (!buffer_.empty() && buffer_.back() == '\r') buffer_.pop_back();
    if (buffer_.empty()) continue;
    absl::Status s = ParseLine(buffer_, out, r);
    if (!s.ok()) {
      error_ = s;
      return s;
    }
    ++r;
  }
  if (in_->bad() || (in_->fail() && !in_->eof())) {
    error_ = absl::DataLossError(absl::StrCat(
        "click log '", name_, "': read failed after line ", line_));
    return error_;
  }
  return r;
}

absl::Status CriteoTsvReader::ParseLine(const std::string& line,
                                        const ClickBatchView& out,
                                        size_t r) const {
  auto bad = [&](int field, absl::string_view text, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ":", line_, ": field ", field + 1, " (", FieldName(field),
        "): '", text.substr(0, 40), text.size() > 40 ? "..." : "", "' ", what));
  };
  absl::string_view rest(line);
  float* dense = out.dense.data() + r * kNumDense;
  int64_t* cat = out.categorical.data() + r * kNumCategorical;
  int field = 0;
  while (true) {
    const size_t tab = rest.find('\t');
    const absl::string_view text = rest.substr(0, tab);
    if (field == kFields) {  // a 41st field: reported below
      ++field;
      break;
    }
    if (field == 0) {
      if (text == "0" || text == "1") {
        out.labels[r] = text == "1" ? 1.0f : 0.0f;
      } else {
        return bad(field, text, "is not a label (0 or 1)");
      }
    } else if (field <= kNumDense) {
      int64_t count = 0;
      if (!text.empty() && !ParseCount(text, &count)) {
        return bad(field, text, "is not an integer");
      }
      dense[field - 1] = static_cast<float>(
          std::log1p(static_cast<double>(count > 0 ? count : 0)));
      if (!out.counts.empty()) out.counts[r * kNumDense + field - 1] = count;
    } else {
      uint64_t id = static_cast<uint64_t>(kMissingId);
      if (!text.empty() && !ParseHex(text, &id)) {
        return bad(field, text, "is not a hex id (1 to 16 hex digits)");
      }
      cat[field - 1 - kNumDense] = static_cast<int64_t>(id);
    }
    ++field;
    if (tab == absl::string_view::npos) break;
    rest.remove_prefix(tab + 1);
  }
  if (field != kFields) {
    // Count every field for the message, also past the 40th.
    size_t fields = 1;
    for (char c : line) fields += c == '\t';
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ":", line_, ": ", fields, " tab-separated fields, expected ",
        kFields, " (label, 13 integers, 26 hex ids)"));
  }
  return absl::OkStatus();
}

}  // namespace clicklog
}  // namespace downpour
