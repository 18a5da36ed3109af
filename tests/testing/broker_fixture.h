#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/remote_sandbox.h"
#include "grpcpp/create_channel.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {

// A real broker (gRPC on 127.0.0.1:0, the local bubblewrap provider) with
// a fake clock and the reaper driven by hand.
class BrokerFixture : public ::testing::Test {
 protected:
  // Extra config keys (JSON object members) merged over the test defaults.
  void StartBroker(const std::string& extra_json = "{}") {
    nlohmann::json cfg = nlohmann::json::parse(R"({
      "listen": "127.0.0.1:0", "idle_timeout_seconds": 2, "reap_interval_seconds": 1,
      "max_sessions_per_tenant": 5, "max_timeout_seconds": 60, "max_output_bytes": 4096,
      "max_message_bytes": 1048576,
      "auth": {"tokens": {"token-alpha-123": "alpha", "token-beta-456": "beta"}}})");
    cfg["providers"]["local"] = {{"workspace_root", dir_.path() + "/ws"}, {"uid_base", 620000}};
    // Each test its own store: parallel runs never share one.
    cfg["state"] = {{"backend", "sqlite"}, {"path", dir_.path() + "/state/state.db"}};
    cfg.merge_patch(nlohmann::json::parse(extra_json));
    auto config = ParseConfig(cfg.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto providers = BuildProviders(config_);
    ASSERT_TRUE(providers.ok()) << providers.status();
    BrokerServer::Options o;
    o.clock = &clock_;
    o.reaper_thread = false;
    o.health_thread = false;
    auto server = BrokerServer::Start(config_, std::move(*providers), o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::SandboxBroker::NewStub(channel_);
  }

  std::unique_ptr<RemoteSandbox> Client(const std::string& session,
                                        const std::string& token = "token-alpha-123",
                                        pb::SessionSpec spec = {}) {
    return std::make_unique<RemoteSandbox>(pb::SandboxBroker::NewStub(channel_), session, token,
                                           std::move(spec));
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = "token-alpha-123") {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  std::string WorkspaceRoot() const { return dir_.path() + "/ws"; }

  // Flow-control tests: a python program writing `chunks` chunks of `chunk`
  // bytes, each its index as text padded with dots; its progress.txt says
  // how many it has written (renamed into place).
  static std::string ChunkWriter(int chunks, int chunk) {
    return absl::StrCat("import os, sys\n", "for i in range(", chunks, "):\n",
                        "    sys.stdout.buffer.write(str(i).encode().ljust(", chunk, ", b'.'))\n",
                        "    sys.stdout.flush()\n", "    open('p.tmp', 'w').write(str(i + 1))\n",
                        "    os.replace('p.tmp', 'progress.txt')\n");
  }
  // The number of chunks a ChunkWriter in `sb` has written once it has
  // stopped (its progress.txt unchanged for 0.5 s); -1 if it never did
  // within `limit`.
  static int ChunksWhenPaused(RemoteSandbox* sb, absl::Duration limit) {
    auto progress = [&]() -> int {
      auto f = sb->ReadFile("progress.txt");
      int n = -1;
      return f.ok() && f->has_value() && absl::SimpleAtoi(**f, &n) ? n : -1;
    };
    int last = -2;
    absl::Time since = absl::Now();
    for (const absl::Time end = absl::Now() + limit; absl::Now() < end;) {
      const int p = progress();
      if (p != last || p < 0) {
        last = p;
        since = absl::Now();
      } else if (absl::Now() - since > absl::Milliseconds(500)) {
        return last;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    return -1;
  }

  TempDir dir_;
  FakeClock clock_;
  BrokerConfig config_;
  std::unique_ptr<BrokerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
};

}  // namespace sandbox
