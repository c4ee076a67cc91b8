#include "clicklog/tsv_reader.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "clicklog/generator.h"
#include "common/test_util.h"

namespace downpour {
namespace clicklog {
namespace {

using ::testing::HasSubstr;

struct Rows {
  explicit Rows(size_t n)
      : dense(n * kNumDense),
        labels(n),
        cat(n * kNumCategorical),
        counts(n * kNumDense) {
    view.rows = n;
    view.dense = absl::MakeSpan(dense);
    view.categorical = absl::MakeSpan(cat);
    view.labels = absl::MakeSpan(labels);
    view.counts = absl::MakeSpan(counts);
  }
  std::vector<float> dense, labels;
  std::vector<int64_t> cat, counts;
  ClickBatchView view;
};

std::unique_ptr<CriteoTsvReader> FromText(const std::string& text,
                                          TsvReaderOptions options = {}) {
  auto reader = CriteoTsvReader::FromStream(
      std::make_unique<std::istringstream>(text), "day_0.tsv", options);
  EXPECT_OK(reader);
  return std::move(reader).value();
}

// A well-formed line with `label`, counts 0..12 and ids 0x10..0x29.
std::string Line(const std::string& label = "1") {
  std::string s = label;
  for (int j = 0; j < kNumDense; ++j) s += "\t" + std::to_string(j);
  for (int c = 0; c < kNumCategorical; ++c) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08x", 0x10 + c);
    s += "\t" + std::string(hex);
  }
  return s + "\n";
}

TEST(TsvReaderTest, RoundTripsTheGeneratorsRows) {
  GeneratorOptions o;
  o.scale = 0.01;
  auto gen = ClickLogGenerator::Create(o);
  ASSERT_OK(gen);
  Rows written(500);
  (*gen)->Fill(0, 1, written.view);
  std::string text;
  for (size_t r = 0; r < 500; ++r) AppendTsvLine(written.view, r, &text);
  auto reader = FromText(text);
  Rows a(300), b(300);
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Read(a.view));
  EXPECT_EQ(n, 300u);
  ASSERT_OK_AND_ASSIGN(n, reader->Read(b.view));
  EXPECT_EQ(n, 200u);
  ASSERT_OK_AND_ASSIGN(n, reader->Read(b.view));
  EXPECT_EQ(n, 0u);
  for (size_t r = 0; r < 500; ++r) {
    const Rows& got = r < 300 ? a : b;
    const size_t i = r < 300 ? r : r - 300;
    ASSERT_EQ(got.labels[i], written.labels[r]) << r;
    for (int j = 0; j < kNumDense; ++j) {
      // Bit for bit: the same log1p of the same count.
      ASSERT_EQ(got.dense[i * kNumDense + j], written.dense[r * kNumDense + j]);
      ASSERT_EQ(got.counts[i * kNumDense + j],
                written.counts[r * kNumDense + j]);
    }
    for (int c = 0; c < kNumCategorical; ++c) {
      ASSERT_EQ(got.cat[i * kNumCategorical + c],
                written.cat[r * kNumCategorical + c]);
    }
  }
}

TEST(TsvReaderTest, EmptyFieldsNegativeCountsAndCrlf) {
  std::string line = "0";
  for (int j = 0; j < kNumDense; ++j) line += j == 1 ? "\t-3" : "\t";
  for (int c = 0; c < kNumCategorical; ++c)
    line += c == 0 ? "\tFFFFFFFF" : "\t";
  auto reader = FromText(line + "\r\n\n" + Line("1"));
  Rows rows(5);
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Read(rows.view));
  ASSERT_EQ(n, 2u);  // the empty line is skipped
  EXPECT_EQ(rows.labels[0], 0.0f);
  EXPECT_EQ(rows.counts[1], -3);
  EXPECT_EQ(rows.dense[1], 0.0f);  // log(1 + max(-3, 0))
  EXPECT_EQ(rows.dense[0], 0.0f);  // missing
  EXPECT_EQ(rows.cat[0], 0xffffffffll);
  for (int c = 1; c < kNumCategorical; ++c) EXPECT_EQ(rows.cat[c], kMissingId);
  EXPECT_EQ(rows.labels[1], 1.0f);
  EXPECT_EQ(rows.dense[kNumDense + 3], static_cast<float>(std::log1p(3.0)));
  EXPECT_EQ(rows.cat[kNumCategorical + 25], 0x29);
  EXPECT_EQ(reader->lines(), 3u);
}

TEST(TsvReaderTest, ShardsTakeEveryNthLine) {
  std::string text;
  for (int i = 0; i < 7; ++i) text += Line(i % 2 ? "1" : "0");
  auto reader = FromText(text, TsvReaderOptions{1, 3});
  Rows rows(10);
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Read(rows.view));
  EXPECT_EQ(n, 2u);  // lines 1 and 4
  EXPECT_EQ(rows.labels[0], 1.0f);
  EXPECT_EQ(rows.labels[1], 0.0f);
  EXPECT_THAT(
      CriteoTsvReader::FromStream(std::make_unique<std::istringstream>(""), "x",
                                  TsvReaderOptions{3, 3}),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

// Every malformed line is kInvalidArgument naming the file, the line and
// the field; the reader stays failed.
TEST(TsvReaderTest, ErrorsNameFileLineAndField) {
  struct Case {
    std::string bad_line;
    std::string expected;
  };
  std::string bad_hex = Line();
  bad_hex.replace(bad_hex.rfind('\t') + 1, 8, "0000zz00");
  std::string bad_count = Line();
  bad_count.replace(bad_count.find('\t') + 1, 1, "1.5");
  std::string spaced = Line();
  spaced.replace(spaced.find('\t') + 1, 1, " 7");
  std::string long_hex = Line();
  long_hex.replace(long_hex.rfind('\t') + 1, 8, "00000000000000001");
  const std::vector<Case> cases = {
      {Line("2"), "day_0.tsv:2: field 1 (label): '2' is not a label"},
      {Line(""), "day_0.tsv:2: field 1 (label): ''"},
      {bad_count, "day_0.tsv:2: field 2 (I1): '1.5' is not an integer"},
      {spaced, "field 2 (I1): ' 7' is not an integer"},
      {bad_hex, "day_0.tsv:2: field 40 (C26): '0000zz00' is not a hex id"},
      {long_hex, "field 40 (C26)"},
      {"1\t2\t3\n", "day_0.tsv:2: 3 tab-separated fields, expected 40"},
      {Line().substr(0, Line().size() - 1) + "\textra\n",
       "day_0.tsv:2: 41 tab-separated fields, expected 40"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bad_line);
    auto reader = FromText(Line() + c.bad_line + Line());
    Rows rows(10);
    absl::StatusOr<size_t> n = reader->Read(rows.view);
    EXPECT_THAT(n, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(std::string(n.status().message()), HasSubstr(c.expected));
    EXPECT_THAT(reader->Read(rows.view),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
}

TEST(TsvReaderTest, OpensFiles) {
  EXPECT_THAT(CriteoTsvReader::Open("/nonexistent/day_0.tsv", {}),
              StatusIs(absl::StatusCode::kNotFound));
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/two_lines.tsv";
  {
    std::ofstream out(path);
    out << Line() << Line("0");
  }
  ASSERT_OK_AND_ASSIGN(auto reader, CriteoTsvReader::Open(path, {}));
  Rows rows(4);
  ASSERT_OK_AND_ASSIGN(size_t n, reader->Read(rows.view));
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(rows.labels[1], 0.0f);
}

}  // namespace
}  // namespace clicklog
}  // namespace downpour
