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

// The file API (WorkspaceFs::Apply).
FileOp Op(FileOp::Kind kind, std::string path) {
  FileOp op;
  op.kind = kind;
  op.path = std::move(path);
  return op;
}

std::vector<std::string> Paths(const FileOpResult& r) {
  std::vector<std::string> out;
  for (const FileEntry& e : r.entries) out.push_back(e.path);
  return out;
}

TEST_F(WorkspaceFsTest, ListsEntriesSortedWithTypeSizeModeAndDepth) {
  ASSERT_TRUE(fs_.Write("b.txt", "hello").ok());
  ASSERT_TRUE(fs_.Write("sub/deeper/c", "cc").ok());
  ASSERT_EQ(chmod((ws_ + "/b.txt").c_str(), 0640), 0);
  ASSERT_EQ(symlink("/etc/passwd", (ws_ + "/a-link").c_str()), 0);
  absl::StatusOr<FileOpResult> top = fs_.Apply(Op(FileOp::Kind::kList, ""));
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_TRUE(top->found);
  EXPECT_EQ(Paths(*top),
            (std::vector<std::string>{"/workspace/a-link", "/workspace/b.txt", "/workspace/sub"}));
  EXPECT_EQ(top->entries[0].type, FileType::kSymlink);
  EXPECT_EQ(top->entries[0].symlink_target, "/etc/passwd");  // described, not followed
  EXPECT_EQ(top->entries[1].type, FileType::kFile);
  EXPECT_EQ(top->entries[1].name, "b.txt");
  EXPECT_EQ(top->entries[1].size, 5);
  EXPECT_EQ(top->entries[1].mode, 0640u);
  EXPECT_EQ(top->entries[2].type, FileType::kDir);
  FileOp deep = Op(FileOp::Kind::kList, "/workspace/sub");
  deep.depth = 2;
  absl::StatusOr<FileOpResult> sub = fs_.Apply(deep);
  ASSERT_TRUE(sub.ok()) << sub.status();
  EXPECT_EQ(Paths(*sub),
            (std::vector<std::string>{"/workspace/sub/deeper", "/workspace/sub/deeper/c"}));
}

TEST(ListingOrder, IsDepthFirstWithNamesSorted) {
  EXPECT_TRUE(ListingLess("/w/a", "/w/a/x"));
  EXPECT_TRUE(ListingLess("/w/a/x", "/w/a-b"));  // '-' < '/' bytewise, not here
  EXPECT_TRUE(ListingLess("/w/a/z", "/w/b"));
  EXPECT_FALSE(ListingLess("/w/b", "/w/b"));
  EXPECT_TRUE(ListingLess("/w/\x7f", "/w/\xc3\xa9"));  // bytes compare unsigned
}

TEST_F(WorkspaceFsTest, ListingPagesResumeAfterTheLastPathListed) {
  for (const char* f : {"a/x", "a/y", "a-b", "c"}) ASSERT_TRUE(fs_.Write(f, "").ok());
  FileOp op = Op(FileOp::Kind::kList, "");
  op.depth = 2;
  op.limit = 2;
  absl::StatusOr<FileOpResult> p1 = fs_.Apply(op);
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_EQ(Paths(*p1), (std::vector<std::string>{"/workspace/a", "/workspace/a/x"}));
  EXPECT_TRUE(p1->more);
  op.after = "/workspace/a/x";
  absl::StatusOr<FileOpResult> p2 = fs_.Apply(op);
  EXPECT_EQ(Paths(*p2), (std::vector<std::string>{"/workspace/a/y", "/workspace/a-b"}));
  EXPECT_TRUE(p2->more);
  op.after = "/workspace/a-b";
  absl::StatusOr<FileOpResult> p3 = fs_.Apply(op);
  EXPECT_EQ(Paths(*p3), (std::vector<std::string>{"/workspace/c"}));
  EXPECT_FALSE(p3->more);
}

TEST_F(WorkspaceFsTest, ListingAMissingPathIsAnAnswerAndAFileIsAnError) {
  absl::StatusOr<FileOpResult> missing = fs_.Apply(Op(FileOp::Kind::kList, "no/such"));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->found);
  ASSERT_TRUE(fs_.Write("f", "x").ok());
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kList, "f")).status().code(),
            absl::StatusCode::kInvalidArgument);
  FileOp bad = Op(FileOp::Kind::kList, "");
  bad.depth = kMaxListDepth + 1;
  EXPECT_EQ(fs_.Apply(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kList, "../")).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(WorkspaceFsTest, ListingNeverGoesThroughASymlinkedDirectory) {
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/host").c_str()), 0);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kList, "host")).status().code(),
            absl::StatusCode::kPermissionDenied);
  FileOp all = Op(FileOp::Kind::kList, "");
  all.depth = kMaxListDepth;
  absl::StatusOr<FileOpResult> r = fs_.Apply(all);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Paths(*r), (std::vector<std::string>{"/workspace/host"}));  // not secret.txt
}

