#include "python/src/client_binding.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "common/auth.h"
#include "common/status_macros.h"
#include "handlers/initializer.h"
#include "proto/downpour.pb.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"
#include "python/src/arrays.h"
#include "python/src/auth_args.h"
#include "python/src/operation.h"
#include "python/src/status.h"

namespace downpour {
namespace python {

namespace py = pybind11;
using py::arg;

namespace {

enum class OpKind { kPut, kAdd, kPush, kGet, kPull, kPushPull };

bool Writes(OpKind k) {
  return k == OpKind::kPut || k == OpKind::kAdd || k == OpKind::kPush ||
         k == OpKind::kPushPull;
}
bool Reads(OpKind k) {
  return k == OpKind::kGet || k == OpKind::kPull || k == OpKind::kPushPull;
}

// The Python face of a Client. close() drops this object's reference; the
// SDK client lives on until the operations still holding it complete.
// Thread-safe: Python threads may share it (calls run without the GIL).
class PyClient {
 public:
  PyClient(std::unique_ptr<Client> client, absl::Duration op_timeout)
      : client_(std::move(client)), op_timeout_(op_timeout) {}
  ~PyClient() { Close(); }

  // The client, or FailedPreconditionError after close().
  std::shared_ptr<Client> Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (client_ == nullptr) {
      throw StatusError(absl::FailedPreconditionError("the client is closed"));
    }
    return client_;
  }

  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    std::shared_ptr<Client> client;
    {
      absl::MutexLock lock(&mu_);
      client = std::move(client_);
    }
    if (client != nullptr) DropClient(&client);
  }

  bool closed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return client_ == nullptr;
  }

  // How long an Operation may wait beyond the SDK's own deadline.
  absl::Duration grace() const { return op_timeout_ + absl::Seconds(30); }

