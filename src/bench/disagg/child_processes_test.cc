#include "bench/disagg/child_processes.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "bench/disagg/host_info.h"
#include "core/clock.h"

namespace crescent::bench {
namespace {

class ChildProcessesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("crescent-child-processes-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  [[nodiscard]] std::string log(const std::string& name) const { return (dir_ / name).string(); }

  // Polls until the child ended; false after 10 s.
  static bool wait_exit(ChildProcesses& c, int i) {
    Deadline deadline = Deadline::after_ms(10'000);
    while (c.is_running(i)) {
      if (deadline.is_expired()) {
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }

  std::filesystem::path dir_;
};

TEST_F(ChildProcessesTest, OutputGoesToTheLogAndTheExitCodeIsKept) {
  ChildProcesses c;
  auto i = c.start("shell", "/bin/sh", {"-c", "echo to-stdout; echo to-stderr >&2; exit 3"},
                   log("a.log"));
  ASSERT_TRUE(i.is_ok()) << i.status().to_string();
  ASSERT_TRUE(wait_exit(c, *i));
  EXPECT_EQ(c.describe_exit(*i), "exit code 3");
  EXPECT_EQ(c.pid(*i), -1);
  std::string text = read_text_file(c.log_path(*i));
  EXPECT_NE(text.find("to-stdout"), std::string::npos) << text;
  EXPECT_NE(text.find("to-stderr"), std::string::npos) << text;
}

TEST_F(ChildProcessesTest, AMissingBinaryExitsWith127) {
  ChildProcesses c;
  auto i = c.start("ghost", (dir_ / "no-such-binary").string(), {}, log("b.log"));
  ASSERT_TRUE(i.is_ok());
  ASSERT_TRUE(wait_exit(c, *i));
  EXPECT_EQ(c.describe_exit(*i), "exit code 127");
}

TEST_F(ChildProcessesTest, AnUnwritableLogIsAnError) {
  ChildProcesses c;
  auto i = c.start("shell", "/bin/sh", {"-c", "exit 0"}, (dir_ / "no-dir" / "c.log").string());
  ASSERT_FALSE(i.is_ok());
  EXPECT_NE(i.status().message().find("cannot open"), std::string::npos);
}

TEST_F(ChildProcessesTest, StopAllTermsThenKillsWhatIgnoresTerm) {
  ChildProcesses c;
  auto polite = c.start("polite", "/bin/sleep", {"30"}, log("d.log"));
  // Ignores SIGTERM: only the SIGKILL after the grace period ends it.
  auto stubborn =
      c.start("stubborn", "/bin/sh",
              {"-c", "trap '' TERM; echo armed; while :; do sleep 0.05; done"}, log("e.log"));
  ASSERT_TRUE(polite.is_ok() && stubborn.is_ok());
  Deadline armed = Deadline::after_ms(10'000);
  while (read_text_file(log("e.log")).find("armed") == std::string::npos) {
    ASSERT_FALSE(armed.is_expired());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  TimePoint t0 = Clock::now();
  c.stop_all(std::chrono::milliseconds(300));
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_FALSE(c.is_running(*polite));
  EXPECT_FALSE(c.is_running(*stubborn));
  EXPECT_EQ(c.describe_exit(*polite), "killed by signal 15");
  EXPECT_EQ(c.describe_exit(*stubborn), "killed by signal 9");
  EXPECT_GE(s, 0.25);
  EXPECT_LT(s, 5.0);
}

TEST_F(ChildProcessesTest, TheWatcherStopsTheChildrenOnSigterm) {
  ChildProcesses c;
  auto i = c.start("sleeper", "/bin/sleep", {"30"}, log("f.log"));
  ASSERT_TRUE(i.is_ok());
  {
    InterruptWatcher watcher(&c);
    EXPECT_FALSE(watcher.is_interrupted());
    Deadline deadline = Deadline::after_ms(10'000);
    while (watcher.thread_id() == 0 && !deadline.is_expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // To the watcher's thread alone: another thread of this test binary (a transport's, from
    // an earlier test in the same process) may leave SIGTERM open, and would die of it.
    ASSERT_EQ(::syscall(SYS_tgkill, ::getpid(), watcher.thread_id(), SIGTERM), 0);
    while (!watcher.is_interrupted() && !deadline.is_expired()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(watcher.is_interrupted());
    ASSERT_TRUE(wait_exit(c, *i));
  }
  EXPECT_EQ(c.describe_exit(*i), "killed by signal 15");
}

TEST(HostInfoTest, TailLinesKeepsTheLastLines) {
  EXPECT_EQ(tail_lines("a\nb\nc\n", 2), "b\nc\n");
  EXPECT_EQ(tail_lines("a\nb\nc", 2), "b\nc");
  EXPECT_EQ(tail_lines("a\nb", 5), "a\nb");
  EXPECT_EQ(tail_lines("", 3), "");
  EXPECT_EQ(tail_lines("a\nb\n", 0), "");
}

TEST(HostInfoTest, ReadsThisProcess) {
  EXPECT_GE(num_usable_cores(), 1);
  EXPECT_GE(minor_page_faults(::getpid()), 0);
  EXPECT_EQ(minor_page_faults(-5), -1);
  std::string load = load_average();
  EXPECT_EQ(std::count(load.begin(), load.end(), ' '), 2) << load;
}

}  // namespace
}  // namespace crescent::bench
