// Reads click logs in Criteo's TSV format (the Kaggle display-advertising
// set's train.txt): one row per line, 40 tab-separated fields: the label
// (0 or 1), 13 integer counts (decimal, possibly negative), 26 categorical
// ids (hex strings, Criteo's are 8 digits; up to 16 accepted). Any field
// but the label may be empty (missing): a missing count reads as 0, a
// missing id as kMissingId. Counts are reported as log(1 + max(x, 0)) in
// ClickBatchView::dense (raw in `counts` if asked), ids as their 64-bit
// value. A trailing '\r' is ignored; empty lines are skipped.
//
//   ASSIGN_OR_RETURN(auto reader, CriteoTsvReader::Open("train.txt", {}));
//   ASSIGN_OR_RETURN(size_t rows, reader->Read(view));  // 0: the end
//
// Sharding: with num_shards N, line i (0-based, empty lines included)
// belongs to rank i mod N, as the generator's rows do; other ranks' lines
// are skipped unparsed.
// Errors: kNotFound (or the errno's code) when the file cannot be opened;
// kInvalidArgument for a malformed line, naming the file, the 1-based line,
// the field and its text ("train.txt:17: field 15 (C2): 'xyz' is not a hex
// id"); kDataLoss when reading fails. After an error the reader is done:
// Read returns the same error again.
// Thread-compatible.
//
// AppendTsvLine writes one row in the same format (what clicklog_gen
// --tsv writes): the label, the 13 raw counts, the 26 ids as 8 or more
// lower-case hex digits, kMissingId as an empty field.
#ifndef DOWNPOUR_CLICKLOG_TSV_READER_H_
#define DOWNPOUR_CLICKLOG_TSV_READER_H_

#include <istream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clicklog/click_batch.h"

namespace downpour {
namespace clicklog {

struct TsvReaderOptions {
  int rank = 0;
  int num_shards = 1;
};

// Appends row `r` of `batch` (which must carry counts) and a newline.
void AppendTsvLine(const ClickBatchView& batch, size_t r, std::string* out);

class CriteoTsvReader {
 public:
  // kInvalidArgument for a rank outside [0, num_shards).
  static absl::StatusOr<std::unique_ptr<CriteoTsvReader>> Open(
      const std::string& path, const TsvReaderOptions& options);
  // Reads from `in`, naming it `name` in errors.
  static absl::StatusOr<std::unique_ptr<CriteoTsvReader>> FromStream(
      std::unique_ptr<std::istream> in, const std::string& name,
      const TsvReaderOptions& options);

  // Reads up to out.rows rows of this shard into out (rows [0, n)); returns
  // n, 0 at the end of the file. A malformed line fails the whole call.
  absl::StatusOr<size_t> Read(const ClickBatchView& out);

  // Lines read so far (all shards').
  uint64_t lines() const { return line_; }

 private:
  CriteoTsvReader(std::unique_ptr<std::istream> in, std::string name,
                  const TsvReaderOptions& options);
  // Parses one line into row `r` of `out`.
  absl::Status ParseLine(const std::string& line, const ClickBatchView& out,
                         size_t r) const;

  std::unique_ptr<std::istream> in_;
  const std::string name_;
  const TsvReaderOptions options_;
  uint64_t line_ = 0;  // lines consumed, 1-based number of the last
  absl::Status error_;
  std::string buffer_;
};

}  // namespace clicklog
}  // namespace downpour

#endif  // DOWNPOUR_CLICKLOG_TSV_READER_H_
