#include "psctl/network_probe.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/job_member.h"
#include "cluster/scheduler_client.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "models/batcher.h"
#include "models/dataset.h"
#include "models/model.h"
#include "worker/bsp_parts.h"

namespace downpour {
namespace {

constexpr uint32_t kWidth = 256;  // 1 KiB rows

// The probes' scratch tables are named from this, unique to this run.
std::string ScratchTablePrefix() {
  return absl::StrCat("psctl-calibrate-", getpid(), "-",
                      absl::ToUnixMillis(absl::Now()));
}

// CPU seconds of this process (every thread), or of the calling thread.
double CpuSeconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double SelfCpuSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }
double ThreadCpuSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }

// Totals of a probe: operations, wall time, CPU of this process, of its
// calling thread, and of the server (-1: not measured).
struct Totals {
  double ops = 0, wall = 0, client_cpu = 0, caller_cpu = 0, server_cpu = 0;
  double server_busiest_thread = 0;  // of server_cpu
  void Add(const Totals& t) {
    ops += t.ops;
    wall += t.wall;
    client_cpu += t.client_cpu;
    caller_cpu += t.caller_cpu;
    server_cpu =
        server_cpu < 0 || t.server_cpu < 0 ? -1 : server_cpu + t.server_cpu;
    server_busiest_thread += t.server_busiest_thread;
  }
  double WallPerOp() const { return wall / std::max(1.0, ops); }
  double ClientPerOp() const { return client_cpu / std::max(1.0, ops); }
  double CallerPerOp() const { return caller_cpu / std::max(1.0, ops); }
  double ServerPerOp() const { return server_cpu / std::max(1.0, ops); }
};

// The server's CPU comes from /proc in clock ticks (10 ms): a window that
// holds none reads as 0. A window measuring the server therefore runs on
// past `seconds` until the server has used this much, or for at most
// kMaxServerWindow seconds.
constexpr double kMinServerCpu = 0.05;
constexpr double kMaxServerWindow = 5.0;