  // Issues one operation; returns an Operation (async_op) or its result.
  py::object Submit(OpKind kind, const Table& table, const py::handle& keys,
                    const py::handle& values, const py::handle& out,
                    bool async_op) {
    std::shared_ptr<Client> client = Get();
    HeldKeys held_keys = ToKeys(table, keys);
    HeldInput in;
    if (Writes(kind)) in = ToInput(values);
    HeldOutput output;
    if (Reads(kind)) output = ToOutput(table, held_keys.keys.size(), out);
    auto completion = std::make_shared<Completion>();
    Callback done = Completion::CallbackFor(completion);
    {
      py::gil_scoped_release release;
      const Keys& k = held_keys.keys;
      switch (kind) {
        case OpKind::kPut:
          client->Put(table, k, in.values, done);
          break;
        case OpKind::kAdd:
          client->Add(table, k, in.values, done);
          break;
        case OpKind::kPush:
          client->Push(table, k, in.values, done);
          break;
        case OpKind::kGet:
          client->Get(table, k, output.values, done);
          break;
        case OpKind::kPull:
          client->Pull(table, k, output.values, done);
          break;
        case OpKind::kPushPull:
          client->PushPull(table, k, in.values, output.values, done);
          break;
      }
    }
    py::object result = Reads(kind) ? output.owner : py::object(py::none());
    auto op = std::make_unique<Operation>(
        std::move(client), std::move(completion),
        py::make_tuple(held_keys.owner, in.owner ? in.owner : py::none(),
                       result),
        result, grace());
    if (async_op) return py::cast(std::move(op));
    return op->Wait(std::nullopt);
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<Client> client_ ABSL_GUARDED_BY(mu_);
  const absl::Duration op_timeout_;
};

// Reads the secret and TLS files (if any) and connects. Blocks; call
// without the GIL.
absl::StatusOr<std::unique_ptr<Client>> ConnectWith(
    ClientOptions options, const std::optional<std::string>& secret_file,
    const TlsFiles& tls) {
  DP_ASSIGN_OR_RETURN(options.auth, ClusterAuth::Load(secret_file.value_or(""),
                                                      tls, kGrpcClient));
  return Client::Connect(options);
}

std::shared_ptr<PyClient> Connect(
    const std::string& scheduler_address, double op_timeout,
    double connect_timeout, uint64_t max_message_bytes,
    const std::optional<std::string>& secret,
    const std::optional<std::string>& tls_ca_file,
    const std::optional<std::string>& tls_cert_file,
    const std::optional<std::string>& tls_key_file, bool tls_mutual,
    const std::optional<std::string>& tls_server_name, double spin_wait) {
  if (op_timeout <= 0 || connect_timeout <= 0) {
    throw py::value_error("op_timeout and connect_timeout must be positive");
  }
  if (!(spin_wait >= 0 && spin_wait <= absl::ToDoubleSeconds(kMaxSpinWait))) {
    throw py::value_error(absl::StrCat("spin_wait must lie in [0, ",
                                       absl::ToDoubleSeconds(kMaxSpinWait),
                                       "] seconds"));
  }
  ClientOptions options;
  options.spin_wait = absl::Seconds(spin_wait);
  options.scheduler_address = scheduler_address;
  options.op_timeout = absl::Seconds(op_timeout);
  options.connect_timeout = absl::Seconds(connect_timeout);
  options.max_message_bytes = max_message_bytes;
  const TlsFiles tls = TlsFilesOf(tls_ca_file, tls_cert_file, tls_key_file,
                                  tls_mutual, tls_server_name);
  absl::StatusOr<std::unique_ptr<Client>> client;
  {
    py::gil_scoped_release release;
    client = ConnectWith(options, secret, tls);
  }
  return std::make_shared<PyClient>(ValueOrThrow(std::move(client)),
                                    options.op_timeout);
}

Table CreateTable(PyClient& self, const std::string& name, uint64_t num_keys,
                  uint32_t width, bool sparse, const std::string& init,
                  float init_a, float init_b, uint64_t init_seed,
                  const std::string& handler,
                  const std::map<std::string, double>& handler_params,
                  uint32_t sync_workers, uint32_t tracked_workers,
                  const std::vector<std::string>& vectors, bool follows_job,
                  bool allow_non_finite, const std::string& consistency,
                  const py::object& max_rows, const py::object& max_bytes,
                  const py::object& eviction, const py::object& ttl_clocks,
                  const py::object& ttl_seconds, const py::object& admit_after,
                  const py::object& max_pending_ids,
                  const py::object& cold_tier, bool sum_repeats) {
  TableOptions o;
  o.consistency = consistency;
  // Any bound given makes the table bounded (TableOptions::Bounds).
  TableOptions::Bounds b;
  bool bounded = false;
  auto take = [&](const py::object& v, int64_t* field) {
    if (v.is_none()) return;
    *field = v.cast<int64_t>();
    bounded = true;
  };
  take(max_rows, &b.max_rows);
  take(max_bytes, &b.max_bytes);
  take(ttl_clocks, &b.ttl_clocks);
  take(ttl_seconds, &b.ttl_seconds);
  take(admit_after, &b.admit_after);
  take(max_pending_ids, &b.max_pending_ids);
  if (!eviction.is_none()) {
    b.eviction = eviction.cast<std::string>();
    bounded = true;
  }
  if (!cold_tier.is_none()) {
    b.cold_tier = cold_tier.cast<bool>();
    bounded = true;
  }
  if (bounded) o.bounds = b;
  o.name = name;
  o.num_keys = num_keys;
  o.width = width;
  o.sparse = sparse;
  o.init = init;
  o.init_a = init_a;
  o.init_b = init_b;
  o.init_seed = init_seed;
  o.handler = handler;
  o.handler_params = handler_params;
  o.sync_workers = sync_workers;
  o.tracked_workers = tracked_workers;
  o.vectors = vectors;
  o.follows_job = follows_job;
  o.allow_non_finite = allow_non_finite;
  o.sum_repeats = sum_repeats;
  std::shared_ptr<Client> client = self.Get();
  absl::StatusOr<Table> table;
  {
    py::gil_scoped_release release;
    table = client->CreateTable(o);
  }
  return ValueOrThrow(std::move(table));
}

void CheckTable(PyClient& self, const Table& t) {
  std::shared_ptr<Client> client = self.Get();
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = client->CheckTable(t);
  }
  ThrowIfError(status);
}

