// The file API end to end (docs/api.md#files): a real gRPC server on
// 127.0.0.1:0, the local provider, sandboxed code on the other side.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

using C = absl::StatusCode;

class FilesTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(); }

  std::vector<std::string> Paths(RemoteSandbox& sb, const std::string& path, int depth = 1) {
    auto r = sb.ListFiles(path, depth);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<std::string> out;
    if (!r.ok() || !r->has_value()) return out;
    for (const pb::FileEntry& e : **r) out.push_back(e.path());
    return out;
  }
};

TEST_F(FilesTest, WhatTheCodeMakesTheApiSeesAndTheOtherWayRound) {
  auto sb = Client("files");
  ASSERT_EQ(sb->Shell("mkdir -p data/raw && printf 12345 > data/raw/a.csv && "
                      "ln -s / data/root && touch /tmp/scratch")
                ->exit_code(),
            0);
  EXPECT_EQ(Paths(*sb, ""), (std::vector<std::string>{"/workspace/data"}));
  EXPECT_EQ(Paths(*sb, "data", 2),
            (std::vector<std::string>{"/workspace/data/raw", "/workspace/data/raw/a.csv",
                                      "/workspace/data/root"}));
  auto st = sb->StatFile("data/raw/a.csv");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_TRUE(st->has_value());
  EXPECT_EQ((*st)->type(), pb::FILE_TYPE_FILE);
  EXPECT_EQ((*st)->size(), 5);
  EXPECT_EQ((*st)->name(), "a.csv");
  EXPECT_GT((*st)->mtime().seconds(), 0);
  auto link = sb->StatFile("data/root");
  ASSERT_TRUE(link.ok() && link->has_value());
  EXPECT_EQ((*link)->type(), pb::FILE_TYPE_SYMLINK);
  EXPECT_EQ((*link)->symlink_target(), "/");
  EXPECT_EQ(sb->ListFiles("data/root").status().code(), C::kPermissionDenied);
  std::vector<std::string> tmp = Paths(*sb, "/tmp");
  EXPECT_NE(std::find(tmp.begin(), tmp.end(), "/tmp/scratch"), tmp.end());

  ASSERT_TRUE(sb->MakeDir("out/plots", true).ok()) << sb->MakeDir("out/plots", true);
  ASSERT_TRUE(sb->MoveFile("data/raw/a.csv", "out/a.csv").ok());
  EXPECT_EQ(sb->Shell("test -d out/plots && cat out/a.csv && test ! -e data/raw/a.csv")->output(),
            "12345");
  EXPECT_TRUE(*sb->RemoveFile("data", true));
  EXPECT_FALSE(*sb->RemoveFile("data", true));
  EXPECT_EQ(sb->Shell("ls")->output(), "out\n");
  EXPECT_TRUE(*sb->RemoveFile("/tmp/scratch"));
  EXPECT_FALSE(sb->StatFile("data")->has_value());
  EXPECT_FALSE(sb->ListFiles("data")->has_value());
}

TEST_F(FilesTest, ErrorsHaveTheRightCodesAndCreateNothing) {
  auto sb = Client("errors");
  ASSERT_TRUE(sb->WriteFile("d/f", "x").ok());
  EXPECT_EQ(sb->MakeDir("d").code(), C::kAlreadyExists);
  EXPECT_EQ(sb->MakeDir("no/parent").code(), C::kNotFound);
  EXPECT_EQ(sb->RemoveFile("d").status().code(), C::kFailedPrecondition);
  EXPECT_EQ(sb->MoveFile("missing", "x").code(), C::kNotFound);
  ASSERT_TRUE(sb->WriteFile("g", "y").ok());
  EXPECT_EQ(sb->MoveFile("g", "d/f").code(), C::kAlreadyExists);
  EXPECT_TRUE(sb->MoveFile("g", "d/f", true).ok());
  EXPECT_EQ(**sb->ReadFile("d/f"), "y");
  EXPECT_EQ(sb->MoveFile("/tmp/x", "x").code(), C::kInvalidArgument);  // /tmp and the workspace
  EXPECT_EQ(sb->RemoveFile("../../etc/passwd").status().code(), C::kPermissionDenied);
  EXPECT_EQ(sb->ListFiles("d/f").status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->ListFiles("", 11).status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->MakeDir("").code(), C::kInvalidArgument);

  // An invalid request never creates the session's sandbox.
  auto fresh = Client("fresh");
  EXPECT_EQ(fresh->ListFiles("", -1).status().code(), C::kInvalidArgument);
  EXPECT_EQ(fresh->RemoveFile("").status().code(), C::kInvalidArgument);
  EXPECT_EQ(fresh->MoveFile("a", "").code(), C::kInvalidArgument);
  EXPECT_EQ(fresh->Info().status().code(), C::kNotFound);
  // A valid one creates it lazily, as Run does.
  EXPECT_FALSE(fresh->StatFile("nothing")->has_value());
  EXPECT_TRUE(fresh->Info().ok());
  // Another tenant's session of the same name is another sandbox.
  EXPECT_FALSE(Client("errors", "token-beta-456")->StatFile("d/f")->has_value());
}

