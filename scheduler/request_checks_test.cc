#include "scheduler/request_checks.h"

#include <cmath>
#include <string>

#include "common/test_util.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

proto::RegisterRequest Server(const std::string& name) {
  proto::RegisterRequest r;
  r.set_role(proto::SERVER);
  r.set_name(name);
  r.set_data_endpoint("tcp://10.0.0.7:40123");
  r.set_admin_address("10.0.0.7:40124");
  r.add_plugin_handlers("plugin:clipped_sgd");
  r.set_max_message_bytes(uint64_t{256} << 20);
  return r;
}

TEST(CheckNameTest, LengthAndCharacters) {
  EXPECT_OK(CheckName("table name", "mlp/w0", 128));
  EXPECT_OK(CheckName("table name", "emb.layer-1:weight@v2+x=y_z", 128));
  EXPECT_OK(CheckName("node name", "", 253, /*may_be_empty=*/true));
  EXPECT_THAT(CheckName("table name", "", 128),
              StatusIs(absl::StatusCode::kInvalidArgument));
  const std::string huge(1 << 20, 'a');
  absl::Status s = CheckName("node name", huge, 253);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s), HasSubstr("node name of 1048576 bytes, at most 253"));
  EXPECT_LT(s.message().size(), 200u) << "the message echoes the name";
  EXPECT_OK(CheckName("node name", std::string(253, 'a'), 253));
  EXPECT_THAT(CheckName("node name", std::string(254, 'a'), 253),
              StatusIs(absl::StatusCode::kInvalidArgument));
  for (const std::string& bad :
       {std::string("a b"), std::string("tab\tle"), std::string("nul\0x", 5),
        std::string("new\nline"), std::string("quote'"), std::string("\xff")}) {
    absl::Status st = CheckName("table name", bad, 128);
    EXPECT_THAT(st, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(Message(st), HasSubstr("has character 0x"));
    for (char c : Message(st)) {
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "unprintable byte in: " << st;
    }
  }
  EXPECT_THAT(Message(CheckName("table name", "a b", 128)),
              HasSubstr("character 0x20 at byte 1"));
}

