// The scheduler's table checks, one bad spec at a time: each gets
// kInvalidArgument (or kNotFound for an unknown handler) naming the table
// and the problem.
#include "scheduler/table_spec.h"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

proto::TableSpec Dense() {
  proto::TableSpec spec;
  spec.set_name("w");
  spec.set_kind(proto::DENSE);
  spec.set_width(4);
  spec.set_num_keys(100);
  spec.mutable_handler()->set_name("sgd");
  (*spec.mutable_handler()->mutable_params())["learning_rate"] = 0.1;
  return spec;
}

TEST(TableSpecTest, GoodSpecsPass) {
  EXPECT_OK(ValidateTableSpec(Dense(), {}));
  proto::TableSpec sparse = Dense();
  sparse.set_kind(proto::SPARSE);
  sparse.set_num_keys(0);
  EXPECT_OK(ValidateTableSpec(sparse, {}));
  proto::TableSpec vectors = Dense();
  for (const char* v : {"x", "g", "d"}) vectors.add_vectors(v);
  vectors.mutable_handler()->set_name("assign");
  vectors.mutable_handler()->clear_params();
  EXPECT_OK(ValidateTableSpec(vectors, {}));
  proto::TableSpec plugin = Dense();
  plugin.mutable_handler()->set_name("plugin:clipped_sgd");
  EXPECT_OK(ValidateTableSpec(plugin, {"plugin:clipped_sgd"}));
  proto::TableSpec widest = Dense();
  widest.set_width(kMaxTableWidth);
  EXPECT_OK(ValidateTableShape(widest));
}

TEST(TableSpecTest, BadShapesAreNamed) {
  struct Case {
    std::string why;
    proto::TableSpec spec;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& why, auto edit) {
    proto::TableSpec s = Dense();
    edit(s);
    cases.push_back({why, s});
  };
  add("empty name", [](proto::TableSpec& s) { s.clear_name(); });
  add("kind must be DENSE or SPARSE",
      [](proto::TableSpec& s) { s.set_kind(proto::TABLE_KIND_UNSPECIFIED); });
  add("width 0 not in [1, 2^20]", [](proto::TableSpec& s) { s.set_width(0); });
  add("width 1048577 not in [1, 2^20]",
      [](proto::TableSpec& s) { s.set_width(kMaxTableWidth + 1); });
  add("a dense table needs num_keys >= 1",
      [](proto::TableSpec& s) { s.set_num_keys(0); });
  add("a sparse table spans the whole key space",
      [](proto::TableSpec& s) { s.set_kind(proto::SPARSE); });
  add("named vectors need a dense table", [](proto::TableSpec& s) {
    s.set_kind(proto::SPARSE);
    s.set_num_keys(0);
    s.add_vectors("x");
  });
  add("65 named vectors, at most 64", [](proto::TableSpec& s) {
    for (int i = 0; i < kMaxTableVectors + 1; ++i) {
      s.add_vectors("v" + std::to_string(i));
    }
  });
  add("a named vector without a name",
      [](proto::TableSpec& s) { s.add_vectors(""); });
  add("vector 'x' named twice", [](proto::TableSpec& s) {
    s.add_vectors("x");
    s.add_vectors("x");
  });
  add("uniform initializer has high 0 < low 1", [](proto::TableSpec& s) {
    s.mutable_init()->set_kind(proto::InitializerSpec::UNIFORM);
    s.mutable_init()->set_low(1);
    s.mutable_init()->set_high(0);
  });
  add("normal initializer has stddev -1 < 0", [](proto::TableSpec& s) {
    s.mutable_init()->set_kind(proto::InitializerSpec::NORMAL);
    s.mutable_init()->set_stddev(-1);
  });
  // Found by table_spec_fuzzer: accepted by the scheduler, refused by every
  // server, so the table was declared but served nowhere.
  add("unknown initializer kind 12799", [](proto::TableSpec& s) {
    s.mutable_init()->set_kind(
        static_cast<proto::InitializerSpec::Kind>(12799));
  });
  add("value", [](proto::TableSpec& s) {
    s.mutable_init()->set_kind(proto::InitializerSpec::CONSTANT);
    s.mutable_init()->set_value(std::numeric_limits<float>::quiet_NaN());
  });
  add("beyond the float range", [](proto::TableSpec& s) {
    s.mutable_init()->set_kind(proto::InitializerSpec::NORMAL);
    s.mutable_init()->set_mean(3e38f);
    s.mutable_init()->set_stddev(1e38f);
  });
  for (const Case& c : cases) {
    const absl::Status s = ValidateTableShape(c.spec);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << c.why;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("table '" + c.spec.name() + "'"))
        << c.why;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.why));
    // The full check fails the same way.
    EXPECT_EQ(ValidateTableSpec(c.spec, {}), s) << c.why;
  }
}

