// Fuzzes a server's data plane past the network: requests go through the
// transport's framing (DecodeRequest, as the receive thread does) into a
// server_internal::Dispatcher (Handle), interleaved with cluster maps
// (ApplyMap), as any peer could send them.
//
// The dispatcher starts from a map of six small tables of every kind this
// node (id 2) serves part of: dense, sparse, dense with named vectors, a
// BSP dense and a BSP sparse table, and a plugin-handled table. The input is
// then a sequence of steps (at most 64), each one of
//   - a new map: the epoch moves, ranges change owner, tables come and go;
//   - raw frames (any bytes), as in transport/request_decoder_fuzzer.cc;
//   - a structured request: a DataHeader with fields drawn near the edges
//     of what the tables allow (keys in and out of range, widths right and
//     wrong, ranges, clocks, rounds, vector commands), its keys and values.
// Checks, besides "no crash, no undefined behaviour": every reply that is
// neither an error nor deferred carries exactly rows x width floats when the
// operation reads, and none when it only writes; errors carry a canonical
// code.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/buffer_pool.h"
#include "common/logging.h"
#include "common/types.h"
#include "handlers/plugin_registry.h"
#include "proto/downpour.pb.h"
#include "server/internal/dispatcher.h"
#include "testing/fuzz/fuzz_input.h"
#include "transport/internal/request_decoder.h"

