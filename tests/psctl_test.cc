// psctl against real daemons: status and tables of a live cluster (human
// and JSON, with rates from traffic the test sends, and a dead server),
// split and merge by hand, a
// local cluster started by `psctl local` running a job started by
// `psctl job`, checkpoints, restore and export (online and from the data
// dirs), authentication, and usage errors.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/address_file.h"
#include "common/auth.h"
#include "common/status_macros.h"
#include "common/test_util.h"
#include "common/version.h"
#include "google/protobuf/util/json_util.h"
#include "launch/local_cluster.h"
#include "psctl/npy.h"
#include "psctl/psctl.pb.h"

namespace downpour {
namespace {

struct PsctlRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs psctl with `args` to completion.
PsctlRun Psctl(const std::vector<std::string>& args,
               absl::Duration timeout = absl::Seconds(60)) {
  static int n = 0;
  std::vector<std::string> argv = {RunfilePath("psctl/psctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  Subprocess p(argv, absl::StrCat(TestTmpDir(), "/psctl-", ++n, ".log"));
  PsctlRun r;
  if (!p.Start().ok()) return r;
  auto st = p.Wait(timeout);
  if (st.ok() && WIFEXITED(*st)) r.exit_code = WEXITSTATUS(*st);
  std::ifstream in(p.log_path());
  std::stringstream s;
  s << in.rdbuf();
  r.output = s.str();
  return r;
}

// The JSON psctl printed on stdout; its log lines (stderr, in the same
// file here) come before it.
absl::StatusOr<psctl::ClusterStatus> ParseStatus(const std::string& output) {
  const size_t start =
      output.rfind("\n{") != std::string::npos ? output.rfind("\n{") + 1 : 0;
  const std::string json = output.substr(start);
  psctl::ClusterStatus s;
  auto st = google::protobuf::util::JsonStringToMessage(json, &s);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(st.ToString(), ": ", json));
  }
  return s;
}

std::string WriteSecret(const std::string& path) {
  auto secret = ClusterAuth::NewSecret();
  EXPECT_OK(secret);
  std::ofstream(path) << *secret << "\n";
  return path;
}

// A cluster of `servers` in TestTmpDir()/`name` with `flags` for its
// scheduler, a client of it, and a dense table "w" of 1000 keys of `width`
// floats.
struct LiveCluster {
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<Client> client;
  Table table;
  std::string scheduler;  // psctl's --scheduler flag for it
};
absl::StatusOr<LiveCluster> StartLive(const std::string& name, int servers,
                                      std::vector<std::string> flags,
                                      uint32_t width) {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/" + name;
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = servers;
  o.scheduler_flags = std::move(flags);
  LiveCluster c;
  DP_ASSIGN_OR_RETURN(c.cluster, LocalCluster::Start(o));
  c.scheduler = "--scheduler=" + c.cluster->scheduler_address();
  DP_ASSIGN_OR_RETURN(
      c.client,
      Client::Connect({.scheduler_address = c.cluster->scheduler_address()}));
  TableOptions t;
  t.name = "w";
  t.width = width;
  t.num_keys = 1000;
  DP_ASSIGN_OR_RETURN(c.table, c.client->CreateTable(t));
  return c;
}

TEST(PsctlTest, StatusAndTablesOfALiveCluster) {
  // The default dead_after (3 s): a shorter one declared a live server
  // dead when two tests starved it of CPU, failing the pushes below.
  ASSERT_OK_AND_ASSIGN(
      LiveCluster started,
      StartLive("live", 2,
                {"--replicas=2", "--num_workers=2", "--consistency=asp"}, 4));
  std::unique_ptr<LocalCluster>& cluster = started.cluster;
  std::unique_ptr<Client>& client = started.client;
  const Table table = started.table;
  const std::string scheduler = started.scheduler;

  // Traffic while psctl samples the rates.
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    std::vector<float> grads(4000, 0.001f);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!stop.load() && absl::Now() < deadline) {
      EXPECT_OK(client->PushSync(table, Keys::Range(0, 1000), grads));
    }
  });
  PsctlRun json = Psctl({"status", scheduler, "--json", "--interval_ms=700"});
  stop.store(true);
  pusher.join();
  ASSERT_EQ(json.exit_code, 0) << json.output;
  ASSERT_OK_AND_ASSIGN(psctl::ClusterStatus s, ParseStatus(json.output));
  EXPECT_EQ(s.scheduler_health(), "SERVING");
  EXPECT_GE(s.interval_seconds(), 0.7);
  ASSERT_EQ(s.servers_size(), 2);
  for (const psctl::ServerStatus& srv : s.servers()) {
    EXPECT_EQ(srv.state(), "ALIVE");
    EXPECT_EQ(srv.health(), "SERVING");
    EXPECT_TRUE(srv.error().empty()) << srv.error();
    // Each server got one push per round (one range each) and forwards it.
    EXPECT_GT(srv.push_rate(), 0) << srv.name();
    EXPECT_GT(srv.bytes_in_rate(), 0) << srv.name();
    EXPECT_EQ(srv.pull_rate(), 0) << srv.name();
    EXPECT_GT(srv.stats().requests_by_op().at("PUSH"), 0u);
    EXPECT_GT(srv.stats().replication_forwarded(), 0u);
  }
  ASSERT_EQ(s.tables_size(), 1);
  EXPECT_EQ(s.tables(0).spec().name(), "w");
  EXPECT_EQ(s.tables(0).ranges(), 2u);
  EXPECT_EQ(s.tables(0).backups(), 2u);
  EXPECT_EQ(s.tables(0).rows(), 2000u);  // both servers hold both ranges
  EXPECT_EQ(s.tables(0).ranges_lost(), 0u);
  EXPECT_EQ(s.job().job().consistency(), proto::ASP);
  EXPECT_EQ(s.job().job().num_workers(), 2u);
  EXPECT_EQ(s.map().tables(0).ranges_size(), 2);

  PsctlRun human = Psctl({"status", scheduler, "--interval_ms=0"});
  ASSERT_EQ(human.exit_code, 0) << human.output;
  EXPECT_TRUE(absl::StrContains(human.output, "job asp  workers 2 + 0 backup"))
      << human.output;
  EXPECT_TRUE(absl::StrContains(human.output, "server-1  ALIVE  SERVING"))
      << human.output;
  EXPECT_TRUE(absl::StrContains(human.output, "w      [0, 500)"))
      << human.output;

  PsctlRun tables = Psctl({"tables", scheduler});
  ASSERT_EQ(tables.exit_code, 0) << tables.output;
  EXPECT_TRUE(absl::StrContains(tables.output, "TABLE")) << tables.output;
  EXPECT_TRUE(absl::StrContains(tables.output, "DENSE  4      1000"))
      << tables.output;

  // A dead server: reported, not an error; its range failed over. psctl
  // lists servers in the map's order (registration), not by name.
  cluster->server(1).Signal(SIGKILL);
  ASSERT_OK(cluster->server(1).Wait(absl::Seconds(10)).status());
  psctl::ClusterStatus after;
  const psctl::ServerStatus* dead = nullptr;
  const psctl::ServerStatus* live = nullptr;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    PsctlRun r = Psctl({"status", scheduler, "--json", "--interval_ms=0"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_OK_AND_ASSIGN(after, ParseStatus(r.output));
    ASSERT_EQ(after.servers_size(), 2);
    dead = live = nullptr;
    for (const psctl::ServerStatus& srv : after.servers()) {
      (srv.name() == "server-1" ? dead : live) = &srv;
    }
    ASSERT_NE(dead, nullptr);
    ASSERT_NE(live, nullptr);
    if (dead->state() == "DEAD") break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(dead->state(), "DEAD");
  EXPECT_EQ(dead->health(), "UNREACHABLE");
  EXPECT_FALSE(dead->error().empty());
  EXPECT_EQ(live->name(), "server-0");
  EXPECT_EQ(live->state(), "ALIVE");
  EXPECT_EQ(live->health(), "SERVING");
  EXPECT_EQ(after.tables(0).ranges_unavailable(), 0u);
  EXPECT_EQ(after.tables(0).backups(), 0u);
  client.reset();
  (void)cluster->Stop();
}

TEST(PsctlTest, LocalClusterRunsAJobStartedByPsctl) {
  const std::string dir = TestTmpDir() + "/local";
  const std::string address_file = dir + "/scheduler.address";
  std::system(("mkdir -p " + dir).c_str());
  Subprocess local(
      {RunfilePath("psctl/psctl"), "local", "--listen=127.0.0.1:0",
       "--servers=1", "--num_workers=2", "--consistency=bsp", "--metrics",
       "--work_dir=" + dir, "--address_file=" + address_file},
      dir + "/psctl-local.log");
  ASSERT_OK(local.Start());
  ASSERT_OK_AND_ASSIGN(
      std::string address,
      WaitForAddressFile(address_file, absl::Seconds(60), &local));
  const std::string scheduler = "--scheduler=" + address;

  PsctlRun job =
      Psctl({"job", scheduler, "--work_dir=" + dir + "/job",
             "--worker_flags=--model=softmax,--steps=30,--eval_every=30"},
            absl::Seconds(180));
  ASSERT_EQ(job.exit_code, 0) << job.output;
  EXPECT_TRUE(absl::StrContains(job.output, "job (train): 2 workers"))
      << job.output;
  EXPECT_TRUE(absl::StrContains(job.output, "job done")) << job.output;

  PsctlRun status = Psctl({"status", scheduler, "--json", "--interval_ms=0"});
  ASSERT_EQ(status.exit_code, 0) << status.output;
  ASSERT_OK_AND_ASSIGN(psctl::ClusterStatus s, ParseStatus(status.output));
  EXPECT_EQ(s.job().gating_clock(), 30);
  ASSERT_EQ(s.job().workers_size(), 2);
  EXPECT_EQ(s.job().workers(0).clock(), 30);
  EXPECT_GT(s.job().workers(0).test_accuracy(), 0.5);
  ASSERT_EQ(s.servers_size(), 1);
  EXPECT_GT(s.servers(0).stats().requests_by_op().at("PUSH_PULL"), 0u);

  // Ctrl-C: psctl local stops its daemons and exits 0.
  local.Signal(SIGINT);
  auto st = local.Wait(absl::Seconds(30));
  ASSERT_OK(st);
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << local.LogTail();
  PsctlRun gone = Psctl({"status", scheduler, "--rpc_timeout_ms=500"});
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
}

TEST(PsctlTest, HonoursTheClusterSecret) {
  const std::string dir = TestTmpDir() + "/auth";
  std::system(("mkdir -p " + dir).c_str());
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = dir;
  o.num_servers = 1;
  o.cluster_secret_file = WriteSecret(dir + "/cluster.secret");
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string scheduler = "--scheduler=" + cluster->scheduler_address();

  PsctlRun without = Psctl({"status", scheduler});
  EXPECT_EQ(without.exit_code, 1) << without.output;
  EXPECT_TRUE(absl::StrContains(without.output, "UNAUTHENTICATED"))
      << without.output;

  PsctlRun with = Psctl({"status", scheduler, "--json", "--interval_ms=200",
                         "--cluster_secret_file=" + o.cluster_secret_file});
  ASSERT_EQ(with.exit_code, 0) << with.output;
  ASSERT_OK_AND_ASSIGN(psctl::ClusterStatus s, ParseStatus(with.output));
  ASSERT_EQ(s.servers_size(), 1);
  // The servers' admin service took the token too.
  EXPECT_TRUE(s.servers(0).error().empty()) << s.servers(0).error();
  EXPECT_EQ(s.servers(0).stats().node_id(), s.servers(0).node_id());
  EXPECT_OK(cluster->Stop());
}

// -o json|yaml|wide on every command with one JSON style (the .proto's
// snake_case names, zero values present), psctl version, and the
// scheduler's address from $DOWNPOUR_SCHEDULER when --scheduler is not
// given.
TEST(PsctlTest, OutputFormatsVersionAndTheSchedulerFromTheEnvironment) {
  PsctlRun v = Psctl({"version"});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  EXPECT_EQ(v.output, absl::StrCat("psctl ", kVersion, "\n"));
  PsctlRun vj = Psctl({"version", "-o", "json"});
  EXPECT_EQ(vj.exit_code, 0) << vj.output;
  EXPECT_TRUE(absl::StrContains(
      vj.output, absl::StrCat("\"version\": \"", kVersion, "\"")))
      << vj.output;
  PsctlRun vy = Psctl({"version", "-o=yaml"});
  EXPECT_EQ(vy.output, absl::StrCat("version: \"", kVersion, "\"\n"));
  PsctlRun bad = Psctl({"version", "-o", "xml"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, "json, yaml or wide"))
      << bad.output;

  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/formats";
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = 1;
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string address = cluster->scheduler_address();
  ASSERT_EQ(setenv("DOWNPOUR_SCHEDULER", address.c_str(), 1), 0);
  PsctlRun yaml = Psctl({"status", "-o", "yaml", "--interval_ms=0"});
  PsctlRun wide = Psctl({"status", "-o", "wide", "--interval_ms=0"});
  PsctlRun tables = Psctl({"tables", "-o", "json"});
  // Zero values present: an empty list is printed, not left out.
  PsctlRun checkpoints = Psctl({"checkpoints", "-o", "json"});
  PsctlRun checkpoints_yaml = Psctl({"checkpoints", "-o", "yaml"});
  unsetenv("DOWNPOUR_SCHEDULER");
  EXPECT_EQ(yaml.exit_code, 0) << yaml.output;
  EXPECT_TRUE(absl::StrContains(yaml.output,
                                absl::StrCat("scheduler: \"", address, "\"\n")))
      << yaml.output;
  EXPECT_TRUE(absl::StrContains(yaml.output, "\nservers:\n- node_id: \""))
      << yaml.output;
  EXPECT_TRUE(absl::StrContains(yaml.output, "  memory_limit_bytes: \""))
      << yaml.output;
  EXPECT_EQ(wide.exit_code, 0) << wide.output;
  EXPECT_TRUE(absl::StrContains(wide.output, "INCARNATION")) << wide.output;
  EXPECT_EQ(tables.exit_code, 0) << tables.output;
  // Sampled twice (each range's load is a rate); every range listed.
  EXPECT_TRUE(absl::StrContains(tables.output, "\"interval_seconds\": "))
      << tables.output;
  EXPECT_TRUE(absl::StrContains(tables.output, "\"ranges\": ["))
      << tables.output;
  EXPECT_EQ(checkpoints.exit_code, 0) << checkpoints.output;
  EXPECT_TRUE(absl::StrContains(checkpoints.output, "\"checkpoints\": []"))
      << checkpoints.output;
  EXPECT_EQ(checkpoints_yaml.output, "checkpoints: []\n");
  ASSERT_OK(cluster->Stop());
}

// psctl drain: the server's ranges move to the others while writes go on
// (status shows the drain and the moves, tables each range's holders and
// load), then it leaves (LEFT) and exits 0; usage and refusals.
TEST(PsctlTest, DrainMovesAServersRangesAwayAndItLeaves) {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestOutputDir() + "/drain";  // its logs kept
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = 3;
  o.scheduler_flags = {"--ranges_per_table=3", "--max_range_moves=1"};
  // Copies do not end before this file exists: the drain is seen under way
  // (psctl status, a refused second drain) for as long as starting psctl
  // takes. A fixed delay of 4 s did not outlast it under ASan with four
  // tests at once.
  const std::string copies_may_go = o.work_dir + "/copies-may-go";
  o.server_flags = {"--inject_copy_gate=" + copies_may_go};
  ASSERT_OK_AND_ASSIGN(auto cluster, LocalCluster::Start(o));
  const std::string scheduler = "--scheduler=" + cluster->scheduler_address();
  ASSERT_OK_AND_ASSIGN(
      auto client,
      Client::Connect({.scheduler_address = cluster->scheduler_address()}));
  TableOptions t;
  t.name = "w";
  t.width = 2;
  t.num_keys = 900;
  t.handler = "sum";
  ASSERT_OK_AND_ASSIGN(Table table, client->CreateTable(t));
  std::atomic<bool> stop{false};
  std::atomic<int> adds{0};
  std::thread writer([&] {
    std::vector<float> ones(1800, 1.0f);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!stop.load() && absl::Now() < deadline) {
      ASSERT_OK(client->AddSync(table, Keys::Range(0, 900), ones));
      ++adds;
    }
  });

  PsctlRun tables = Psctl({"tables", scheduler, "--json", "--interval_ms=500"});
  ASSERT_EQ(tables.exit_code, 0) << tables.output;
  ASSERT_OK_AND_ASSIGN(psctl::ClusterStatus ts, ParseStatus(tables.output));
  ASSERT_EQ(ts.ranges_size(), 3);
  for (const psctl::RangeStatus& r : ts.ranges()) {
    EXPECT_EQ(r.table(), "w");
    EXPECT_NE(r.primary(), 0u);
    EXPECT_EQ(r.rows(), 300u);
    EXPECT_EQ(r.bytes(), 300u * 2 * 4);
    EXPECT_GT(r.request_rate(), 0) << r.begin();
    EXPECT_GT(r.key_rate(), r.request_rate()) << r.begin();
  }
  PsctlRun human_tables = Psctl({"tables", scheduler, "--interval_ms=300"});
  EXPECT_TRUE(absl::StrContains(human_tables.output, "KEYS/s"))
      << human_tables.output;

  // Asked of the scheduler directly, so that psctl status sees it under way.
  SchedulerClient sched(cluster->scheduler_address());
  proto::DrainRequest req;
  req.set_name("server-1");
  ASSERT_OK(sched.Drain(req).status());
  PsctlRun during = Psctl({"status", scheduler, "--interval_ms=0"});
  EXPECT_TRUE(absl::StrContains(during.output, "ALIVE,DRAINING"))
      << during.output;
  EXPECT_TRUE(absl::StrContains(during.output, "moving=")) << during.output;
  EXPECT_TRUE(absl::StrContains(during.output, "draining: server-1"))
      << during.output;
  // A second drain while this one runs is refused.
  PsctlRun second = Psctl({"drain", "server-2", scheduler});
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, "one drain runs at a time"))
      << second.output;

  std::ofstream(copies_may_go) << "go\n";
  PsctlRun drain = Psctl({"drain", "server-1", scheduler, "--timeout_s=60"});
  // The logs' tails say why, should it fail (the test log is all CI shows).
  EXPECT_EQ(drain.exit_code, 0)
      << drain.output << "\nscheduler:\n"
      << cluster->scheduler().LogTail() << "\nserver-1:\n"
      << cluster->server(1).LogTail();
  EXPECT_TRUE(absl::StrContains(drain.output, "server-1: drained and left"))
      << drain.output;
  auto exit = cluster->server(1).Wait(absl::Seconds(30));
  ASSERT_OK(exit);
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
  const int before = adds.load();
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (adds.load() < before + 20 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  stop.store(true);
  writer.join();
  // Every add landed once on every row.
  std::vector<float> got(1800);
  ASSERT_OK(client->GetSync(table, Keys::Range(0, 900), absl::MakeSpan(got)));
  for (float v : got) ASSERT_EQ(v, static_cast<float>(adds.load()));

  PsctlRun after = Psctl({"status", scheduler, "--json", "--interval_ms=0"});
  ASSERT_OK_AND_ASSIGN(psctl::ClusterStatus s, ParseStatus(after.output));
  for (const psctl::ServerStatus& srv : s.servers()) {
    if (srv.name() == "server-1") {
      EXPECT_EQ(srv.state(), "LEFT");
    }
  }
  EXPECT_EQ(s.moves_under_way(), 0u);

  PsctlRun no_name = Psctl({"drain", scheduler});
  EXPECT_EQ(no_name.exit_code, 2) << no_name.output;
  PsctlRun two = Psctl({"drain", "server-0", "server-2", scheduler});
  EXPECT_EQ(two.exit_code, 2) << two.output;
  PsctlRun unknown = Psctl({"drain", "server-9", scheduler});
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "NOT_FOUND")) << unknown.output;
  client.reset();
  ASSERT_OK(cluster->Stop());
}

