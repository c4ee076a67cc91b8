#include "common/grpc_status.h"

#include <gtest/gtest.h>

#include "common/error_reason.h"
#include "common/status_macros.h"

namespace downpour {
namespace {

TEST(GrpcStatusTest, RoundTripKeepsCodeAndMessage) {
  absl::Status s = absl::OutOfRangeError("key 7 outside [0, 5)");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  absl::Status back = FromGrpcStatus(g, "pull from server 2");
  EXPECT_EQ(back.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(back.message(), "pull from server 2: key 7 outside [0, 5)");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, TheTypedReasonCrossesGrpc) {
  absl::Status s = WithReason(absl::FailedPreconditionError("restore 3 runs"),
                              ErrorReason::kRestoreUnderWay);
  absl::Status back = FromGrpcStatus(ToGrpcStatus(s), "restore 4");
  EXPECT_EQ(back.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(back), ErrorReason::kRestoreUnderWay);
  // No reason, no details; details from elsewhere are not a reason.
  EXPECT_EQ(ReasonOf(FromGrpcStatus(ToGrpcStatus(absl::AbortedError("x")))),
            ErrorReason::kUnspecified);
  grpc::Status foreign(grpc::StatusCode::UNAVAILABLE, "x", "\x08\x0e");
  EXPECT_EQ(ReasonOf(FromGrpcStatus(foreign)), ErrorReason::kUnspecified);
  grpc::Status newer(grpc::StatusCode::UNAVAILABLE, "x", "downpour-reason:999");
  EXPECT_EQ(ReasonOf(FromGrpcStatus(newer)), ErrorReason::kUnspecified);
}

TEST(ErrorReasonTest, AnnotationKeepsTheReason) {
  absl::Status s = WithReason(absl::UnavailableError("server 2 is behind"),
                              ErrorReason::kServerBehind);
  absl::Status a = Annotate(s, "pull table 'w'");
  EXPECT_EQ(a.message(), "pull table 'w': server 2 is behind");
  EXPECT_EQ(ReasonOf(a), ErrorReason::kServerBehind);
  EXPECT_EQ(ReasonOf(absl::UnavailableError("no reason")),
            ErrorReason::kUnspecified);
  EXPECT_TRUE(WithReason(absl::OkStatus(), ErrorReason::kNotOwner).ok());
}

}  // namespace
}  // namespace downpour