// Keeps `depth` operations from `issue(slot)` in flight for `seconds`
// (at least 2 x depth operations; see kMinServerCpu when `server` is
// given). Per-operation latencies go to `latencies` when it is not null
// (depth 1).
absl::StatusOr<Totals> Run(Client& client, int depth, double seconds,
                           pid_t server,
                           const std::function<Ticket(int)>& issue,
                           std::vector<double>* latencies = nullptr) {
  for (int i = 0; i < depth; ++i) {
    DP_RETURN_IF_ERROR(client.Wait(issue(i)), "warm-up");
  }
  Totals t;
  const double cpu0 = SelfCpuSeconds();
  const double caller0 = ThreadCpuSeconds();
  const double srv0 = server > 0 ? ProcessCpuSeconds(server) : -1;
  const std::map<pid_t, double> threads0 =
      server > 0 ? ThreadCpuSecondsOf(server) : std::map<pid_t, double>{};
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  const absl::Time last_stop =
      start + absl::Seconds(std::max(seconds, kMaxServerWindow));
  std::vector<Ticket> inflight(depth);
  std::vector<absl::Time> sent(depth);
  for (int i = 0; i < depth; ++i) {
    sent[i] = absl::Now();
    inflight[i] = issue(i);
  }
  int64_t done = 0;
  absl::Time now = start;
  while (true) {
    const int slot = static_cast<int>(done % depth);
    DP_RETURN_IF_ERROR(client.Wait(inflight[slot]));
    now = absl::Now();
    if (latencies != nullptr) {
      latencies->push_back(absl::ToDoubleMicroseconds(now - sent[slot]));
    }
    ++done;
    if (now >= stop && done >= 2 * depth) {
      if (srv0 < 0 || now >= last_stop) break;
      // Read every 32 operations: /proc costs a few microseconds.
      if (done % 32 == 0 && ProcessCpuSeconds(server) - srv0 >= kMinServerCpu) {
        break;
      }
    }
    sent[slot] = now;
    inflight[slot] = issue(slot);
  }
  // Drain the rest (counted: they ran within the window's CPU).
  for (int64_t i = done; i < done + depth - 1; ++i) {
    DP_RETURN_IF_ERROR(client.Wait(inflight[i % depth]));
  }
  now = absl::Now();
  const double srv1 = server > 0 ? ProcessCpuSeconds(server) : -1;
  t.ops = static_cast<double>(done + depth - 1);
  t.wall = absl::ToDoubleSeconds(now - start);
  t.client_cpu = SelfCpuSeconds() - cpu0;
  t.caller_cpu = ThreadCpuSeconds() - caller0;
  t.server_cpu = srv0 >= 0 && srv1 >= 0 ? srv1 - srv0 : -1;
  if (server > 0) {
    for (const auto& [tid, cpu] : ThreadCpuSecondsOf(server)) {
      auto before = threads0.find(tid);
      t.server_busiest_thread =
          std::max(t.server_busiest_thread,
                   cpu - (before != threads0.end() ? before->second : 0));
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<StreamedStep> ProbeStreamedStep(Client& client,
                                               const planner::ModelSpec& spec,
                                               const ProbeOptions& o,
                                               pid_t server) {
  std::vector<int> sizes(spec.layer_sizes.begin(), spec.layer_sizes.end());
  std::unique_ptr<Model> model = MakeMlp(sizes);
  const Dataset data = ProbeData(spec);
  const std::string tag = absl::StrCat(ScratchTablePrefix(), "-step");
  // A table per parameter block, as ps_worker makes them, cut into parts
  // as its BSP loop cuts them.
  std::vector<Table> tables;
  const std::vector<ParamBlock> blocks = model->Blocks();
  for (size_t i = 0; i < blocks.size(); ++i) {
    TableOptions t;
    t.name = absl::StrCat(tag, "-", i);
    t.width = static_cast<uint32_t>(blocks[i].width);
    t.num_keys = blocks[i].rows;
    t.handler = "sgd";
    t.sync_workers = 1;
    t.tracked_workers = 1;
    DP_ASSIGN_OR_RETURN(Table table, client.CreateTable(t), "create table ",
                        t.name);
    tables.push_back(table);
  }
  BspPartTracker parts(CutBspParts(blocks));
  std::vector<float> params(model->NumParams()), grads(params.size());
  model->Init(1, params.data());
  Batcher batcher(data.num_examples, 1, 0);
  std::vector<Ticket> tickets;
  absl::Status failed;
  int64_t clock = 0;
  auto step = [&]() -> double {
    client.SetWorkerClock(0, clock++);
    tickets.clear();
    parts.Reset();
    auto ready = [&](size_t off, size_t count) {
      parts.Ready(off, count, [&](const BspPart& p) {
        for (size_t j = p.offset; j < p.offset + p.count; ++j) {
          grads[j] *= 1e-3f;  // the learning rate, as the worker scales it
        }
        tickets.push_back(client.PushPull(
            tables[p.table], Keys::Range(p.begin, p.end),
            absl::MakeConstSpan(grads.data() + p.offset, p.count),
            absl::MakeSpan(params.data() + p.offset, p.count)));
      });
    };
    const absl::Time start = absl::Now();
    model->LossAndGradientStreamed(params.data(), data,
                                   batcher.Next(static_cast<int>(spec.batch)),
                                   grads.data(), ready);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    for (Ticket t : tickets) {
      absl::Status s = client.Wait(t);
      if (failed.ok() && !s.ok()) failed = s;
    }
    return ms;
  };
  std::vector<double> samples;
  for (int i = 0; i < 3; ++i) step();  // warm up: buffers and connections
  // Every step's CPU counts, the wait for its replies included (a step
  // ends with its last reply, as ps_worker's does).
  const double cpu0 = SelfCpuSeconds();
  const double srv0 = server > 0 ? ProcessCpuSeconds(server) : -1;
  const absl::Time start = absl::Now();
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    const absl::Time stop = absl::Now() + absl::Seconds(o.seconds);
    bool more = true;
    do {
      samples.push_back(step());
      // The server's CPU comes in 10 ms ticks: the last round goes on
      // until it has a few (see kMinServerCpu).
      more = absl::Now() < stop;
      if (!more && srv0 >= 0 && r + 1 == std::max(1, o.rounds) &&
          absl::Now() < start + absl::Seconds(kMaxServerWindow)) {
        more = ProcessCpuSeconds(server) - srv0 < kMinServerCpu;
      }
    } while (more && failed.ok());
  }
  StreamedStep out;
  const double steps = static_cast<double>(samples.size());
  out.cpu_ms = (SelfCpuSeconds() - cpu0) / steps * 1e3;
  if (srv0 >= 0) {
    const double srv1 = ProcessCpuSeconds(server);
    if (srv1 >= srv0) out.server_cpu_ms = (srv1 - srv0) / steps * 1e3;
  }
  client.SetWorkerClock(-1, -1);
  DP_RETURN_IF_ERROR(failed, "the streamed step's PushPulls");
  out.ms = planner::SpreadOf(samples);
  return out;
}

absl::StatusOr<planner::NetworkCalibration> ProbeNetwork(
    Client& client, Client& second, const NetworkProbeOptions& o) {
  const std::string tag = ScratchTablePrefix();
  const uint64_t rows = std::max<size_t>(1, o.message_bytes / (kWidth * 4));
  TableOptions big;
  big.name = tag;
  big.width = kWidth;
  // Rows [0, rows) form the first server's range.
  big.num_keys = rows * o.servers;
  big.handler = "sgd";
  DP_ASSIGN_OR_RETURN(const Table t, client.CreateTable(big), "create table ",
                      big.name);
  TableOptions small;
  small.name = tag + "-small";
  small.width = 1;
  small.num_keys = o.servers;
  DP_ASSIGN_OR_RETURN(const Table ts, client.CreateTable(small),
                      "create table ", small.name);
  const int k = std::max(1, o.in_flight);
  std::vector<std::vector<float>> bufs(
      k, std::vector<float>(rows * kWidth, 1e-3f));
  std::vector<std::vector<float>> tiny(k, std::vector<float>(1));
  const Keys range = Keys::Range(0, rows);
  const Keys one = Keys::Range(0, 1);
  auto push = [&](int slot) {
    return client.Push(t, range, absl::MakeConstSpan(bufs[slot]));
  };
  auto pull = [&](int slot) {
    return client.Pull(t, range, absl::MakeSpan(bufs[slot]));
  };
  auto small_pull = [&](int slot) {
    return client.Pull(ts, one, absl::MakeSpan(tiny[slot]));
  };

  std::vector<double> latency, push1, pushk, pull1, pullk, small_rate;
  Totals small_k, push_k, pull_k;
  const double s = o.probe.seconds;
  const double bytes = static_cast<double>(rows * kWidth * 4);
  for (int r = 0; r < std::max(1, o.probe.rounds); ++r) {
    // Each round measures every figure once, so that a burst of load on a
    // shared machine falls on all of them.
    // One at a time: every operation's time is a sample.
    DP_RETURN_IF_ERROR(
        Run(client, 1, s, o.server, small_pull, &latency).status(),
        "4-byte pulls");
    DP_ASSIGN_OR_RETURN(Totals b, Run(client, k, s, o.server, small_pull),
                        "4-byte pulls, ", k, " in flight");
    small_rate.push_back(b.ops / b.wall);
    small_k.Add(b);
    std::vector<double> us;
    DP_RETURN_IF_ERROR(Run(client, 1, s, o.server, push, &us).status(),
                       "pushes");
    for (double u : us) push1.push_back(bytes / u / 1e3);
    DP_ASSIGN_OR_RETURN(Totals d, Run(client, k, s, o.server, push), "pushes, ",
                        k, " in flight");
    pushk.push_back(bytes / d.WallPerOp() / 1e9);
    push_k.Add(d);
    us.clear();
    DP_RETURN_IF_ERROR(Run(client, 1, s, o.server, pull, &us).status(),
                       "pulls");
    for (double u : us) pull1.push_back(bytes / u / 1e3);
    DP_ASSIGN_OR_RETURN(Totals f, Run(client, k, s, o.server, pull), "pulls, ",
                        k, " in flight");
    pullk.push_back(bytes / f.WallPerOp() / 1e9);
    pull_k.Add(f);
  }
  // BSP: two ranks PushPull the same part of a table that aggregates 2
  // workers per clock (the server holds the first until the second comes,
  // applies the mean, answers both), against PushPulls that are applied at
  // once, one at a time as well.
  TableOptions synced = big;
  synced.name = tag + "-bsp";
  synced.sync_workers = 2;
  synced.tracked_workers = 2;
  DP_ASSIGN_OR_RETURN(const Table tb, client.CreateTable(synced),
                      "create table ", synced.name);
  std::vector<float> out(rows * kWidth), out2(rows * kWidth);
  int64_t step = 0;
  absl::Status second_failed;
  auto bsp_pair = [&](int) -> Ticket {
    client.SetWorkerClock(0, step);
    second.SetWorkerClock(1, step);
    ++step;
    const Ticket a = client.PushPull(tb, range, absl::MakeConstSpan(bufs[0]),
                                     absl::MakeSpan(out));
    const Ticket b = second.PushPull(tb, range, absl::MakeConstSpan(bufs[1]),
                                     absl::MakeSpan(out2));
    // Run() waits for the first; the pair is answered together.
    if (absl::Status st = second.Wait(b); !st.ok() && second_failed.ok()) {
      second_failed = st;
    }
    return a;
  };
  auto plain = [&](int) -> Ticket {
    return client.PushPull(t, range, absl::MakeConstSpan(bufs[0]),
                           absl::MakeSpan(out));
  };
  Totals held, direct;
  for (int r = 0; r < std::max(1, o.probe.rounds); ++r) {
    DP_ASSIGN_OR_RETURN(Totals a, Run(client, 1, s / 2, o.server, bsp_pair),
                        "BSP PushPulls");
    held.Add(a);
    DP_ASSIGN_OR_RETURN(Totals b, Run(client, 1, s / 2, o.server, plain),
                        "PushPulls");
    direct.Add(b);
  }
  client.SetWorkerClock(-1, -1);
  second.SetWorkerClock(-1, -1);
  DP_RETURN_IF_ERROR(second_failed, "BSP PushPulls of the second rank");

  planner::NetworkCalibration n;
  // Per held request: half a pair's server CPU, over a PushPull applied at
  // once (both apply once per request pair's worth of floats: the extra
  // is holding, summing and answering later).
  if (held.server_cpu >= 0 && direct.server_cpu >= 0) {
    n.server_us_per_held_request =
        std::max(0.0, held.ServerPerOp() / 2 - direct.ServerPerOp()) * 1e6;
  } else {
    n.server_us_per_held_request =
        std::max(0.0, held.WallPerOp() / 2 - direct.WallPerOp()) * 1e6;
  }
  n.latency_us = planner::SpreadOf(latency);
  n.message_bytes = static_cast<int64_t>(bytes);
  n.in_flight = k;
  n.push_gbs_1 = planner::SpreadOf(push1);
  n.push_gbs_k = planner::SpreadOf(pushk);
  n.pull_gbs_1 = planner::SpreadOf(pull1);
  n.pull_gbs_k = planner::SpreadOf(pullk);
  n.small_pulls_per_s_k = planner::SpreadOf(small_rate).median;
  // Costs with k in flight, as a training job keeps its requests going.
  n.client_us_per_request = small_k.ClientPerOp() * 1e6;
  n.client_ns_per_push_byte =
      std::max(0.0, push_k.ClientPerOp() - small_k.ClientPerOp()) / bytes * 1e9;
  n.client_ns_per_pull_byte =
      std::max(0.0, pull_k.ClientPerOp() - small_k.ClientPerOp()) / bytes * 1e9;
  n.caller_us_per_request = small_k.CallerPerOp() * 1e6;
  n.caller_ns_per_byte =
      std::max(0.0, (push_k.CallerPerOp() + pull_k.CallerPerOp()) / 2 -
                        small_k.CallerPerOp()) /
      bytes * 1e9;
  const double sgd = bytes / 4 * o.sgd_ns_per_float * 1e-9;
  if (small_k.server_cpu >= 0 && push_k.server_cpu >= 0 &&
      pull_k.server_cpu >= 0) {
    n.server_cpu_source = "measured";
    const double all =
        small_k.server_cpu + push_k.server_cpu + pull_k.server_cpu;
    const double busiest = small_k.server_busiest_thread +
                           push_k.server_busiest_thread +
                           pull_k.server_busiest_thread;
    if (all > 0 && busiest > 0) {
      n.server_serial_fraction = std::min(1.0, busiest / all);
    }
    n.server_us_per_request = small_k.ServerPerOp() * 1e6;
    n.server_ns_per_push_byte =
        std::max(0.0, push_k.ServerPerOp() - small_k.ServerPerOp() - sgd) /
        bytes * 1e9;
    n.server_ns_per_pull_byte =
        std::max(0.0, pull_k.ServerPerOp() - small_k.ServerPerOp()) / bytes *
        1e9;
  } else {
    // The server runs elsewhere: with k in flight its time per request
    // bounds its CPU per request from above.
    n.server_cpu_source = "estimated";
    n.server_us_per_request = small_k.WallPerOp() * 1e6;
    n.server_ns_per_push_byte =
        std::max(0.0, push_k.WallPerOp() - small_k.WallPerOp() - sgd) / bytes *
        1e9;
    n.server_ns_per_pull_byte =
        std::max(0.0, pull_k.WallPerOp() - small_k.WallPerOp()) / bytes * 1e9;
  }
  return n;
}

absl::Status ProbeControl(const std::string& scheduler, const ClusterAuth& auth,
                          pid_t scheduler_pid, const ProbeOptions& o,
                          planner::NetworkCalibration* n) {
  std::unique_ptr<JobMember> member;
  std::unique_ptr<SchedulerClient> sched;
  if (scheduler_pid > 0) {
    JobMemberOptions jo;
    jo.scheduler_address = scheduler;
    jo.name = "psctl-calibrate";
    jo.auth = auth;
    DP_ASSIGN_OR_RETURN(member, JobMember::Join(jo), "join the local job");
  } else {
    sched =
        std::make_unique<SchedulerClient>(scheduler, absl::Seconds(10), auth);
  }
  Clock clock = 0;
  auto call = [&]() -> absl::Status {
    if (member == nullptr) return sched->GetJobStatus().status();
    ClockReport r;
    r.clock = ++clock;
    r.examples = clock;
    DP_RETURN_IF_ERROR(member->ReportClock(r));
    return member->Flush(absl::Seconds(10));
  };
  DP_RETURN_IF_ERROR(call(), "the scheduler");
  std::vector<double> us;
  double calls = 0, client = 0, server = 0;
  for (int r = 0; r < std::max(1, o.rounds); ++r) {
    const double cpu0 = SelfCpuSeconds();
    const double srv0 =
        scheduler_pid > 0 ? ProcessCpuSeconds(scheduler_pid) : -1;
    const absl::Time stop = absl::Now() + absl::Seconds(o.seconds / 2);
    do {
      const absl::Time a = absl::Now();
      DP_RETURN_IF_ERROR(call(), "the scheduler");
      us.push_back(absl::ToDoubleMicroseconds(absl::Now() - a));
      ++calls;
    } while (absl::Now() < stop);
    client += SelfCpuSeconds() - cpu0;
    server = srv0 < 0 || server < 0
                 ? -1
                 : server + ProcessCpuSeconds(scheduler_pid) - srv0;
  }
  if (member != nullptr) {
    DP_RETURN_IF_ERROR(
        member->Leave(/*finished=*/true, "calibrated", absl::Seconds(10)));
  }
  n->control_latency_us = planner::SpreadOf(us).median;
  n->control_client_us = client / calls * 1e6;
  n->control_scheduler_us =
      server >= 0 ? server / calls * 1e6 : n->control_client_us;
  return absl::OkStatus();
}

}  // namespace downpour