TEST_F(FilesTest, ListingPagesInPathOrder) {
  auto sb = Client("pages");
  ASSERT_EQ(sb->Shell("for i in 1 2 3 4 5; do mkdir d$i; touch d$i/f; done")->exit_code(), 0);
  pb::ListFilesRequest req;
  req.set_session_id("pages");
  req.set_depth(2);
  req.set_page_size(3);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto ctx = Ctx();
    pb::ListFilesResponse resp;
    ASSERT_TRUE(stub_->ListFiles(ctx.get(), req, &resp).ok());
    EXPECT_LE(resp.entries_size(), 3);
    for (const auto& e : resp.entries()) seen.push_back(e.path());
    req.set_page_token(resp.next_page_token());
    ++pages;
    if (pages == 2) {
      // A change between pages moves nothing already listed.
      ASSERT_EQ(sb->Shell("touch d1/late; rm -r d5")->exit_code(), 0);
    }
  } while (!req.page_token().empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"/workspace/d1", "/workspace/d1/f", "/workspace/d2",
                                            "/workspace/d2/f", "/workspace/d3", "/workspace/d3/f",
                                            "/workspace/d4", "/workspace/d4/f"}));
  auto ctx = Ctx();
  req.set_page_token("%%%");
  pb::ListFilesResponse resp;
  EXPECT_EQ(FromGrpcStatus(stub_->ListFiles(ctx.get(), req, &resp)).code(), C::kInvalidArgument);
  // The whole listing through the client: every page.
  EXPECT_EQ(Paths(*sb, "", 2).size(), 9u);
}

// Bytes that differ at every offset a bug could shift them by.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s[i] = static_cast<char>(x);
  }
  return s;
}

TEST_F(FilesTest, LargeFilesStreamInAndOutWhole) {
  auto sb = Client("stream");
  const std::string data = Pattern((16 << 20) + 12345);
  std::istringstream in(data);
  RemoteSandbox::TransferOptions up;
  up.mode = 0700;
  up.size = static_cast<int64_t>(data.size());
  up.chunk_bytes = 256 << 10;
  int64_t last_progress = 0;
  up.progress = [&](int64_t n) { last_progress = n; };
  absl::StatusOr<int64_t> n = sb->UploadFile("big/data.bin", in, up);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(data.size()));
  EXPECT_EQ(last_progress, *n);
  EXPECT_EQ(sb->Shell("wc -c < big/data.bin")->output(), absl::StrCat(data.size(), "\n"));
  auto st = sb->StatFile("big/data.bin");
  ASSERT_TRUE(st.ok() && st->has_value());
  EXPECT_EQ((*st)->mode(), 0700u);
  EXPECT_EQ(Paths(*sb, "big"), (std::vector<std::string>{"/workspace/big/data.bin"}));

  std::ostringstream out;
  auto entry = sb->DownloadFile("/workspace/big/data.bin", out);
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_TRUE(entry->has_value());
  EXPECT_EQ((*entry)->size(), static_cast<int64_t>(data.size()));
  EXPECT_TRUE(out.str() == data) << "the downloaded bytes differ";

  RemoteSandbox::TransferOptions part;
  part.offset = 1000;
  part.length = 5000;
  std::ostringstream piece;
  ASSERT_TRUE(sb->DownloadFile("big/data.bin", piece, part).ok());
  EXPECT_TRUE(piece.str() == data.substr(1000, 5000));
  part.offset = static_cast<int64_t>(data.size()) + 1;
  std::ostringstream none;
  EXPECT_EQ(sb->DownloadFile("big/data.bin", none, part).status().code(), C::kOutOfRange);

  // An upload replaces what is there, whole.
  std::istringstream small("small");
  ASSERT_TRUE(sb->UploadFile("big/data.bin", small).ok());
  EXPECT_EQ(**sb->ReadFile("big/data.bin"), "small");
}

TEST_F(FilesTest, DownloadAnswersMissingAndRefusesEscapes) {
  auto sb = Client("dl");
  std::ostringstream out;
  auto missing = sb->DownloadFile("nope/x", out);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  ASSERT_EQ(sb->Shell("ln -s /etc/passwd link && mkdir d && echo s > /tmp/t")->exit_code(), 0);
  EXPECT_EQ(sb->DownloadFile("link", out).status().code(), C::kPermissionDenied);
  EXPECT_EQ(sb->DownloadFile("d", out).status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->DownloadFile("../../etc/passwd", out).status().code(), C::kPermissionDenied);
  std::istringstream in("x");
  EXPECT_EQ(sb->UploadFile("link/under", in).status().code(), C::kPermissionDenied);
  std::istringstream in2("x");
  EXPECT_EQ(sb->UploadFile("d", in2).status().code(), C::kInvalidArgument);
  EXPECT_TRUE(out.str().empty());
  // The container's /tmp, both ways.
  std::ostringstream tmp;
  ASSERT_TRUE(sb->DownloadFile("/tmp/t", tmp).ok());
  EXPECT_EQ(tmp.str(), "s\n");
  std::istringstream in3("into tmp");
  ASSERT_TRUE(sb->UploadFile("/tmp/u", in3).ok());
  EXPECT_EQ(sb->Shell("cat /tmp/u >> /tmp/u.copy && cat /tmp/u.copy")->output(), "into tmp");
}