TEST(TableSpecTest, HandlersAreCheckedAgainstThePlugins) {
  proto::TableSpec spec = Dense();
  spec.mutable_handler()->set_name("no_such_rule");
  absl::Status s = ValidateTableSpec(spec, {});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("table 'w'"));
  // The shape alone does not look at the handler.
  EXPECT_OK(ValidateTableShape(spec));

  spec.mutable_handler()->set_name("plugin:clipped_sgd");
  EXPECT_THAT(ValidateTableSpec(spec, {}),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(ValidateTableSpec(spec, {"plugin:other"}),
              StatusIs(absl::StatusCode::kNotFound));

  spec = Dense();
  (*spec.mutable_handler()->mutable_params())["learnin_rate"] = 0.1;
  s = ValidateTableSpec(spec, {});
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), HasSubstr("learnin_rate"));
}

proto::TableSpec Sparse() {
  proto::TableSpec spec;
  spec.set_name("emb");
  spec.set_kind(proto::SPARSE);
  spec.set_width(16);
  spec.mutable_handler()->set_name("adagrad");
  return spec;
}

TEST(TableSpecTest, BoundsAreCheckedFieldByField) {
  proto::TableSpec ok = Sparse();
  ok.mutable_bounds()->set_max_rows(1000);
  ok.mutable_bounds()->set_eviction(proto::SparseBounds::LRU);
  ok.mutable_bounds()->set_admit_after(3);
  ok.mutable_bounds()->set_ttl_clocks(100);
  EXPECT_OK(ValidateTableShape(ok));
  // Admission or a TTL alone bound a table too.
  proto::TableSpec admit_only = Sparse();
  admit_only.mutable_bounds()->set_admit_after(2);
  EXPECT_OK(ValidateTableShape(admit_only));

  struct Case {
    std::function<void(proto::TableSpec*)> change;
    const char* why;
  };
  const Case cases[] = {
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_max_rows(0); },
       "a cap of 0 rows"},
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_max_rows(-1); },
       "bounds.max_rows: -1 is negative"},
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_max_bytes(1 << 20); },
       "not both"},
      {[](proto::TableSpec* s) {
         s->mutable_bounds()->set_max_rows(int64_t{1} << 41);
       },
       "beyond"},
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_ttl_seconds(-5); },
       "bounds.ttl_seconds"},
      {[](proto::TableSpec* s) {
         s->mutable_bounds()->set_ttl_clocks(1);
         s->mutable_bounds()->set_ttl_seconds(1);
       },
       "one TTL"},
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_admit_after(0); },
       "bounds.admit_after: 0 not in [1"},
      {[](proto::TableSpec* s) {
         s->mutable_bounds()->set_admit_after(kMaxAdmitAfter + 1);
       },
       "bounds.admit_after"},
      {[](proto::TableSpec* s) {
         s->mutable_bounds()->set_eviction(
             static_cast<proto::SparseBounds::Eviction>(9));
       },
       "unknown policy 9"},
      {[](proto::TableSpec* s) { s->mutable_bounds()->set_cold_tier(true); },
       ""},  // fine with a cap
      {[](proto::TableSpec* s) {
         s->set_kind(proto::DENSE);
         s->set_num_keys(10);
       },
       "for sparse tables"},
  };
  for (const Case& c : cases) {
    proto::TableSpec spec = Sparse();
    spec.mutable_bounds()->set_max_rows(100);
    spec.mutable_bounds()->set_admit_after(1);
    c.change(&spec);
    absl::Status s = ValidateTableShape(spec);
    if (std::string(c.why).empty()) {
      EXPECT_OK(s);
      continue;
    }
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << c.why;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.why));
    EXPECT_THAT(std::string(s.message()), HasSubstr("table 'emb'"));
  }
  // Eviction or a cold tier without a cap has nothing to make room under.
  proto::TableSpec no_cap = Sparse();
  no_cap.mutable_bounds()->set_ttl_clocks(5);
  no_cap.mutable_bounds()->set_admit_after(1);
  no_cap.mutable_bounds()->set_eviction(proto::SparseBounds::LFU);
  EXPECT_THAT(ValidateTableShape(no_cap),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TableSpecTest, ATablesOwnPolicyNeedsTheJobAndABound) {
  proto::TableSpec spec = Sparse();
  spec.set_follows_job(true);
  spec.set_consistency(proto::SSP);
  spec.set_staleness(2);
  EXPECT_OK(ValidateTableShape(spec));
  spec.set_staleness(-1);
  EXPECT_THAT(ValidateTableShape(spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
  spec.set_staleness(0);
  spec.set_consistency(proto::ASP);
  EXPECT_OK(ValidateTableShape(spec));
  spec.set_staleness(3);  // a bound for a policy without one
  EXPECT_THAT(ValidateTableShape(spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
  spec.set_staleness(0);
  spec.set_follows_job(false);
  absl::Status s = ValidateTableShape(spec);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), HasSubstr("follows_job"));
  spec.set_follows_job(true);
  spec.set_consistency(static_cast<proto::Consistency>(42));
  EXPECT_THAT(ValidateTableShape(spec),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace downpour