TEST_F(WorkspaceFsTest, StatDescribesFilesTheWorkspaceAndMissingPaths) {
  ASSERT_TRUE(fs_.Write("d/f.txt", "abc").ok());
  absl::StatusOr<FileOpResult> f = fs_.Apply(Op(FileOp::Kind::kStat, "d/f.txt"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(f->found);
  EXPECT_EQ(f->entries.at(0).path, "/workspace/d/f.txt");
  EXPECT_EQ(f->entries.at(0).size, 3);
  EXPECT_GT(f->entries.at(0).mtime, absl::UnixEpoch());
  absl::StatusOr<FileOpResult> root = fs_.Apply(Op(FileOp::Kind::kStat, ""));
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->entries.at(0).path, "/workspace");
  EXPECT_EQ(root->entries.at(0).type, FileType::kDir);
  EXPECT_FALSE(fs_.Apply(Op(FileOp::Kind::kStat, "d/nope")).value().found);
  EXPECT_FALSE(fs_.Apply(Op(FileOp::Kind::kStat, "d/f.txt/under")).value().found);
}

TEST_F(WorkspaceFsTest, MakeDirCreatesOnceOrWithParents) {
  EXPECT_TRUE(fs_.Apply(Op(FileOp::Kind::kMakeDir, "one")).ok());
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kMakeDir, "one")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kMakeDir, "x/y/z")).status().code(),
            absl::StatusCode::kNotFound);
  FileOp p = Op(FileOp::Kind::kMakeDir, "x/y/z");
  p.parents = true;
  EXPECT_TRUE(fs_.Apply(p).ok());
  EXPECT_TRUE(fs_.Apply(p).ok());  // mkdir -p: there already is fine
  struct stat st;
  ASSERT_EQ(stat((ws_ + "/x/y/z").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_TRUE(fs_.Write("file", "x").ok());
  FileOp over_file = Op(FileOp::Kind::kMakeDir, "file");
  over_file.parents = true;
  EXPECT_EQ(fs_.Apply(over_file).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kMakeDir, "")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkspaceFsTest, MakeDirThroughASymlinkIsRefused) {
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/host").c_str()), 0);
  FileOp p = Op(FileOp::Kind::kMakeDir, "host/planted");
  p.parents = true;
  EXPECT_EQ(fs_.Apply(p).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access((dir_.path() + "/planted").c_str(), F_OK), 0);
}

TEST_F(WorkspaceFsTest, RemoveSaysWhetherItExistedAndNeedsRecursiveForATree) {
  ASSERT_TRUE(fs_.Write("t/a/b", "x").ok());
  ASSERT_TRUE(fs_.Write("single", "x").ok());
  EXPECT_TRUE(fs_.Apply(Op(FileOp::Kind::kRemove, "single")).value().found);
  EXPECT_FALSE(fs_.Apply(Op(FileOp::Kind::kRemove, "single")).value().found);
  EXPECT_FALSE(fs_.Apply(Op(FileOp::Kind::kRemove, "no/parent/x")).value().found);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kRemove, "t")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  FileOp r = Op(FileOp::Kind::kRemove, "t");
  r.recursive = true;
  EXPECT_TRUE(fs_.Apply(r).value().found);
  EXPECT_NE(access((ws_ + "/t").c_str(), F_OK), 0);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kRemove, "/workspace")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkspaceFsTest, RemoveTakesLinksAwayNotWhatTheyPointAt) {
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/host").c_str()), 0);
  ASSERT_EQ(link((dir_.path() + "/secret.txt").c_str(), (ws_ + "/hard").c_str()), 0);
  EXPECT_EQ(fs_.Apply(Op(FileOp::Kind::kRemove, "host/secret.txt")).status().code(),
            absl::StatusCode::kPermissionDenied);
  FileOp r = Op(FileOp::Kind::kRemove, "host");
  r.recursive = true;
  EXPECT_TRUE(fs_.Apply(r).value().found);
  EXPECT_TRUE(fs_.Apply(Op(FileOp::Kind::kRemove, "hard")).value().found);
  EXPECT_EQ(Slurp(dir_.path() + "/secret.txt"), "host secret");
}

