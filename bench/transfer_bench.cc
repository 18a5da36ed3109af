// transfer_bench: streamed uploads and downloads (UploadFile, DownloadFile)
// and listing, each as a ratio against its true limit measured side by side
// in the same run, into the same filesystem (a local sandbox's workspace):
//
//   1. upload / download through the broker, the local provider and the
//      C++ client, against a bare gRPC server (the callback API, writing or
//      reading the same bytes inline, no broker) on the same channel
//      settings and chunk size: the transport's own limit; and against a
//      plain copy of the file (read/write, 1 MiB), the disk's.
//   2. the process's RSS growth during the broker's transfers (the broker
//      and the client are in this process; each holds a chunk or two).
//   3. ListFiles of a directory of N files at depth 1 (p50 of 15) against
//      readdir + lstat of the same directory in this process.
//
//   transfer_bench [--mib N] [--files N]   defaults 1024 MiB, 10000 files
//   transfer_bench --smoke                 16 MiB, 500 files (ctest)

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/remote_sandbox.h"
#include "common/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_callback.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"

namespace sandbox {
namespace {

constexpr size_t kChunk = 1 << 20;

int64_t RssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }
double MibPerS(int64_t bytes, double s) { return s > 0 ? bytes / 1048576.0 / s : 0; }

// A file of `bytes` pseudo-random bytes (not compressible, not sparse).
void MakeFile(const std::string& path, int64_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::string chunk(kChunk, '\0');
  uint64_t x = 88172645463325252ull;
  for (int64_t left = bytes; left > 0;) {
    for (size_t i = 0; i < chunk.size(); i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      memcpy(&chunk[i], &x, 8);
    }
    const size_t n = static_cast<size_t>(std::min<int64_t>(left, kChunk));
    out.write(chunk.data(), static_cast<std::streamsize>(n));
    left -= static_cast<int64_t>(n);
  }
}

// The disk's limit: read/write in 1 MiB steps, as cat does.
double Copy(const std::string& from, const std::string& to) {
  const absl::Time t = absl::Now();
  int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  int out = open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  std::string buf(kChunk, '\0');
  ssize_t n;
  while ((n = read(in, buf.data(), buf.size())) > 0) {
    if (write(out, buf.data(), static_cast<size_t>(n)) != n) break;
  }
  close(in);
  close(out);
  return Seconds(t);
}

// The transport's limit: the same two RPCs answered inline by a bare
// callback server that writes and reads `dir` directly.
class BareTransfers final : public pb::SandboxBroker::CallbackService {
 public:
  explicit BareTransfers(std::string dir) : dir_(std::move(dir)) {}

