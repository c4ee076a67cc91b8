#include "server/internal/range_split.h"

#include <vector>

#include "common/test_util.h"

namespace downpour {
namespace server_internal {
namespace {

proto::RangeLedgers::Writer* Writer(proto::RangeLedgers* l, uint64_t client,
                                    uint64_t low, std::vector<uint64_t> seqs) {
  proto::RangeLedgers::Writer* w = l->add_writers();
  w->set_client_id(client);
  w->set_low_seq(low);
  for (uint64_t s : seqs) w->add_seqs(s);
  return w;
}

// A merged range answers a retry as applied wherever either neighbour
// applied it, and forgets what the client no longer retries.
TEST(JoinLedgersTest, AWriteEitherNeighbourAppliedCountsAsApplied) {
  proto::RangeLedgers lo, hi;
  Writer(&lo, 7, 3, {3, 5});
  proto::RangeLedgers::Writer* v = Writer(&hi, 7, 4, {4, 6});
  v->add_scalar_seqs(6);
  v->add_scalar_counts(2);
  v->add_scalars(1.5);
  v->add_scalars(-2);
  Writer(&hi, 9, 1, {1});
  proto::RangeLedgers::Step* s = lo.add_steps();
  s->set_begin(0);
  s->set_end(10);
  s->set_next_clock(4);
  proto::RangeLedgers::Round* r = lo.add_rounds();
  r->set_vector(1);
  r->set_open(2);
  r->add_tasks(5);
  r->add_tasks(0);
  proto::RangeLedgers::Round* newer = hi.add_rounds();
  newer->set_vector(1);
  newer->set_open(3);
  newer->add_tasks(8);
  newer->add_tasks(10);

  const proto::RangeLedgers joined = JoinLedgers({lo, hi});
  ASSERT_EQ(joined.writers_size(), 2);
  const proto::RangeLedgers::Writer& w = joined.writers(0);
  EXPECT_EQ(w.client_id(), 7u);
  // The higher low mark: seq 3 is never retried again.
  EXPECT_EQ(w.low_seq(), 4u);
  EXPECT_EQ(std::vector<uint64_t>(w.seqs().begin(), w.seqs().end()),
            (std::vector<uint64_t>{4, 5, 6}));
  ASSERT_EQ(w.scalar_seqs_size(), 1);
  EXPECT_EQ(w.scalar_seqs(0), 6u);
  ASSERT_EQ(w.scalars_size(), 2);
  EXPECT_EQ(w.scalars(1), -2);
  EXPECT_EQ(joined.writers(1).client_id(), 9u);
  // Step parts kept; the newest open round of the vector, with its tasks.
  ASSERT_EQ(joined.steps_size(), 1);
  EXPECT_EQ(joined.steps(0).next_clock(), 4);
  ASSERT_EQ(joined.rounds_size(), 1);
  EXPECT_EQ(joined.rounds(0).open(), 3);
  EXPECT_EQ(std::vector<uint64_t>(joined.rounds(0).tasks().begin(),
                                  joined.rounds(0).tasks().end()),
            (std::vector<uint64_t>{8, 10}));
}

}  // namespace
}  // namespace server_internal
}  // namespace downpour
