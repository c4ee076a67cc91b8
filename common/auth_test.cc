#include "common/auth.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "common/test_util.h"
#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(ClusterAuthTest, OffByDefault) {
  ClusterAuth auth;
  EXPECT_FALSE(auth.enabled());
  EXPECT_TRUE(auth.curve_secret_key().empty());
}

TEST(ClusterAuthTest, NewSecretGivesAKeyPair) {
  ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromSecret(secret));
  EXPECT_TRUE(auth.enabled());
  EXPECT_EQ(auth.curve_secret_key(), secret);
  EXPECT_EQ(auth.curve_public_key().size(), 40u);
  EXPECT_NE(auth.curve_public_key(), secret);
  // Deterministic: every node derives the same public key.
  ASSERT_OK_AND_ASSIGN(ClusterAuth again, ClusterAuth::FromSecret(secret));
  EXPECT_EQ(again.curve_public_key(), auth.curve_public_key());
  // Two secrets, two public keys.
  ASSERT_OK_AND_ASSIGN(std::string other, ClusterAuth::NewSecret());
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth2, ClusterAuth::FromSecret(other));
  EXPECT_NE(auth2.curve_public_key(), auth.curve_public_key());
}

TEST(ClusterAuthTest, RejectsMalformedSecrets) {
  EXPECT_THAT(ClusterAuth::FromSecret("short"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // 40 characters, but '"' and ' ' are not in the Z85 alphabet.
  EXPECT_THAT(ClusterAuth::FromSecret(std::string(39, 'a') + "\""),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ClusterAuthTest, ReadsFilesAndNamesThemInErrors) {
  const std::string dir = ::testing::TempDir();
  EXPECT_THAT(ClusterAuth::FromFile(dir + "/no-such-secret"),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(std::string secret, ClusterAuth::NewSecret());
  const std::string good = dir + "/good.secret";
  std::ofstream(good) << "  " << secret << "\n";
  ASSERT_OK_AND_ASSIGN(ClusterAuth auth, ClusterAuth::FromFile(good));
  EXPECT_EQ(auth.curve_secret_key(), secret);
  const std::string bad = dir + "/bad.secret";
  std::ofstream(bad) << "not a key\n";
  auto status = ClusterAuth::FromFile(bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("bad.secret"), std::string::npos)
      << status;
}

}  // namespace
}  // namespace downpour