namespace downpour {
namespace {

using server_internal::Dispatcher;
using transport_internal::Frame;

constexpr NodeId kSelf = 2;
constexpr NodeId kOther = 1;
constexpr size_t kMaxMessageBytes = size_t{1} << 20;
// As ps_server always runs with one (by default 80% of the memory it finds):
// without a limit a fuzzed map may ask for a range of 2^59 bytes, which a
// plain build refuses through bad_alloc but ASan aborts on.
constexpr uint64_t kMaxTableBytes = uint64_t{256} << 20;
constexpr int kMaxSteps = 64;

[[noreturn]] void Fail(const std::string& what, const proto::DataHeader& h) {
  std::fprintf(stderr, "dispatcher_fuzzer: %s\nrequest: %s\n", what.c_str(),
               h.ShortDebugString().c_str());
  std::abort();
}

// The clipped_sgd plugin, built next to this binary, loaded once.
const PluginRegistry* Plugins() {
  static PluginRegistry* registry = [] {
    // Every input declares the tables anew: their INFO lines would bury the
    // fuzzer's own output.
    SetMinLogSeverity(LogSeverity::kWarning);
    auto* r = new PluginRegistry;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    std::string dir = n > 0 ? std::string(exe, n) : ".";
    dir = dir.substr(0, dir.rfind('/'));
    const absl::Status s = r->Load(dir + "/../handlers/libclipped_sgd.so");
    if (!s.ok()) {
      std::fprintf(stderr, "dispatcher_fuzzer: %s\n", s.ToString().c_str());
      std::abort();
    }
    return r;
  }();
  return registry;
}

struct TableDef {
  TableId id;
  uint32_t width;
  bool sparse;
  uint64_t num_keys;
};
constexpr TableDef kTables[] = {
    {1, 2, false, 100}, {2, 3, true, 0}, {3, 1, false, 64},
    {4, 2, false, 16},  {5, 1, true, 0}, {6, 4, false, 8},
};

void AddRange(proto::TableMap* t, Key begin, Key end, NodeId owner) {
  proto::RangeAssignment* r = t->add_ranges();
  r->set_begin(begin);
  r->set_end(end);
  r->set_primary(owner);
}

proto::TableMap* AddTable(proto::ClusterMap* map, const TableDef& def,
                          const std::string& name, const std::string& handler) {
  proto::TableMap* t = map->add_tables();
  proto::TableSpec* s = t->mutable_spec();
  s->set_id(def.id);
  s->set_name(name);
  s->set_kind(def.sparse ? proto::SPARSE : proto::DENSE);
  s->set_width(def.width);
  s->set_num_keys(def.num_keys);
  s->mutable_handler()->set_name(handler);
  return t;
}

proto::ClusterMap BaseMap() {
  proto::ClusterMap map;
  map.set_epoch(5);
  proto::TableMap* t = AddTable(&map, kTables[0], "dense", "sum");
  AddRange(t, 0, 50, kOther);
  AddRange(t, 50, 100, kSelf);
  t = AddTable(&map, kTables[1], "sparse", "sgd");
  (*t->mutable_spec()->mutable_handler()->mutable_params())["learning_rate"] =
      0.5;
  t->mutable_spec()->mutable_init()->set_kind(proto::InitializerSpec::NORMAL);
  t->mutable_spec()->mutable_init()->set_stddev(0.1f);
  AddRange(t, 0, kKeySpaceEnd, kSelf);
  t = AddTable(&map, kTables[2], "vectors", "assign");
  for (const char* v : {"x", "g", "d"}) t->mutable_spec()->add_vectors(v);
  AddRange(t, 0, 32, kSelf);
  AddRange(t, 32, 64, kOther);
  t = AddTable(&map, kTables[3], "bsp", "adagrad");
  t->mutable_spec()->set_sync_workers(2);
  t->mutable_spec()->set_num_workers(3);
  AddRange(t, 0, 16, kSelf);
  t = AddTable(&map, kTables[4], "bsp_sparse", "adam");
  t->mutable_spec()->set_sync_workers(2);
  t->mutable_spec()->set_num_workers(2);
  AddRange(t, 0, Key{1} << 63, kSelf);
  AddRange(t, Key{1} << 63, kKeySpaceEnd, kOther);
  t = AddTable(&map, kTables[5], "plugin", "plugin:clipped_sgd");
  AddRange(t, 0, 8, kSelf);
  return map;
}

// A key near the edges of the tables' key spaces.
Key PickKey(FuzzInput& in) {
  switch (in.IntInRange(0, 3)) {
    case 0:
      return in.IntInRange(0, 110);
    case 1:
      return in.Pick<Key>({kKeySpaceEnd - 1, kKeySpaceEnd, Key{1} << 63,
                           (Key{1} << 63) - 1, ~Key{0}});
    case 2:
      return in.Raw<Key>();
    default:
      return in.IntInRange(0, 16);
  }
}

// The next map: a later (or, rarely, the same or an earlier) epoch, ranges
// that move between this node and another, split or merged, a table
// dropped or re-declared.
proto::ClusterMap NextMap(const proto::ClusterMap& current, FuzzInput& in) {
  proto::ClusterMap map = current;
  map.set_epoch(in.Pick<Epoch>({current.epoch() + 1, current.epoch() + 1,
                                current.epoch() + 2, current.epoch(),
                                current.epoch() - 1}));
  const int edits = static_cast<int>(in.IntInRange(0, 3));
  for (int i = 0; i < edits && map.tables_size() > 0; ++i) {
    const int index = static_cast<int>(in.IntInRange(0, map.tables_size() - 1));
    proto::TableMap* t = map.mutable_tables(index);
    switch (in.IntInRange(0, 5)) {
      case 5:  // merge the first two ranges (fenced first, or not)
        if (t->ranges_size() >= 2) {
          auto* r = t->mutable_ranges(0);
          if (in.Bool()) {
            r->set_merge(proto::RangeAssignment::MERGE_WITH_NEXT);
            t->mutable_ranges(1)->set_merge(
                proto::RangeAssignment::MERGE_WITH_PREVIOUS);
            break;
          }
          r->set_end(t->ranges(1).end());
          r->clear_merge();
          t->mutable_ranges()->DeleteSubrange(1, 1);
        }
        break;
      case 0:  // flip an owner
        if (t->ranges_size() > 0) {
          auto* r = t->mutable_ranges(
              static_cast<int>(in.IntInRange(0, t->ranges_size() - 1)));
          r->set_primary(r->primary() == kSelf ? kOther : kSelf);
        }
        break;
      case 1: {  // split a range
        if (t->ranges_size() == 0) break;
        auto* r = t->mutable_ranges(0);
        const Key mid = r->begin() + (r->end() - r->begin()) / 2;
        const Key end = r->end();
        r->set_end(mid);
        AddRange(t, mid, end, in.Bool() ? kSelf : kOther);
        break;
      }
      case 2:  // a range past the table's keys, or an inverted one
        AddRange(t, PickKey(in), PickKey(in), kSelf);
        break;
      case 3:  // drop the table
        map.mutable_tables()->DeleteSubrange(index, 1);
        break;
      default:  // change its shape under the same id
        t->mutable_spec()->set_width(
            static_cast<uint32_t>(in.IntInRange(0, 5)));
        break;
    }
  }
  // Keep dense tables small: a dense range is allocated in full, and a huge
  // table is the control plane's to refuse (issue 11), not this fuzzer's.
  for (const auto& t : map.tables()) {
    if (t.spec().kind() != proto::DENSE) continue;
    for (const auto& r : t.ranges()) {
      if (r.end() > r.begin() && r.end() - r.begin() > 4096) return current;
    }
  }
  return map;
}

struct Request {
  proto::DataHeader header;
  std::vector<Key> keys;
  std::vector<float> values;
};

Request MakeRequest(FuzzInput& in, Epoch epoch, uint64_t id) {
  Request r;
  proto::DataHeader& h = r.header;
  h.set_request_id(id);
  h.set_op(static_cast<proto::Op>(in.IntInRange(0, 8)));
  const size_t t = in.IntInRange(0, std::size(kTables));
  const TableDef def = t < std::size(kTables)
                           ? kTables[t]
                           : TableDef{in.Raw<TableId>(), 1, false, 1};
  h.set_table_id(def.id);
  h.set_epoch(in.Pick<Epoch>({epoch, epoch, epoch + 1, epoch - 1, 0}));
  h.set_width(in.Bool() ? def.width
                        : static_cast<uint32_t>(in.IntInRange(0, 5)));
  h.set_vector_id(in.Bool() ? 0 : static_cast<uint32_t>(in.IntInRange(0, 4)));
  if (in.Bool()) {
    h.set_worker_clock(in.Pick<int64_t>({-1, 0, 1, 2, 3}));
    h.set_worker_rank(static_cast<int32_t>(in.IntInRange(0, 4)) - 1);
  } else {
    h.set_worker_clock(-1);
  }
  h.set_sender(in.IntInRange(0, 3));
  size_t rows = 0;
  if (in.Bool()) {
    h.set_is_range(true);
    const Key begin = PickKey(in);
    const Key end = in.Bool() ? begin + in.IntInRange(0, 70) : PickKey(in);
    h.set_range_begin(begin);
    h.set_range_end(end);
    rows = end > begin ? end - begin : 0;
  } else {
    rows = in.IntInRange(0, 8);
    for (size_t i = 0; i < rows; ++i) r.keys.push_back(PickKey(in));
  }
  h.set_num_keys(in.Bool() ? rows : in.IntInRange(0, 100));
  if (h.op() == proto::VECTOR) {
    proto::VectorCommand* c = h.mutable_vector_command();
    c->set_update(
        static_cast<proto::VectorCommand::Update>(in.IntInRange(0, 6)));
    c->set_dst(static_cast<uint32_t>(in.IntInRange(0, 4)));
    c->set_a(static_cast<uint32_t>(in.IntInRange(0, 4)));
    c->set_b(static_cast<uint32_t>(in.IntInRange(0, 4)));
    c->set_alpha(in.Double());
    c->set_beta(in.Double());
    const int dots = static_cast<int>(in.IntInRange(0, 3));
    for (int i = 0; i < dots; ++i) {
      c->add_dot_x(static_cast<uint32_t>(in.IntInRange(0, 4)));
      c->add_dot_y(static_cast<uint32_t>(in.IntInRange(0, 4)));
    }
    if (in.Bool()) c->add_dot_x(0);  // unpaired
    c->set_begin(PickKey(in));
    c->set_end(in.Bool() ? c->begin() + in.IntInRange(0, 70) : PickKey(in));
    c->set_open_round(in.Pick<int64_t>({0, 1, 2, -1}));
  }
  if (in.Bool()) {
    h.set_round(in.Pick<int64_t>({0, 1, 2, -1}));
    h.set_task_id(in.IntInRange(0, 3));
  }
  const size_t width = h.width();
  const size_t count = in.Bool() && rows <= 4096 && width <= 8
                           ? rows * width
                           : in.IntInRange(0, 64);
  for (size_t i = 0; i < count; ++i) {
    r.values.push_back(in.Bool() ? in.Raw<float>()
                                 : static_cast<float>(in.IntInRange(0, 8)) - 4);
  }
  return r;
}

bool Reads(proto::Op op) {
  return op == proto::GET || op == proto::PULL || op == proto::PUSH_PULL;
}

// Sends `frames` through the framing and, if well framed, the dispatcher.
void Deliver(Dispatcher& dispatcher, BufferPool& pool,
             const std::vector<Frame>& frames) {
  Buffer key_scratch, value_scratch;
  IncomingMessage request;
  const absl::Status framing = transport_internal::DecodeRequest(
      frames, kMaxMessageBytes, &pool, &key_scratch, &value_scratch, &request);
  if (!framing.ok()) return;
  static uint64_t token = 0;
  request.reply_token = ++token;
  OutgoingReply reply;
  std::vector<DeferredReply> released;
  dispatcher.Handle(request, &reply, &released);
  const proto::DataHeader& h = request.header;
  const int code = reply.header.status_code();
  // DP_FUZZ_VERBOSE=1: every request and its outcome, to read an input.
  static const bool verbose = std::getenv("DP_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "%s keys=%zu values=%zu -> %d %s%s (%zu bytes)\n",
                 h.ShortDebugString().c_str(), request.keys.size(),
                 request.values.size(), code,
                 reply.header.status_message().c_str(),
                 reply.deferred ? " deferred" : "", reply.values.size());
  }
  if (code < 0 || code > 16) Fail("status code out of range", h);
  if (code != 0 || reply.deferred) return;
  if (!Reads(h.op())) {
    if (reply.values.size() != 0) Fail("a write replied with values", h);
    return;
  }
  const uint64_t rows = h.is_range() ? (h.range_end() > h.range_begin()
                                            ? h.range_end() - h.range_begin()
                                            : 0)
                                     : request.keys.size();
  if (reply.values.size() != rows * h.width() * sizeof(float)) {
    Fail("a read replied " + std::to_string(reply.values.size()) +
             " bytes for " + std::to_string(rows) + " rows of width " +
             std::to_string(h.width()),
         h);
  }
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace downpour;
  FuzzInput in(data, size);
  BufferPool pool;
  server_internal::PinOptions pins;
  pins.min_bytes = in.Bool() ? 16 : size_t{256} << 10;  // exercise pinning
  pins.wait = absl::Milliseconds(1);
  pins.copy_after_wait = absl::Milliseconds(1);
  Dispatcher dispatcher(kSelf, kMaxMessageBytes, &pool, Plugins(), pins,
                        /*env=*/nullptr, kMaxTableBytes);
  proto::ClusterMap map = BaseMap();
  (void)dispatcher.ApplyMap(map);
  uint64_t id = 0;
  for (int step = 0; step < kMaxSteps && !in.empty(); ++step) {
    switch (in.IntInRange(0, 9)) {
      case 0: {
        map = NextMap(map, in);
        (void)dispatcher.ApplyMap(map);
        break;
      }
      case 1: {  // raw frames
        const size_t count = in.IntInRange(0, 4);
        std::vector<std::string> bytes;
        std::vector<transport_internal::Frame> frames;
        for (size_t i = 0; i < count; ++i) bytes.push_back(in.String(512));
        for (const std::string& b : bytes)
          frames.push_back({b.data(), b.size()});
        Deliver(dispatcher, pool, frames);
        break;
      }
      default: {
        Request r = MakeRequest(in, map.epoch(), ++id);
        const std::string header = r.header.SerializeAsString();
        std::vector<transport_internal::Frame> frames = {
            {header.data(), header.size()},
            {reinterpret_cast<const char*>(r.keys.data()),
             r.keys.size() * sizeof(Key)},
            {reinterpret_cast<const char*>(r.values.data()),
             r.values.size() * sizeof(float)}};
        Deliver(dispatcher, pool, frames);
        break;
      }
    }
  }
  return 0;
}