Table OpenTable(PyClient& self, const std::string& name) {
  std::shared_ptr<Client> client = self.Get();
  absl::StatusOr<Table> table;
  {
    py::gil_scoped_release release;
    table = client->OpenTable(name);
  }
  return ValueOrThrow(std::move(table));
}

std::string TableRepr(const Table& t) {
  return absl::StrCat(
      "Table(name='", t.name, "', id=", t.id, ", width=", t.width,
      t.sparse ? ", sparse=True" : absl::StrCat(", num_keys=", t.num_keys),
      t.vectors.empty()
          ? ""
          : absl::StrCat(", vectors=['", absl::StrJoin(t.vectors, "', '"),
                         "'], vector=", t.vector),
      ")");
}

// Docstrings shared by the six data operations.
constexpr char kKeysDoc[] =
    "keys: None (every key of a dense table), range(begin, end), an int, or "
    "a 1-D sequence or numpy array of non-negative integers (a C-contiguous "
    "uint64 array is used without copying).";
constexpr char kAsyncDoc[] =
    "With async_op=True the call returns at once with a downpour.Operation; "
    "its wait() returns what the blocking call would (buffers must then "
    "stay unchanged until it completes). The GIL is released while the "
    "call waits.";

std::string OpDoc(const std::string& what, bool writes, bool reads) {
  std::string doc = absl::StrCat(what, "\n\n", kKeysDoc, "\n");
  if (writes) {
    absl::StrAppend(&doc,
                    "values: len(keys) x table.width floats, any shape "
                    "(a C-contiguous float32 array is used without "
                    "copying; others are converted once).\n");
  }
  if (reads) {
    absl::StrAppend(&doc,
                    "out: None (a new float32 array of shape (len(keys), "
                    "width) is returned) or a writable C-contiguous float32 "
                    "array of len(keys) x width elements, filled in place "
                    "and returned.\n");
  }
  absl::StrAppend(&doc, kAsyncDoc,
                  "\n\nRaises downpour.errors: NotFoundError (unknown table), "
                  "InvalidArgumentError (sizes do not match), OutOfRangeError "
                  "(a key outside the key space), UnavailableError (owning "
                  "server down), DeadlineExceededError (no reply within "
                  "op_timeout); TypeError or ValueError for malformed "
                  "arguments.");
  return doc;
}

// The values fresh rows of `keys` hold in a table declared with these init
// arguments (handlers/initializer.h), computed here without a server.
py::array_t<float> InitialRows(const py::handle& keys, uint32_t width,
                               const std::string& init, float init_a,
                               float init_b, uint64_t init_seed) {
  proto::InitializerSpec spec;
  spec.set_seed(init_seed);
  if (init == "zeros") {
    spec.set_kind(proto::InitializerSpec::ZEROS);
  } else if (init == "constant") {
    spec.set_kind(proto::InitializerSpec::CONSTANT);
    spec.set_value(init_a);
  } else if (init == "uniform") {
    spec.set_kind(proto::InitializerSpec::UNIFORM);
    spec.set_low(init_a);
    spec.set_high(init_b);
  } else if (init == "normal") {
    spec.set_kind(proto::InitializerSpec::NORMAL);
    spec.set_mean(init_a);
    spec.set_stddev(init_b);
  } else {
    throw py::value_error(absl::StrCat("unknown initializer '", init,
                                       "' (zeros, constant, uniform, normal)"));
  }
  const Initializer initializer = ValueOrThrow(Initializer::Create(spec));
  auto k = py::array_t<uint64_t, py::array::c_style>::ensure(keys);
  if (!k || k.ndim() != 1) {
    throw py::value_error("keys must be a 1-D array of uint64 keys");
  }
  py::array_t<float> out({k.shape(0), static_cast<py::ssize_t>(width)});
  const uint64_t* src = k.data();
  float* dst = out.mutable_data();
  const size_t n = static_cast<size_t>(k.shape(0));
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < n; ++i) {
      initializer.FillRow(src[i], width, dst + i * width);
    }
  }
  return out;
}

}  // namespace