  grpc::ServerReadReactor<pb::UploadFileRequest>* UploadFile(
      grpc::CallbackServerContext*, pb::UploadFileResponse* resp) override {
    class R : public grpc::ServerReadReactor<pb::UploadFileRequest> {
     public:
      R(std::string dir, pb::UploadFileResponse* resp) : dir_(std::move(dir)), resp_(resp) {
        StartRead(&msg_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          close(fd_);
          resp_->set_bytes_written(n_);
          return Finish(grpc::Status::OK);
        }
        if (msg_.has_header() && msg_.header().path() == "mem") {
          fd_ = -1;  // the transport alone: bytes are counted, not written
        } else if (msg_.has_header()) {
          fd_ = open(absl::StrCat(dir_, "/", msg_.header().path()).c_str(),
                     O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        } else if (fd_ < 0) {
          n_ += static_cast<int64_t>(msg_.chunk().size());
        } else if (msg_.has_chunk()) {
          n_ += write(fd_, msg_.chunk().data(), msg_.chunk().size());
        }
        StartRead(&msg_);
      }
      void OnDone() override { delete this; }

     private:
      std::string dir_;
      pb::UploadFileResponse* resp_;
      pb::UploadFileRequest msg_;
      int fd_ = -1;
      int64_t n_ = 0;
    };
    return new R(dir_, resp);
  }

  grpc::ServerWriteReactor<pb::DownloadFileResponse>* DownloadFile(
      grpc::CallbackServerContext*, const pb::DownloadFileRequest* req) override {
    class W : public grpc::ServerWriteReactor<pb::DownloadFileResponse> {
     public:
      // `mem_bytes` > 0: the transport alone, the same chunk sent again.
      W(const std::string& path, int64_t mem_bytes)
          : fd_(mem_bytes > 0 ? -1 : open(path.c_str(), O_RDONLY | O_CLOEXEC)),
            mem_left_(mem_bytes) {
        msg_.mutable_header()->set_found(fd_ >= 0 || mem_left_ > 0);
        if (mem_left_ > 0) msg_.mutable_header()->mutable_entry()->set_size(mem_left_);
        struct stat st;
        if (fd_ >= 0 && fstat(fd_, &st) == 0)
          msg_.mutable_header()->mutable_entry()->set_size(st.st_size);
        StartWrite(&msg_);
      }
      void OnWriteDone(bool ok) override {
        std::string* chunk = msg_.mutable_chunk();
        chunk->resize(kChunk);
        ssize_t n = 0;
        if (ok && mem_left_ > 0) {
          n = static_cast<ssize_t>(std::min<int64_t>(mem_left_, kChunk));
          mem_left_ -= n;
        } else if (ok && fd_ >= 0) {
          n = read(fd_, chunk->data(), kChunk);
        }
        if (n <= 0) {
          if (fd_ >= 0) close(fd_);
          return Finish(grpc::Status::OK);
        }
        chunk->resize(static_cast<size_t>(n));
        StartWrite(&msg_);
      }
      void OnDone() override { delete this; }

     private:
      int fd_;
      int64_t mem_left_;
      pb::DownloadFileResponse msg_;
    };
    return new W(absl::StrCat(dir_, "/", req->path()), req->path() == "mem" ? req->length() : 0);
  }

 private:
  std::string dir_;
};

std::shared_ptr<grpc::Channel> Channel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

struct Rates {
  double up = 0, down = 0;
};

Rates Transfer(RemoteSandbox& sb, const std::string& local, const std::string& back, int64_t bytes,
               const std::string& remote = "bench.bin") {
  Rates r;
  {
    std::ifstream in(local, std::ios::binary);
    RemoteTransferOptions o;
    o.size = bytes;
    const absl::Time t = absl::Now();
    absl::StatusOr<int64_t> n = sb.UploadFile(remote, in, o);
    if (!n.ok() || *n != bytes) {
      fprintf(stderr, "upload failed: %s\n", n.status().ToString().c_str());
      exit(1);
    }
    r.up = MibPerS(bytes, Seconds(t));
  }
  {
    std::ofstream out(back, std::ios::binary | std::ios::trunc);
    const absl::Time t = absl::Now();
    RemoteTransferOptions o;
    o.length = bytes;
    auto e = sb.DownloadFile(remote, out, o);
    out.flush();
    if (!e.ok() || !e->has_value() || (*e)->size() != bytes) {
      fprintf(stderr, "download failed: %s\n", e.status().ToString().c_str());
      exit(1);
    }
    r.down = MibPerS(bytes, Seconds(t));
  }
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int64_t mib, int files) {
  SetLogLevel(LogLevel::kError);
  const int64_t bytes = mib << 20;
  char tmpl[] = "/var/tmp/transfer-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  chmod(dir.c_str(), 0711);  // sandboxes' uids search it
  nlohmann::json cfg = {{"listen", "127.0.0.1:0"},
                        {"auth", nullptr},
                        {"state", {{"backend", "memory"}}},
                        {"providers",
                         {{"local",
                           {{"workspace_root", dir + "/ws"},
                            {"limits", {{"disk_bytes", bytes * 2 + (int64_t{256} << 20)}}}}}}}};
  auto config = ParseConfig(cfg.dump());
  if (!config.ok()) return fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  auto providers = BuildProviders(*config);
  if (!providers.ok()) return fprintf(stderr, "%s\n", providers.status().ToString().c_str()), 1;
  BrokerServer::Options so;
  so.health_thread = false;
  so.pool_threads = false;
  auto server = BrokerServer::Start(*config, std::move(*providers), so);
  if (!server.ok()) return fprintf(stderr, "%s\n", server.status().ToString().c_str()), 1;
  RemoteSandbox sb(pb::SandboxBroker::NewStub(Channel((*server)->port())), "bench");
  auto info = sb.Start();
  if (!info.ok()) return fprintf(stderr, "%s\n", info.status().ToString().c_str()), 1;
  // The sandbox's workspace on the host: every baseline writes there too.
  const std::string ws = absl::StrCat(dir, "/ws/", info->sandbox_id(), "/workspace");

  BareTransfers bare(ws);
  grpc::ServerBuilder b;
  int bare_port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &bare_port);
  b.SetMaxReceiveMessageSize(-1);
  b.RegisterService(&bare);
  std::unique_ptr<grpc::Server> bare_server = b.BuildAndStart();
  RemoteSandbox bare_sb(pb::SandboxBroker::NewStub(Channel(bare_port)), "bench");