std::vector<std::string> Hidden(RemoteSandbox& sb) {
  std::vector<std::string> out;
  auto r = sb.ListFiles("", 3);
  if (!r.ok() || !r->has_value()) return out;
  for (const auto& e : **r) out.push_back(e.path());
  return out;
}

class TransferLimitTest : public FilesTest {
 protected:
  void SetUp() override { StartBroker(R"({"max_transfer_bytes": 1048576})"); }
};

TEST_F(TransferLimitTest, TooLargeOrWrongSizedUploadsLeaveNothing) {
  auto sb = Client("limits");
  const std::string two_mib = Pattern(2 << 20);
  std::istringstream announced(two_mib);
  RemoteSandbox::TransferOptions o;
  o.chunk_bytes = 256 << 10;  // under this broker's max_message_bytes
  o.size = static_cast<int64_t>(two_mib.size());
  absl::StatusOr<int64_t> r = sb->UploadFile("a.bin", announced, o);
  EXPECT_EQ(r.status().code(), C::kResourceExhausted);
  EXPECT_NE(r.status().message().find("max_transfer_bytes"), std::string::npos) << r.status();
  std::istringstream unannounced(two_mib);
  RemoteSandbox::TransferOptions chunked;
  chunked.chunk_bytes = 256 << 10;
  r = sb->UploadFile("b.bin", unannounced, chunked);
  EXPECT_EQ(r.status().code(), C::kResourceExhausted);
  std::istringstream short_of_it("abc");
  o.size = 4;
  EXPECT_EQ(sb->UploadFile("c.bin", short_of_it, o).status().code(), C::kInvalidArgument);
  EXPECT_EQ(Hidden(*sb), std::vector<std::string>{});
  std::istringstream fits(Pattern(1 << 20));
  r = sb->UploadFile("d.bin", fits, chunked);
  EXPECT_TRUE(r.ok()) << r.status();
}

TEST_F(FilesTest, AnUploadWithoutItsCommitKeepsNothing) {
  auto sb = Client("nocommit");
  ASSERT_TRUE(sb->MakeDir("keep").ok());
  pb::UploadFileRequest header;
  header.mutable_header()->set_session_id("nocommit");
  header.mutable_header()->set_path("keep/partial.bin");
  pb::UploadFileRequest chunk;
  chunk.set_chunk(Pattern(64 << 10));
  {
    // The stream ends (half-closed) with no commit message.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-alpha-123");
    pb::UploadFileResponse resp;
    auto writer = stub_->UploadFile(&ctx, &resp);
    ASSERT_TRUE(writer->Write(header));
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(Paths(*sb, "keep"), std::vector<std::string>{});
  {
    // Cancelled mid-stream, once the server holds the bytes.
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-alpha-123");
    pb::UploadFileResponse resp;
    auto writer = stub_->UploadFile(&ctx, &resp);
    ASSERT_TRUE(writer->Write(header));
    ASSERT_TRUE(writer->Write(chunk));
    bool written = false;
    for (int i = 0; i < 2000 && !written; ++i) {
      auto entries = sb->ListFiles("keep");
      written = entries.ok() && entries->has_value() && (*entries)->size() == 1 &&
                (*entries)->front().size() == (64 << 10);
      if (!written) usleep(5000);
    }
    EXPECT_TRUE(written);
    ctx.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server notices the cancel on its own time: wait for the cleanup.
  for (int i = 0; i < 2000 && !Paths(*sb, "keep").empty(); ++i) usleep(5000);
  EXPECT_EQ(Paths(*sb, "keep"), std::vector<std::string>{});
  // With its commit, the same stream keeps the file.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer token-alpha-123");
  pb::UploadFileResponse resp;
  auto writer = stub_->UploadFile(&ctx, &resp);
  pb::UploadFileRequest commit;
  commit.set_commit(true);
  ASSERT_TRUE(writer->Write(header));
  ASSERT_TRUE(writer->Write(chunk));
  ASSERT_TRUE(writer->Write(commit));
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(resp.bytes_written(), 64 << 10);
  EXPECT_EQ(Paths(*sb, "keep"), (std::vector<std::string>{"/workspace/keep/partial.bin"}));
}

}  // namespace
}  // namespace sandbox