void RegisterClient(py::module_& m) {
  m.def("initial_rows", &InitialRows, arg("keys"), arg("width"), py::kw_only(),
        arg("init") = "zeros", arg("init_a") = 0.0f, arg("init_b") = 0.0f,
        arg("init_seed") = 0,
        "The values that fresh rows of `keys` (a 1-D uint64 array) hold in a "
        "table declared with these init arguments (create_table's): a pure "
        "function of (init_seed, key, column), computed without a server. "
        "Returns float32 [len(keys), width].");

  py::class_<Table>(m, "Table",
                    "A declared table (returned by Client.create_table and "
                    "Client.open_table). Cheap to copy; immutable.")
      .def_readonly("id", &Table::id)
      .def_readonly("name", &Table::name)
      .def_readonly("width", &Table::width, "floats per key")
      .def_readonly("sparse", &Table::sparse)
      .def_readonly("num_keys", &Table::num_keys, "dense tables only")
      .def_readonly("vectors", &Table::vectors)
      .def_readonly("vector", &Table::vector,
                    "the named vector operations address (0: parameters)")
      .def_readonly("allow_non_finite", &Table::allow_non_finite,
                    "pushes may hold NaN or infinity")
      .def_readonly("sum_repeats", &Table::sum_repeats,
                    "a push or add sums a repeated key's rows and applies "
                    "them once")
      .def_readonly("consistency", &Table::consistency,
                    "the table's own policy ('bsp', 'ssp:N', 'asp'; '' for "
                    "a table that follows the job's, or no job)")
      .def_readonly("bounded", &Table::bounded,
                    "a sparse table of bounded memory (cap, eviction, TTL, "
                    "admission, cold tier)")
      .def(
          "with_vector",
          [](const Table& t, const std::string& name) {
            return ValueOrThrow(t.WithVector(name));
          },
          arg("name"),
          "The same table addressing its named vector `name` "
          "(NotFoundError if it has none of that name).")
      .def("__repr__", &TableRepr)
      .def("__eq__",
           [](const Table& a, const Table& b) {
             return a.id == b.id && a.name == b.name && a.vector == b.vector;
           })
      .def("__hash__", [](const Table& t) {
        return py::hash(py::make_tuple(t.id, t.name, t.vector));
      });

  py::class_<Operation>(
      m, "Operation",
      "An operation in flight (from async_op=True). Keep the arrays given "
      "to it unchanged until it completes.")
      .def("wait", &Operation::Wait, arg("timeout") = py::none(),
           "Blocks (GIL released) until the operation completes; returns "
           "the output array for reads, None for writes. Raises the "
           "operation's error (a downpour.errors exception), or "
           "DeadlineExceededError if `timeout` seconds pass first (the "
           "operation goes on and may be waited on again).")
      .def("is_completed", &Operation::IsCompleted,
           "Whether the operation has completed (successfully or not).");

  py::class_<TrafficStats>(m, "TrafficStats",
                           "Bytes a client moved on the data plane.")
      .def_readonly("requests", &TrafficStats::requests)
      .def_readonly("bytes_sent", &TrafficStats::bytes_sent)
      .def_readonly("bytes_received", &TrafficStats::bytes_received)
      .def_readonly("spins", &TrafficStats::spins,
                    "Waits for a lone operation that spun before sleeping "
                    "(Client.connect's spin_wait).")
      .def_readonly("spins_caught", &TrafficStats::spins_caught,
                    "Of those, the ones whose reply came while spinning.")
      .def("__repr__", [](const TrafficStats& s) {
        return absl::StrCat(
            "TrafficStats(requests=", s.requests, ", bytes_sent=", s.bytes_sent,
            ", bytes_received=", s.bytes_received, ", spins=", s.spins,
            ", spins_caught=", s.spins_caught, ")");
      });

  auto op = [](OpKind kind) {
    return [kind](PyClient& self, const Table& t, const py::object& keys,
                  const py::object& values, bool async_op) {
      return self.Submit(kind, t, keys, values, py::none(), async_op);
    };
  };
  auto read = [](OpKind kind) {
    return [kind](PyClient& self, const Table& t, const py::object& keys,
                  const py::object& out, bool async_op) {
      return self.Submit(kind, t, keys, py::none(), out, async_op);
    };
  };

  py::class_<PyClient, std::shared_ptr<PyClient>>(
      m, "Client",
      "A connection to a Downpour cluster (client/client.h): declares tables "
      "and pushes and pulls their values. Make one with Client.connect(). "
      "Thread-safe: Python threads may share one client. Usable as a "
      "context manager (closes on exit).")
      // downpour/__init__.py wraps this as Client.connect, which fills
      // omitted arguments from the environment (downpour/env.py).
      .def_static(
          "_connect", &Connect, arg("scheduler_address"), py::kw_only(),
          arg("op_timeout") = 30.0, arg("connect_timeout") = 30.0,
          arg("max_message_bytes") = uint64_t{64} << 20,
          arg("cluster_secret_file") = py::none(),
          arg("tls_ca_file") = py::none(), arg("tls_cert_file") = py::none(),
          arg("tls_key_file") = py::none(), arg("tls_mutual") = false,
          arg("tls_server_name") = py::none(), arg("spin_wait") = 200e-6,
          "Client.connect without the environment's defaults; see "
          "there.")
      .def("create_table", &CreateTable, arg("name"), py::kw_only(),
           arg("num_keys") = 0, arg("width") = 1, arg("sparse") = false,
           arg("init") = "zeros", arg("init_a") = 0.0f, arg("init_b") = 0.0f,
           arg("init_seed") = 0, arg("handler") = "sgd",
           arg("handler_params") = std::map<std::string, double>(),
           arg("sync_workers") = 0, arg("tracked_workers") = 0,
           arg("vectors") = std::vector<std::string>(),
           arg("follows_job") = false, arg("allow_non_finite") = false,
           arg("consistency") = "", arg("max_rows") = py::none(),
           arg("max_bytes") = py::none(), arg("eviction") = py::none(),
           arg("ttl_clocks") = py::none(), arg("ttl_seconds") = py::none(),
           arg("admit_after") = py::none(), arg("max_pending_ids") = py::none(),
           arg("cold_tier") = py::none(), arg("sum_repeats") = false,
           "Declares a table and waits until every server serves it; "
           "declaring an identical one again returns it "
           "(AlreadyExistsError for a different one of the same name).\n\n"
           "Dense tables have keys [0, num_keys); sparse ones any key below "
           "2**64 - 1, rows created on first write. width: floats per key. "
           "init: 'zeros', 'constant' (init_a), 'uniform' [init_a, init_b) "
           "or 'normal' (mean init_a, stddev init_b), a pure function of "
           "(init_seed, key, column). handler: the update rule push applies "
           "('assign', 'sum', 'sgd', 'momentum', 'adagrad', 'adam', 'ftrl' "
           "or 'plugin:<name>') with handler_params such as "
           "{'learning_rate': 0.1} (unknown ones are InvalidArgumentError). "
           "sync_workers > 0 (BSP): pushes carrying a worker clock are "
           "averaged over that many workers before being applied once. "
           "tracked_workers: workers whose clocks the servers track for "
           "staleness. vectors: named vectors over the same keys (dense "
           "only). follows_job: the table enforces the job's consistency "
           "policy (the scheduler sets sync_workers and tracked_workers; "
           "leave both 0): what a training program's tables use. "
           "allow_non_finite: accept pushes holding NaN or infinity (by "
           "default they are InvalidArgumentError naming the key, so that "
           "they cannot poison a row and its handler state). "
           "consistency: a table that follows the job may keep a policy of "
           "its own, 'bsp', 'ssp:N' or 'asp' (the hybrid: dense layers "
           "under the job's BSP, embeddings asynchronous). "
           "sum_repeats: a push or add naming a key more than once sums "
           "that key's rows (in batch order) and applies them once, a "
           "minibatch's gradient as TorchRec applies it; by default each "
           "occurrence is applied in turn.\n\n"
           "Bounded sparse tables (any of these makes the table bounded): "
           "max_rows or max_bytes (the table's cap, split over its ranges), "
           "eviction ('none': writes beyond the cap are ResourceExhausted; "
           "'lru', 'lfu'), ttl_clocks or ttl_seconds (idle rows expire), "
           "admit_after (pushes an id needs before it gets a row; until "
           "then pulls read its initial values), max_pending_ids (the "
           "admission counters kept), cold_tier (evicted rows go to the "
           "servers' disks, not dropped, and come back when used).")
      .def("open_table", &OpenTable, arg("name"),
           "A table declared elsewhere; NotFoundError if there is none.")
      .def("check_table", &CheckTable, arg("table"),
           "Returns if every key range of `table` is served by a live "
           "server in the current cluster map; raises UnavailableError "
           "naming the range and its dead server when no live server holds "
           "it, DataLossError for a range that was lost, NotFoundError for "
           "an unknown table. For a program that waits on others, to fail "
           "at once instead of after its timeout.")
      .def("put", op(OpKind::kPut), arg("table"), arg("keys"), arg("values"),
           py::kw_only(), arg("async_op") = false,
           OpDoc("Assigns values to keys.", true, false).c_str())
      .def("add", op(OpKind::kAdd), arg("table"), arg("keys"), arg("values"),
           py::kw_only(), arg("async_op") = false,
           OpDoc("Adds values to the keys' values.", true, false).c_str())
      .def("push", op(OpKind::kPush), arg("table"), arg("keys"), arg("grads"),
           py::kw_only(), arg("async_op") = false,
           OpDoc("Pushes gradients: the table's handler applies them.", true,
                 false)
               .c_str())
      .def("get", read(OpKind::kGet), arg("table"), arg("keys"),
           arg("out") = py::none(), py::kw_only(), arg("async_op") = false,
           OpDoc("Reads the keys' values.", false, true).c_str())
      .def("pull", read(OpKind::kPull), arg("table"), arg("keys"),
           arg("out") = py::none(), py::kw_only(), arg("async_op") = false,
           OpDoc("Reads parameters (carrying the worker clock, if set).", false,
                 true)
               .c_str())
      .def(
          "push_pull",
          [](PyClient& self, const Table& t, const py::object& keys,
             const py::object& grads, const py::object& out, bool async_op) {
            return self.Submit(OpKind::kPushPull, t, keys, grads, out,
                               async_op);
          },
          arg("table"), arg("keys"), arg("grads"), arg("out") = py::none(),
          py::kw_only(), arg("async_op") = false,
          OpDoc("Pushes gradients, then reads the updated values of the "
                "same keys, in one round trip.",
                true, true)
              .c_str())
      .def(
          "wait",
          [](PyClient&, Operation& op, std::optional<double> timeout) {
            return op.Wait(timeout);
          },
          arg("op"), arg("timeout") = py::none(), "Same as op.wait(timeout).")
      .def(
          "set_worker_clock",
          [](PyClient& self, int rank, int64_t clock) {
            self.Get()->SetWorkerClock(rank, clock);
          },
          arg("rank"), arg("clock"),
          "Operations issued after this carry the worker's rank and clock "
          "(BSP aggregation and staleness on the servers); clock < 0: none.")
      .def_property_readonly(
          "map_epoch",
          [](const PyClient& self) { return self.Get()->map_epoch(); },
          "Epoch of the cluster map the client routes by.")
      .def_property_readonly(
          "max_staleness",
          [](const PyClient& self) { return self.Get()->max_staleness(); },
          "The largest staleness the servers reported for this client's "
          "pulls.")
      .def_property_readonly(
          "discarded_pushes",
          [](const PyClient& self) { return self.Get()->discarded_pushes(); },
          "Pushes the servers dropped as late (backup workers).")
      .def_property_readonly(
          "traffic", [](const PyClient& self) { return self.Get()->traffic(); },
          "Data-plane traffic of this client so far (TrafficStats).")
      .def_property_readonly("closed", &PyClient::closed)
      .def("close", &PyClient::Close,
           "Closes the client; operations still in flight keep the "
           "connection until they complete. Later calls raise "
           "FailedPreconditionError.")
      .def("__enter__", [](std::shared_ptr<PyClient> self) { return self; })
      .def("__exit__", [](PyClient& self, const py::args&) { self.Close(); });
}

}  // namespace python
}  // namespace downpour