TEST(CheckRegisterRequestTest, RolesNamesEndpointsPlugins) {
  EXPECT_OK(CheckRegisterRequest(Server("server-0")));
  proto::RegisterRequest r = Server("server-0");
  r.set_role(proto::ROLE_UNSPECIFIED);
  EXPECT_THAT(CheckRegisterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument));
  r.set_role(static_cast<proto::NodeRole>(77));
  absl::Status s = CheckRegisterRequest(r);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s), HasSubstr("unknown role 77"));

  r = Server(std::string(1 << 20, 'n'));
  EXPECT_THAT(CheckRegisterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument));
  r = Server("ok");
  r.clear_data_endpoint();
  EXPECT_THAT(Message(CheckRegisterRequest(r)),
              HasSubstr("a server needs a data endpoint"));
  r = Server("ok");
  r.set_data_endpoint(std::string(300, 'x'));
  EXPECT_THAT(CheckRegisterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument));
  r = Server("ok");
  r.set_data_endpoint("tcp://[::1]:5555");
  EXPECT_OK(CheckRegisterRequest(r));
  r.set_admin_address("host name:1");
  EXPECT_THAT(Message(CheckRegisterRequest(r)), HasSubstr("admin address"));

  r = Server("ok");
  r.add_plugin_handlers("clipped");  // not plugin:<name>
  EXPECT_THAT(CheckRegisterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument));
  r = Server("ok");
  for (int i = 0; i < kMaxPluginsPerNode; ++i) {
    r.add_plugin_handlers("plugin:p" + std::to_string(i));
  }
  EXPECT_THAT(Message(CheckRegisterRequest(r)),
              HasSubstr("plugin handlers, at most"));
  r = Server("ok");
  r.set_max_message_bytes(1);
  EXPECT_THAT(CheckRegisterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument));

  // Workers and clients need no endpoint; a nameless client is fine.
  proto::RegisterRequest c;
  c.set_role(proto::CLIENT);
  EXPECT_OK(CheckRegisterRequest(c));
  c.set_role(proto::WORKER);
  c.set_name("job-3-abcde");
  EXPECT_OK(CheckRegisterRequest(c));
  c.set_job_token(std::string(10000, 't'));
  EXPECT_THAT(CheckRegisterRequest(c),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckTableStringsTest, EveryStringOfASpec) {
  proto::TableSpec spec;
  spec.set_name("emb");
  spec.add_vectors("x");
  spec.add_vectors("g");
  spec.mutable_handler()->set_name("plugin:clipped_sgd");
  (*spec.mutable_handler()->mutable_params())["clip"] = 0.5;
  EXPECT_OK(CheckTableStrings(spec));

  proto::TableSpec bad = spec;
  bad.set_name(std::string(1 << 20, 't'));
  EXPECT_THAT(CheckTableStrings(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = spec;
  bad.add_vectors(std::string(129, 'v'));
  absl::Status s = CheckTableStrings(bad);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Message(s), HasSubstr("table 'emb': vector name of 129 bytes"));
  bad = spec;
  bad.mutable_handler()->set_name("plugin:\x01");
  EXPECT_THAT(Message(CheckTableStrings(bad)), HasSubstr("handler name"));
  bad = spec;
  (*bad.mutable_handler()->mutable_params())[std::string(65, 'p')] = 1;
  EXPECT_THAT(Message(CheckTableStrings(bad)),
              HasSubstr("handler parameter name of 65 bytes"));
  bad = spec;
  for (int i = 0; i < kMaxHandlerParams; ++i) {
    (*bad.mutable_handler()->mutable_params())["p" + std::to_string(i)] = 1;
  }
  EXPECT_THAT(Message(CheckTableStrings(bad)),
              HasSubstr("handler parameters, at most 32"));
  // An empty handler name means sgd.
  proto::TableSpec plain;
  plain.set_name("w");
  EXPECT_OK(CheckTableStrings(plain));
}

TEST(CheckLbfgsStateTest, RefusesWhatADriverCouldNotResumeFrom) {
  proto::LbfgsState none;
  EXPECT_OK(CheckLbfgsState(none));  // a checkpoint without a coordinator
  proto::LbfgsState s;
  s.set_table("lbfgs");
  s.set_history(3);
  s.set_iteration(4);
  s.set_round(9);
  s.set_f(0.5);
  auto* p = s.add_pairs();
  p->set_slot(2);
  p->set_rho(10);
  s.add_pairs()->set_slot(0);
  EXPECT_OK(CheckLbfgsState(s));

  proto::LbfgsState bad = s;
  bad.set_history(30);
  EXPECT_THAT(Message(CheckLbfgsState(bad)), HasSubstr("history 30"));
  bad = s;
  bad.add_pairs()->set_slot(2);  // repeated
  EXPECT_THAT(Message(CheckLbfgsState(bad)), HasSubstr("slot 2"));
  bad = s;
  bad.mutable_pairs(0)->set_slot(3);  // beyond the history
  EXPECT_THAT(CheckLbfgsState(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = s;
  bad.add_pairs()->set_slot(1);
  bad.add_pairs()->set_slot(1);  // more pairs than the history
  EXPECT_THAT(Message(CheckLbfgsState(bad)), HasSubstr("4 pairs"));
  bad = s;
  bad.set_gg(std::nan(""));
  EXPECT_THAT(Message(CheckLbfgsState(bad)), HasSubstr("not finite"));
  bad = s;
  bad.set_round(-1);
  EXPECT_THAT(CheckLbfgsState(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
  bad = s;
  bad.set_table(std::string(1 << 20, 't'));
  EXPECT_THAT(CheckLbfgsState(bad),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckBarrierAndWaitTest, Bounds) {
  proto::BarrierRequest b;
  b.set_name("init-params");
  b.set_count(4);
  EXPECT_OK(CheckBarrierRequest(b, 1024));
  b.set_count(0);
  EXPECT_THAT(CheckBarrierRequest(b, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument));
  b.set_count(5000);
  EXPECT_THAT(CheckBarrierRequest(b, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument));
  b.set_count(2);
  b.set_name(std::string(1 << 20, 'b'));
  EXPECT_THAT(CheckBarrierRequest(b, 1024),
              StatusIs(absl::StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(absl::Duration d,
                       CheckWait("wait clock", 0, absl::Seconds(60)));
  EXPECT_EQ(d, absl::Seconds(60));
  ASSERT_OK_AND_ASSIGN(d, CheckWait("wait clock", -5, absl::Seconds(60)));
  EXPECT_EQ(d, absl::Seconds(60));
  ASSERT_OK_AND_ASSIGN(d, CheckWait("wait clock", 1500, absl::Seconds(60)));
  EXPECT_EQ(d, absl::Milliseconds(1500));
  EXPECT_THAT(CheckWait("wait clock", int64_t{1} << 50, absl::Seconds(60)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckTableFailuresTest, CodesAndCount) {
  proto::AckEpochRequest req;
  proto::TableFailure* f = req.add_failed_tables();
  f->set_table_id(3);
  f->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(CheckTableFailures(req));
  f->set_code(0);  // OK is not a failure
  EXPECT_THAT(CheckTableFailures(req),
              StatusIs(absl::StatusCode::kInvalidArgument));
  f->set_code(99);
  EXPECT_THAT(CheckTableFailures(req),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TokensMatchTest, ExactBytesOnly) {
  EXPECT_TRUE(TokensMatch("s3cret", "s3cret"));
  EXPECT_FALSE(TokensMatch("s3cres", "s3cret"));
  EXPECT_FALSE(TokensMatch("s3cre", "s3cret"));
  EXPECT_FALSE(TokensMatch("", "s3cret"));
  EXPECT_TRUE(TokensMatch("", ""));
}

TEST(PrintableTest, EscapesAndCuts) {
  EXPECT_EQ(Printable("abc"), "abc");
  EXPECT_EQ(Printable(std::string("a\0b\n\\", 5)), "a\\x00b\\x0a\\x5c");
  EXPECT_EQ(Printable(std::string(300, 'x'), 4), "xxxx...");
}

TEST(CheckMapGrowthTest, CapsTheMap) {
  EXPECT_OK(CheckMapGrowth("register", 1000, 24, 1024));
  absl::Status s = CheckMapGrowth("register node 'n'", 1000, 25, 1024);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(Message(s), HasSubstr("from 1000 to 1025 bytes, above its cap"));
}

}  // namespace
}  // namespace downpour
