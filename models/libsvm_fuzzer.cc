// Fuzzes the libsvm/svmlight parser (ParseLibsvm) with any text a user
// could hand a worker (--libsvm) or the L-BFGS coordinator (--data).
//
// Checks, besides "no crash, no undefined behaviour": a parsed data set has
// the documented shape (row offsets from 0, rising, ending at the feature
// count; labels 0 or 1; finite values; ids distinct within a row), and an
// error is kInvalidArgument naming a line.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "models/dataset.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "libsvm_fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  auto parsed = downpour::ParseLibsvm(in);
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail(parsed.status().ToString().c_str());
    }
    if (parsed.status().message().find("line ") == absl::string_view::npos) {
      Fail(("error without a line: " + parsed.status().ToString()).c_str());
    }
    return 0;
  }
  const downpour::SparseDataset& d = *parsed;
  if (d.row_offsets.size() != d.NumRows() + 1 || d.row_offsets[0] != 0 ||
      d.row_offsets.back() != d.feature_ids.size() ||
      d.feature_ids.size() != d.feature_values.size()) {
    Fail("inconsistent row offsets");
  }
  for (size_t r = 0; r < d.NumRows(); ++r) {
    if (d.labels[r] != 0 && d.labels[r] != 1) Fail("label not 0 or 1");
    if (d.row_offsets[r] > d.row_offsets[r + 1]) Fail("row offsets fall");
    std::set<uint64_t> ids;
    for (size_t i = d.row_offsets[r]; i < d.row_offsets[r + 1]; ++i) {
      if (!std::isfinite(d.feature_values[i])) Fail("non-finite value");
      if (!ids.insert(d.feature_ids[i]).second) Fail("id twice in a row");
    }
  }
  return 0;
}
