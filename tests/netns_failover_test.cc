// Failover across real network interfaces: every daemon runs in a network
// namespace of its own, joined to a bridge by a veth pair with an address
// of its own, so that traffic crosses real (virtual) links. During BSP
// training with --replicas=2, one server's link is taken down: no
// connection reset crosses a downed link, so the scheduler learns of it by
// missed heartbeats, fails the server's ranges over, and the job goes on.
// When the link comes back the server (the same process, cut off) rejoins
// and becomes a backup of ranges that lack one, catching up by a copy.
//
// Creating namespaces needs root (CAP_NET_ADMIN) and iproute2; without them
// the test says why and skips.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "cluster/scheduler_client.h"
#include "common/subprocess.h"
#include "common/test_util.h"
#include "models/dataset.h"
#include "models/model.h"

namespace downpour {
namespace {

constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

int Run(const std::string& cmd) {
  return std::system((cmd + " >/dev/null 2>&1").c_str());
}

// A bridge and `hosts` namespaces, host i at 10.213.<net>.<i + 2>; the
// test's own namespace is on the bridge at .1. Removed on destruction.
class Hosts {
 public:
  static absl::StatusOr<std::unique_ptr<Hosts>> Create(int hosts) {
    if (geteuid() != 0) return absl::PermissionDeniedError("not root");
    if (Run("ip -V") != 0) return absl::UnavailableError("no iproute2 (ip)");
    const int id = getpid() % 10000;
    auto h = std::unique_ptr<Hosts>(
        new Hosts(absl::StrCat("dpn", id), hosts, getpid() % 200 + 20));
    h->Cleanup();
    const std::string br = h->prefix_ + "b";
    std::vector<std::string> cmds = {
        absl::StrCat("ip link add ", br, " type bridge"),
        absl::StrCat("ip addr add ", h->Address(-1), "/24 dev ", br),
        absl::StrCat("ip link set ", br, " up")};
    for (int i = 0; i < hosts; ++i) {
      const std::string ns = h->Namespace(i);
      const std::string v = h->HostSide(i),
                        p = absl::StrCat(h->prefix_, "p", i);
      cmds.push_back("ip netns add " + ns);
      cmds.push_back(
          absl::StrCat("ip link add ", v, " type veth peer name ", p));
      cmds.push_back(absl::StrCat("ip link set ", p, " netns ", ns));
      cmds.push_back(absl::StrCat("ip link set ", v, " master ", br));
      cmds.push_back(absl::StrCat("ip link set ", v, " up"));
      cmds.push_back(absl::StrCat("ip netns exec ", ns, " ip addr add ",
                                  h->Address(i), "/24 dev ", p));
      cmds.push_back(
          absl::StrCat("ip netns exec ", ns, " ip link set ", p, " up"));
      cmds.push_back(absl::StrCat("ip netns exec ", ns, " ip link set lo up"));
    }
    for (const std::string& c : cmds) {
      if (Run(c) != 0) {
        return absl::UnavailableError(absl::StrCat("'", c, "' failed"));
      }
    }
    return h;
  }
  ~Hosts() { Cleanup(); }

  // -1: the test's side of the bridge.
  std::string Address(int i) const {
    return absl::StrCat("10.213.", net_, ".", i + 2);
  }
  std::string Namespace(int i) const { return absl::StrCat(prefix_, "n", i); }
  // Takes host i's link down (or up) on the bridge's side.
  void SetLink(int i, bool up) {
    EXPECT_EQ(
        Run(absl::StrCat("ip link set ", HostSide(i), up ? " up" : " down")),
        0);
  }
  // argv to run `argv` inside host i.
  std::vector<std::string> In(int i, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", Namespace(i)});
    if (access(argv[0].c_str(), X_OK) != 0) argv[0] = "/sbin/ip";
    if (access(argv[0].c_str(), X_OK) != 0) argv[0] = "/bin/ip";
    return argv;
  }

