#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/remote_sandbox.h"
#include "grpcpp/create_channel.h"
#include "server/broker_server.h"
#include "server/provider_setup.h"
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

  TempDir dir_;
  FakeClock clock_;
  BrokerConfig config_;
  std::unique_ptr<BrokerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
};

}  // namespace sandbox