TEST_F(WorkspaceFsTest, MoveRenamesWithoutReplacingUnlessAsked) {
  ASSERT_TRUE(fs_.Write("a", "A").ok());
  ASSERT_TRUE(fs_.Write("b", "B").ok());
  FileOp m = Op(FileOp::Kind::kMove, "a");
  m.destination = "b";
  EXPECT_EQ(fs_.Apply(m).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(**fs_.Read("b"), "B");
  m.overwrite = true;
  EXPECT_TRUE(fs_.Apply(m).ok());
  EXPECT_EQ(**fs_.Read("b"), "A");
  EXPECT_FALSE(fs_.Read("a")->has_value());
  EXPECT_EQ(fs_.Apply(m).status().code(), absl::StatusCode::kNotFound);  // a is gone
  FileOp into = Op(FileOp::Kind::kMove, "b");
  into.destination = "new/parents/b";
  EXPECT_TRUE(fs_.Apply(into).ok());
  EXPECT_EQ(**fs_.Read("new/parents/b"), "A");
  FileOp self = Op(FileOp::Kind::kMove, "new");
  self.destination = "new/parents/inside";
  EXPECT_EQ(fs_.Apply(self).status().code(), absl::StatusCode::kInvalidArgument);
  FileOp out = Op(FileOp::Kind::kMove, "new");
  out.destination = "../escaped";
  EXPECT_EQ(fs_.Apply(out).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access((dir_.path() + "/escaped").c_str(), F_OK), 0);
}

TEST_F(WorkspaceFsTest, MoveThroughASymlinkIsRefused) {
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/host").c_str()), 0);
  ASSERT_TRUE(fs_.Write("mine", "x").ok());
  FileOp in = Op(FileOp::Kind::kMove, "mine");
  in.destination = "host/mine";
  EXPECT_EQ(fs_.Apply(in).status().code(), absl::StatusCode::kPermissionDenied);
  FileOp steal = Op(FileOp::Kind::kMove, "host/secret.txt");
  steal.destination = "stolen";
  EXPECT_EQ(fs_.Apply(steal).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Slurp(dir_.path() + "/secret.txt"), "host secret");
  EXPECT_NE(access((dir_.path() + "/mine").c_str(), F_OK), 0);
}

TEST_F(WorkspaceFsTest, AnUploadAppearsWholeAtCommitOrNotAtAll) {
  ASSERT_TRUE(fs_.Write("target", "old").ok());
  {
    auto up = fs_.BeginUpload("target", 0600, 100);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->Append("new ").ok());
    EXPECT_EQ(**fs_.Read("target"), "old");  // not yet
    ASSERT_TRUE((*up)->Append("bytes").ok());
    ASSERT_TRUE((*up)->Commit().ok());
  }
  EXPECT_EQ(**fs_.Read("target"), "new bytes");
  struct stat st;
  ASSERT_EQ(stat((ws_ + "/target").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  {
    auto up = fs_.BeginUpload("sub/dropped", 0644, 100);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->Append("x").ok());
    EXPECT_EQ((*up)->Append(std::string(100, 'y')).code(), absl::StatusCode::kResourceExhausted);
  }  // dropped uncommitted
  FileOp all;
  all.kind = FileOp::Kind::kList;
  all.depth = 3;
  EXPECT_EQ(Paths(*fs_.Apply(all)),
            (std::vector<std::string>{"/workspace/sub", "/workspace/target"}));
}

TEST_F(WorkspaceFsTest, DownloadsReadRangesAndRefuseLinks) {
  ASSERT_TRUE(fs_.Write("f", "0123456789").ok());
  auto d = fs_.BeginDownload("f", 2, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(*d, nullptr);
  EXPECT_EQ((*d)->entry().size, 10);
  std::string chunk, all;
  do {
    ASSERT_TRUE((*d)->Read(2, &chunk).ok());
    all += chunk;
  } while (!chunk.empty());
  EXPECT_EQ(all, "23456");
  EXPECT_EQ(fs_.BeginDownload("missing", 0, 0).value(), nullptr);
  EXPECT_EQ(fs_.BeginDownload("f", 11, 0).status().code(), absl::StatusCode::kOutOfRange);
  ASSERT_EQ(link((dir_.path() + "/secret.txt").c_str(), (ws_ + "/hard").c_str()), 0);
  EXPECT_EQ(fs_.BeginDownload("hard", 0, 0).status().code(), absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(symlink(dir_.path().c_str(), (ws_ + "/host").c_str()), 0);
  EXPECT_EQ(fs_.BeginDownload("host/secret.txt", 0, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fs_.BeginUpload("host/planted", 0644, 10).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_NE(access((dir_.path() + "/planted").c_str(), F_OK), 0);
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
