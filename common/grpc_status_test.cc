#include "common/grpc_status.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace downpour
