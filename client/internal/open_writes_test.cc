#include "client/internal/open_writes.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(OpenWritesTest, LowMarkIsTheSmallestNumberStillHeld) {
  OpenWrites w;
  EXPECT_EQ(w.Low(), 1u);
  const uint64_t a = w.Open(), b = w.Open();
  EXPECT_EQ(w.Low(), a);
  w.Close(b);
  EXPECT_EQ(w.Low(), a);
  w.Close(a);
  EXPECT_EQ(w.Low(), b + 1);
  w.Close(0);  // a read's part: nothing to close
  EXPECT_EQ(w.Low(), b + 1);
}

// A retried part cut into two on a newer map: both pieces carry its number,
// and the number stays open until both are answered.
TEST(OpenWritesTest, ANumberInSeveralPartsStaysOpenUntilTheLastIsAnswered) {
  OpenWrites w;
  const uint64_t seq = w.Open();  // the first send
  const uint64_t later = w.Open();
  w.Retain(seq);  // the retry's lower piece
  w.Retain(seq);  // its upper piece
  w.Close(seq);   // the retried part itself, once routed again
  w.Close(seq);   // the lower piece is answered
  EXPECT_EQ(w.Low(), seq) << "the upper piece may still be retried";
  w.Close(later);
  EXPECT_EQ(w.Low(), seq);
  w.Close(seq);
  EXPECT_EQ(w.Low(), later + 1);
}

TEST(OpenWritesTest, ClosingANumberNotHeldChangesNothing) {
  OpenWrites w;
  const uint64_t seq = w.Open();
  w.Close(seq + 5);
  EXPECT_EQ(w.Low(), seq);
}

}  // namespace
}  // namespace downpour
