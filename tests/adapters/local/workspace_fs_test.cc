#include "adapters/local/workspace_fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

std::string Slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class WorkspaceFsTest : public ::testing::Test {
 protected:
  WorkspaceFsTest() : ws_(dir_.path() + "/ws"), fs_(ws_, "/workspace", -1, -1, 1024) {
    mkdir(ws_.c_str(), 0700);
    std::ofstream(dir_.path() + "/secret.txt") << "host secret";
  }
  TempDir dir_;
  std::string ws_;
  WorkspaceFs fs_;
};

TEST_F(WorkspaceFsTest, ResolvesRelativeAndMountPointPaths) {
  EXPECT_EQ(*fs_.Resolve("a/b.txt"), (std::vector<std::string>{"a", "b.txt"}));
  EXPECT_EQ(*fs_.Resolve("./a//b/../c"), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(*fs_.Resolve("/workspace/x"), (std::vector<std::string>{"x"}));
}

TEST_F(WorkspaceFsTest, RefusesPathsThatEscapeOrAreMalformed) {
  EXPECT_EQ(fs_.Resolve("../secret.txt").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Resolve("a/../../x").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Resolve("/etc/passwd").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Resolve("/workspacex/a").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Resolve("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.Resolve(".").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.Resolve(std::string("a\0b", 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.Resolve(std::string(300, 'x')).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkspaceFsTest, WritesCreateParentsAndReadsReturnExactBytes) {
  const std::string binary("\0\xFF\x01zz\n", 6);
  ASSERT_TRUE(fs_.Write("deep/er/f.bin", binary).ok());
  EXPECT_EQ(**fs_.Read("deep/er/f.bin"), binary);
  ASSERT_TRUE(fs_.Write("deep/er/f.bin", "short").ok());  // replaces, truncates
  EXPECT_EQ(**fs_.Read("/workspace/deep/er/f.bin"), "short");
  ASSERT_TRUE(fs_.Write("empty", "").ok());
  EXPECT_EQ(**fs_.Read("empty"), "");
}

TEST_F(WorkspaceFsTest, MissingFileIsNotAnError) {
  auto r = fs_.Read("nope.txt");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(fs_.Read("no/such/dir/f").value().has_value());
}

TEST_F(WorkspaceFsTest, SymlinksPlantedInTheWorkspaceAreRefused) {
  ASSERT_EQ(symlink((dir_.path() + "/secret.txt").c_str(), (ws_ + "/link").c_str()), 0);
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/dirlink").c_str()), 0);
  EXPECT_EQ(fs_.Read("link").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Write("link", "overwritten").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Read("dirlink/secret.txt").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Write("dirlink/new.txt", "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Slurp(dir_.path() + "/secret.txt"), "host secret");
  EXPECT_NE(access((dir_.path() + "/new.txt").c_str(), F_OK), 0);
}

TEST_F(WorkspaceFsTest, HardLinksFifosAndDirectoriesAreRefused) {
  ASSERT_EQ(link((dir_.path() + "/secret.txt").c_str(), (ws_ + "/hard").c_str()), 0);
  EXPECT_EQ(fs_.Read("hard").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.Write("hard", "x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Slurp(dir_.path() + "/secret.txt"), "host secret");
  ASSERT_EQ(mkfifo((ws_ + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(fs_.Read("fifo").status().code(), absl::StatusCode::kInvalidArgument);  // no hang
  ASSERT_EQ(mkdir((ws_ + "/d").c_str(), 0755), 0);
  EXPECT_EQ(fs_.Read("d").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.Write("d", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkspaceFsTest, SizeLimitIsResourceExhausted) {
  EXPECT_EQ(fs_.Write("big", std::string(1025, 'x')).code(), absl::StatusCode::kResourceExhausted);
  std::ofstream(ws_ + "/big2") << std::string(2000, 'y');
  EXPECT_EQ(fs_.Read("big2").status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(RemoveTree, RemovesWithoutFollowingSymlinks) {
  TempDir dir;
  std::string outside = dir.path() + "/outside";
  mkdir(outside.c_str(), 0755);
  std::ofstream(outside + "/keep") << "keep";
  std::string tree = dir.path() + "/tree";
  mkdir(tree.c_str(), 0755);
  mkdir((tree + "/sub").c_str(), 0755);
  std::ofstream(tree + "/sub/f") << "f";
  ASSERT_EQ(symlink(outside.c_str(), (tree + "/sub/link").c_str()), 0);
  ASSERT_TRUE(RemoveTree(tree).ok());
  EXPECT_NE(access(tree.c_str(), F_OK), 0);
  EXPECT_EQ(Slurp(outside + "/keep"), "keep");
  EXPECT_TRUE(RemoveTree(tree).ok());  // missing is fine
}

}  // namespace
}  // namespace sandbox