  const std::string src = dir + "/source.bin";
  MakeFile(src, bytes);
  printf("transfer_bench: %lld MiB, %zu KiB chunks, workspace %s\n", static_cast<long long>(mib),
         kChunk / 1024, ws.c_str());
  const double copy_s = Copy(src, ws + "/copy.bin");
  unlink((ws + "/copy.bin").c_str());
  const double copy = MibPerS(bytes, copy_s);

  // Interleaved rounds: bare, broker, bare, broker.
  Rates bare_r, mem_r, broker_r;
  int64_t rss_growth = 0;
  for (int round = 0; round < 2; ++round) {
    Rates m = Transfer(bare_sb, src, dir + "/back.bin", bytes, "mem");
    mem_r.up = std::max(mem_r.up, m.up);
    mem_r.down = std::max(mem_r.down, m.down);
    Rates a = Transfer(bare_sb, src, dir + "/back.bin", bytes);
    unlink((ws + "/bench.bin").c_str());
    const int64_t before = RssKib();
    Rates c = Transfer(sb, src, dir + "/back.bin", bytes);
    rss_growth = std::max(rss_growth, RssKib() - before);
    bare_r.up = std::max(bare_r.up, a.up);
    bare_r.down = std::max(bare_r.down, a.down);
    broker_r.up = std::max(broker_r.up, c.up);
    broker_r.down = std::max(broker_r.down, c.down);
  }
  // The bar (issue #36): the bare server writing the same filesystem; the
  // bare server without a disk is the transport alone, for context.
  printf("[1] %-9s %9s %10s %14s %9s %9s %12s %9s\n", "MiB/s", "broker", "bare+disk",
         "bare, no disk", "copy", "vs bare", "vs no disk", "vs copy");
  auto row = [&](const char* what, double broker, double bare, double mem) {
    printf("    %-9s %9.0f %10.0f %14.0f %9.0f %8.2fx %11.2fx %8.2fx  (0.75x of bare+disk: %s)\n",
           what, broker, bare, mem, copy, broker / bare, broker / mem, broker / copy,
           broker >= 0.75 * bare ? "met" : "NOT met");
  };
  row("upload", broker_r.up, bare_r.up, mem_r.up);
  row("download", broker_r.down, bare_r.down, mem_r.down);
  printf("[2] RSS growth during the broker's transfers: %.1f MiB (bound 64 MiB: %s)\n",
         rss_growth / 1024.0, rss_growth < 64 * 1024 ? "met" : "NOT met");

  // [3] Listing.
  const std::string many = ws + "/many";
  mkdir(many.c_str(), 0755);
  for (int i = 0; i < files; ++i) {
    int fd = open(absl::StrFormat("%s/f%06d", many, i).c_str(), O_WRONLY | O_CREAT, 0644);
    close(fd);
  }
  std::vector<double> api_ms, floor_ms;
  for (int i = 0; i < 15; ++i) {
    absl::Time t = absl::Now();
    DIR* d = opendir(many.c_str());
    int n = 0;
    while (struct dirent* e = readdir(d)) {
      struct stat st;
      n += fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0;
    }
    closedir(d);
    floor_ms.push_back(Seconds(t) * 1000);
    t = absl::Now();
    auto r = sb.ListFiles("many");
    api_ms.push_back(Seconds(t) * 1000);
    if (!r.ok() || !r->has_value() || static_cast<int>((*r)->size()) != files) {
      return fprintf(stderr, "listing failed: %s\n", r.status().ToString().c_str()), 1;
    }
  }
  const double p50 = Median(api_ms);
  printf(
      "[3] ListFiles of %d files, depth 1: p50 %.1f ms (%d pages); readdir+lstat p50 %.1f ms; "
      "%.1fx; under 100 ms: %s\n",
      files, p50, (files + 999) / 1000, Median(floor_ms), p50 / Median(floor_ms),
      p50 < 100 ? "met" : "NOT met");
  (void)sb.Close();
  bare_server->Shutdown();
  (*server)->Shutdown();
  unlink(src.c_str());
  unlink((dir + "/back.bin").c_str());
  rmdir((dir + "/ws").c_str());
  rmdir(dir.c_str());
  return 0;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  int64_t mib = 1024;
  int files = 10000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      mib = 16;
      files = 500;
    } else if (a == "--mib" && i + 1 < argc) {
      mib = std::stoll(argv[++i]);
    } else if (a == "--files" && i + 1 < argc) {
      files = std::stoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: transfer_bench [--smoke] [--mib N] [--files N]\n");
      return 64;
    }
  }
  return sandbox::Main(mib, files);
}