// psctl split and psctl merge: a range cut in two and joined again by
// hand, each waited for until the map shows it; a merge of the last range
// and a merge without a key are refused.
TEST(PsctlTest, SplitAndMergeByHand) {
  ASSERT_OK_AND_ASSIGN(
      LiveCluster live,
      StartLive("split_merge", 2,
                {"--replicas=2", "--num_workers=1", "--consistency=asp",
                 "--ranges_per_table=2", "--merge_min_age_s=0"},
                2));
  std::unique_ptr<Client>& client = live.client;
  const Table table = live.table;
  const std::string scheduler = live.scheduler;
  auto ranges = [&]() -> std::vector<std::pair<uint64_t, uint64_t>> {
    PsctlRun r = Psctl({"tables", scheduler, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    absl::StatusOr<psctl::ClusterStatus> s = ParseStatus(r.output);
    EXPECT_OK(s.status());
    std::vector<std::pair<uint64_t, uint64_t>> out;
    if (!s.ok()) return out;
    for (const psctl::RangeStatus& rs : s->ranges()) {
      out.emplace_back(rs.begin(), rs.end());
    }
    return out;
  };
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  ASSERT_EQ(ranges(), (Ranges{{0, 500}, {500, 1000}}));

  PsctlRun merge = Psctl({"merge", "w", "10", scheduler});
  ASSERT_EQ(merge.exit_code, 0) << merge.output;
  EXPECT_TRUE(absl::StrContains(merge.output,
                                "table 'w' keys [0, 1000): merged at key 500"))
      << merge.output;
  EXPECT_EQ(ranges(), (Ranges{{0, 1000}}));
  PsctlRun split = Psctl({"split", "w", "300", scheduler});
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_TRUE(absl::StrContains(split.output, "split at key 300"))
      << split.output;
  EXPECT_EQ(ranges(), (Ranges{{0, 300}, {300, 1000}}));

  PsctlRun last = Psctl({"merge", "w", "999", scheduler});
  EXPECT_EQ(last.exit_code, 1) << last.output;
  EXPECT_TRUE(absl::StrContains(last.output, "last range")) << last.output;
  PsctlRun no_key = Psctl({"merge", "w", scheduler});
  EXPECT_EQ(no_key.exit_code, 2) << no_key.output;
  // The values went through both changes: what was put is read back.
  std::vector<float> put(2000);
  for (size_t i = 0; i < put.size(); ++i) put[i] = static_cast<float>(i);
  ASSERT_OK(client->Wait(client->Put(table, Keys::Range(0, 1000), put)));
  PsctlRun again = Psctl({"merge", "w", "0", scheduler});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  std::vector<float> got(2000);
  ASSERT_OK(client->Wait(
      client->Pull(table, Keys::Range(0, 1000), absl::MakeSpan(got))));
  EXPECT_EQ(got, put);
}

TEST(PsctlTest, BadUsageAndUnreachableScheduler) {
  PsctlRun none = Psctl({});
  EXPECT_EQ(none.exit_code, 2) << none.output;
  PsctlRun unknown = Psctl({"frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "unknown command 'frobnicate'"))
      << unknown.output;
  PsctlRun kind = Psctl({"job", "--kind=eval"});
  EXPECT_EQ(kind.exit_code, 2) << kind.output;
  // Port 1 on loopback: nothing listens.
  PsctlRun unreachable =
      Psctl({"status", "--scheduler=127.0.0.1:1", "--rpc_timeout_ms=500"});
  EXPECT_EQ(unreachable.exit_code, 1) << unreachable.output;
  EXPECT_TRUE(absl::StrContains(unreachable.output, "127.0.0.1:1"))
      << unreachable.output;
}

// Two servers with data dirs and a scheduler with a state dir (checkpoints
// need both), under `TestTmpDir()/name`; a client, and the table "w" (500
// keys x 3) that the checkpoint tests fill.
struct DurableCluster {
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<Client> client;
  Table table;
  std::string sched;  // psctl's --scheduler flag
};

absl::StatusOr<DurableCluster> StartDurableCluster(const std::string& name) {
  LocalClusterOptions o;
  o.bin_dir = RunfilePath("");
  o.work_dir = TestTmpDir() + "/" + name;
  std::system(("mkdir -p " + o.work_dir).c_str());
  o.num_servers = 2;
  o.durable = true;
  o.scheduler_flags = {"--num_workers=1", "--consistency=asp"};
  DurableCluster d;
  DP_ASSIGN_OR_RETURN(d.cluster, LocalCluster::Start(o));
  d.sched = "--scheduler=" + d.cluster->scheduler_address();
  DP_ASSIGN_OR_RETURN(
      d.client,
      Client::Connect({.scheduler_address = d.cluster->scheduler_address()}));
  TableOptions t;
  t.name = "w";
  t.width = 3;
  t.num_keys = 500;
  DP_ASSIGN_OR_RETURN(d.table, d.client->CreateTable(t));
  return d;
}

// psctl checkpoint takes one (the manifest comes back), checkpoints lists
// it, and export writes the table's values to .npy, bit for bit, from the
// running cluster and from the servers' data dirs.
TEST(PsctlTest, CheckpointListAndExport) {
  ASSERT_OK_AND_ASSIGN(DurableCluster d, StartDurableCluster("durable"));
  LocalCluster* cluster = d.cluster.get();
  Client* client = d.client.get();
  const Table& table = d.table;
  const std::string& sched = d.sched;
  std::vector<float> values(500 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * i - 7.0f;
  ASSERT_OK(client->PutSync(table, Keys::Range(0, 500), values));

  EXPECT_EQ(Psctl({"checkpoints", sched}).output.find("checkpoint 1"),
            std::string::npos);
  PsctlRun taken = Psctl({"checkpoint", sched});
  ASSERT_EQ(taken.exit_code, 0) << taken.output;
  EXPECT_TRUE(absl::StrContains(taken.output, "checkpoint 1 ")) << taken.output;
  EXPECT_TRUE(absl::StrContains(taken.output, "rows 500")) << taken.output;
  PsctlRun listed = Psctl({"checkpoints", sched, "--json"});
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_TRUE(absl::StrContains(listed.output, "\"checkpoints\""))
      << listed.output;

  const std::string out = TestTmpDir() + "/w-online";
  PsctlRun online = Psctl({"export", sched, "--table=w", "--out=" + out});
  ASSERT_EQ(online.exit_code, 0) << online.output;
  ASSERT_OK_AND_ASSIGN(NpyArray a, ReadNpy(out + ".npy"));
  EXPECT_EQ(a.shape, (std::vector<uint64_t>{500, 3}));
  ASSERT_EQ(a.data.size(), values.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(a.data.data(), values.data(), a.data.size()), 0);

  // Changed after checkpoint 1: an offline export of checkpoint 1 reads its
  // values; the newest is the one the servers took on SIGTERM (Stop).
  ASSERT_OK(client->PutSync(table, Keys::Range(0, 500),
                            std::vector<float>(values.size(), 1.0f)));
  d.client.reset();  // `client` is not used below
  EXPECT_OK(cluster->Stop());
  const std::string off = TestTmpDir() + "/w-offline";
  PsctlRun offline =
      Psctl({"export",
             "--data_dirs=" + cluster->data_dir(0) + "," + cluster->data_dir(1),
             "--table=w", "--checkpoint=1", "--out=" + off});
  ASSERT_EQ(offline.exit_code, 0) << offline.output;
  ASSERT_OK_AND_ASSIGN(NpyArray b, ReadNpy(off + ".npy"));
  ASSERT_EQ(b.data.size(), a.data.size());
  EXPECT_EQ(std::memcmp(b.data.data(), values.data(), b.data.size()), 0);
  PsctlRun newest =
      Psctl({"export",
             "--data_dirs=" + cluster->data_dir(0) + "," + cluster->data_dir(1),
             "--table=w", "--out=" + off + "-newest"});
  ASSERT_EQ(newest.exit_code, 0) << newest.output;
  ASSERT_OK_AND_ASSIGN(NpyArray c, ReadNpy(off + "-newest.npy"));
  const std::vector<float> ones(values.size(), 1.0f);
  ASSERT_EQ(c.data.size(), a.data.size());
  EXPECT_EQ(std::memcmp(c.data.data(), ones.data(), c.data.size()), 0);

  // Usage and unknown tables.
  EXPECT_EQ(Psctl({"export", sched}).exit_code, 2);
  PsctlRun unknown = Psctl({"export", "--data_dirs=" + cluster->data_dir(0),
                            "--table=nope", "--out=" + off});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.output, "NOT_FOUND")) << unknown.output;
}

// An operator's rollback of a running job: every table as the checkpoint
// holds it, bit for bit; a table declared after it is gone.
TEST(PsctlTest, RestoreRollsTheJobBackToAChosenCheckpoint) {
  ASSERT_OK_AND_ASSIGN(DurableCluster d, StartDurableCluster("restore"));
  Client* client = d.client.get();
  const Table& table = d.table;
  const std::string& sched = d.sched;
  std::vector<float> first(500 * 3), second(500 * 3);
  for (size_t i = 0; i < first.size(); ++i) {
    first[i] = 0.5f * i - 3.0f;
    second[i] = -0.25f * i + 11.0f;
  }
  ASSERT_OK(client->PutSync(table, Keys::Range(0, 500), first));
  PsctlRun one = Psctl({"checkpoint", sched});
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_TRUE(absl::StrContains(one.output, "checkpoint 1 ")) << one.output;
  ASSERT_OK(client->PutSync(table, Keys::Range(0, 500), second));
  PsctlRun two = Psctl({"checkpoint", sched});
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_TRUE(absl::StrContains(two.output, "checkpoint 2 ")) << two.output;
  // After both: changed again, and a new table.
  ASSERT_OK(client->AddSync(table, Keys::Range(0, 500),
                            std::vector<float>(first.size(), 1.0f)));
  TableOptions late;
  late.name = "late";
  late.width = 3;
  late.num_keys = 500;
  ASSERT_OK(client->CreateTable(late).status());

  // Usage and unknown checkpoints change nothing.
  EXPECT_EQ(Psctl({"restore", sched}).exit_code, 2);
  PsctlRun unknown = Psctl({"restore", sched, "--checkpoint=9"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unknown.output, "NOT_FOUND")) << unknown.output;
  EXPECT_TRUE(absl::StrContains(unknown.output, "keeps 1, 2"))
      << unknown.output;
  std::vector<float> out(first.size());
  ASSERT_OK(client->GetSync(table, Keys::Range(0, 500), absl::MakeSpan(out)));
  EXPECT_EQ(out[7], second[7] + 1.0f);

  // Back to the older of the two, then to the newer.
  for (const auto& [id, want] :
       {std::pair<int, const std::vector<float>*>{1, &first}, {2, &second}}) {
    PsctlRun restored =
        Psctl({"restore", sched, absl::StrCat("--checkpoint=", id)});
    ASSERT_EQ(restored.exit_code, 0) << restored.output;
    EXPECT_TRUE(absl::StrContains(
        restored.output, absl::StrCat("restored checkpoint ", id, ":")))
        << restored.output;
    // The client follows the new map (its cached one is stale).
    absl::Status read;
    for (int attempt = 0; attempt < 50; ++attempt) {
      read = client->GetSync(table, Keys::Range(0, 500), absl::MakeSpan(out));
      if (read.ok()) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_OK(read);
    ASSERT_EQ(std::memcmp(out.data(), want->data(), out.size() * sizeof(float)),
              0)
        << "checkpoint " << id;
  }
  EXPECT_THAT(client->OpenTable("late").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace downpour