 private:
  Hosts(std::string prefix, int hosts, int net)
      : prefix_(std::move(prefix)), hosts_(hosts), net_(net) {}
  std::string HostSide(int i) const { return absl::StrCat(prefix_, "v", i); }
  void Cleanup() {
    for (int i = 0; i < hosts_; ++i) {
      Run("ip netns del " + Namespace(i));
      Run("ip link del " + HostSide(i));
    }
    Run("ip link del " + prefix_ + "b");
  }
  const std::string prefix_;
  const int hosts_;
  const int net_;
};

TEST(NetnsFailoverTest, ALinkDownFailsOverAndTheServerRejoinsAsABackup) {
  auto hosts_or = Hosts::Create(4);
  if (!hosts_or.ok()) {
    GTEST_SKIP() << "cannot create network namespaces here ("
                 << hosts_or.status() << "); this test needs root and iproute2";
  }
  Hosts& hosts = **hosts_or;
  const std::string dir = TestTmpDir() + "/netns";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  // Host 0: the scheduler; 1-2: servers; 3: both workers.
  const std::string scheduler = hosts.Address(0) + ":7070";
  std::vector<std::unique_ptr<Subprocess>> daemons;
  auto start = [&](int host, std::vector<std::string> argv,
                   const std::string& log) {
    daemons.push_back(std::make_unique<Subprocess>(hosts.In(host, argv),
                                                   dir + "/" + log + ".log"));
    EXPECT_OK(daemons.back()->Start());
    return daemons.back().get();
  };
  start(0,
        {RunfilePath("scheduler/ps_scheduler"), "--listen=" + scheduler,
         "--replicas=2", "--consistency=bsp", "--num_workers=2",
         "--min_servers=2"},
        "scheduler");
  for (int s = 1; s <= 2; ++s) {
    start(s,
          {RunfilePath("server/ps_server"), "--scheduler=" + scheduler,
           absl::StrCat("--name=server-", s),
           absl::StrCat("--data_listen=tcp://", hosts.Address(s), ":7100"),
           absl::StrCat("--admin_listen=", hosts.Address(s), ":7101")},
          absl::StrCat("server-", s));
  }
  constexpr int kSteps = 2500;
  std::vector<Subprocess*> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(
        start(3,
              {RunfilePath("worker/ps_worker"), "--scheduler=" + scheduler,
               absl::StrCat("--name=w", w), "--model=softmax",
               absl::StrCat("--steps=", kSteps), "--batch=32", "--seed=3",
               "--eval_every=100000", "--lr=0.05", "--warmup_steps=5"},
              absl::StrCat("worker-", w)));
  }
  SchedulerClient sched(scheduler, absl::Seconds(5));
  // Once training is under way, cut the primary of the first range off.
  NodeId victim = kNoNode;
  int victim_host = -1;
  absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline && victim == kNoNode) {
    auto status = sched.GetJobStatus();
    auto map = sched.GetClusterMap();
    if (status.ok() && map.ok() && status->gating_clock() >= kSteps / 5 &&
        map->tables_size() > 0) {
      victim = map->tables(0).ranges(0).primary();
      for (const auto& n : map->nodes()) {
        if (n.id() == victim) victim_host = std::stoi(n.name().substr(7));
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_NE(victim, kNoNode) << "training did not get going";
  const absl::Time down = absl::Now();
  hosts.SetLink(victim_host, false);
  std::cout << "took server-" << victim_host << "'s link down" << std::endl;
  // The scheduler declares it dead by missed heartbeats (dead_after, 3 s).
  bool dead = false;
  deadline = absl::Now() + absl::Seconds(30);
  while (!dead && absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    if (map.ok()) {
      for (const auto& n : map->nodes()) {
        dead |= n.id() == victim && n.state() == proto::DEAD;
      }
      if (dead) {
        EXPECT_NE(map->tables(0).ranges(0).primary(), victim);
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(dead) << "not declared dead";
  std::cout << "declared dead after "
            << absl::ToDoubleMilliseconds(absl::Now() - down) << " ms"
            << std::endl;
  absl::SleepFor(absl::Seconds(1));
  hosts.SetLink(victim_host, true);
  // The same process comes back and is given ranges to back up.
  bool backup = false;
  deadline = absl::Now() + absl::Seconds(60);
  while (!backup && absl::Now() < deadline) {
    auto map = sched.GetClusterMap();
    if (map.ok()) {
      bool alive = false;
      for (const auto& n : map->nodes()) {
        alive |= n.id() == victim && n.state() == proto::ALIVE;
      }
      for (const auto& t : map->tables()) {
        for (const auto& r : t.ranges()) {
          for (NodeId b : r.replicas()) backup |= alive && b == victim;
          EXPECT_FALSE(r.lost());
        }
      }
    }
    if (!backup) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(backup) << "server-" << victim_host
                      << " did not rejoin as an in-sync backup";
  std::cout << "server-" << victim_host << " is an in-sync backup again"
            << std::endl;
  for (Subprocess* w : workers) {
    auto st = w->Wait(absl::Seconds(300));
    ASSERT_OK(st);
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << w->LogTail();
  }
  // The model trained through it.
  ClientOptions co;
  co.scheduler_address = scheduler;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(co));
  auto model = MakeSoftmaxRegression(784, 10);
  std::vector<float> params;
  for (const ParamBlock& b : model->Blocks()) {
    ASSERT_OK_AND_ASSIGN(Table t, client->OpenTable("softmax/" + b.name));
    std::vector<float> v(b.rows * b.width);
    ASSERT_OK(client->GetSync(t, Keys::Range(0, b.rows), absl::MakeSpan(v)));
    params.insert(params.end(), v.begin(), v.end());
  }
  client.reset();
  ASSERT_OK_AND_ASSIGN(Dataset test, LoadFashionMnist(kData, false));
  const double accuracy = model->Evaluate(params.data(), test).first;
  std::cout << "test accuracy " << accuracy << std::endl;
  EXPECT_GT(accuracy, 0.75);
  for (auto& d : daemons) {
    if (!d->running()) continue;
    d->Signal(SIGTERM);
    auto st = d->Wait(absl::Seconds(15));
    EXPECT_OK(st);
    if (st.ok()) {
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << d->LogTail();
    }
  }
}

}  // namespace
}  // namespace downpour
