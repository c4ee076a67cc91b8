#include "common/host_memory.h"

#include <sys/stat.h>

#include <fstream>

#include "common/test_util.h"

namespace downpour {
namespace {

class HostMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestTmpDir() + "/host_memory_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0755);
    src_.meminfo = dir_ + "/meminfo";
    src_.self_cgroup = dir_ + "/cgroup";
    src_.cgroup_root = dir_ + "/fs";
    mkdir(src_.cgroup_root.c_str(), 0755);
    Write(src_.meminfo,
          "MemTotal:       24683656 kB\nMemFree:  100 kB\n"
          "MemAvailable:   18164992 kB\nBuffers: 1 kB\n");
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  }
  std::string dir_;
  MemorySources src_;
};

TEST_F(HostMemoryTest, MemAvailableWithoutACgroupLimit) {
  ASSERT_OK_AND_ASSIGN(uint64_t bytes, AvailableMemoryBytes(src_));
  EXPECT_EQ(bytes, uint64_t{18164992} * 1024);
  // A v1 cgroup without a limit changes nothing.
  Write(src_.self_cgroup, "4:memory:/pod\n0::/\n");
  mkdir((src_.cgroup_root + "/memory").c_str(), 0755);
  mkdir((src_.cgroup_root + "/memory/pod").c_str(), 0755);
  Write(src_.cgroup_root + "/memory/pod/memory.limit_in_bytes",
        "9223372036854771712\n");
  ASSERT_OK_AND_ASSIGN(bytes, AvailableMemoryBytes(src_));
  EXPECT_EQ(bytes, uint64_t{18164992} * 1024);
}

TEST_F(HostMemoryTest, ACgroupLimitBelowTheMachinesMemoryWins) {
  Write(src_.self_cgroup, "0::/kubepods/pod1\n");
  mkdir((src_.cgroup_root + "/kubepods").c_str(), 0755);
  mkdir((src_.cgroup_root + "/kubepods/pod1").c_str(), 0755);
  Write(src_.cgroup_root + "/kubepods/pod1/memory.max", "2147483648\n");
  Write(src_.cgroup_root + "/kubepods/pod1/memory.current", "536870912\n");
  ASSERT_OK_AND_ASSIGN(uint64_t bytes, AvailableMemoryBytes(src_));
  EXPECT_EQ(bytes, uint64_t{1536} << 20);
  Write(src_.cgroup_root + "/kubepods/pod1/memory.max", "max\n");
  ASSERT_OK_AND_ASSIGN(bytes, AvailableMemoryBytes(src_));
  EXPECT_EQ(bytes, uint64_t{18164992} * 1024);
}

TEST_F(HostMemoryTest, UnreadableOrMalformedMeminfo) {
  MemorySources missing = src_;
  missing.meminfo = dir_ + "/nope";
  EXPECT_THAT(AvailableMemoryBytes(missing),
              StatusIs(absl::StatusCode::kNotFound));
  Write(src_.meminfo, "MemTotal: 5 kB\n");
  EXPECT_THAT(AvailableMemoryBytes(src_),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(HostMemoryRealTest, ThisMachineHasSomeMemory) {
  ASSERT_OK_AND_ASSIGN(uint64_t bytes, AvailableMemoryBytes());
  EXPECT_GT(bytes, uint64_t{16} << 20);
}

}  // namespace
}  // namespace downpour
