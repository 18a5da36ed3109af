// Every gRPC method fed malformed and hostile requests, through the real
// server (docs/hardening.md): oversized fields, invalid UTF-8, NUL bytes,
// negative and huge numbers, unknown enum values, deeply nested tool
// arguments, 10k env entries. Each gets the documented code with a bounded
// message, the daemon stays up, and nothing is left behind.

#include <dirent.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/transport/grpc/grpc_service.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

using C = absl::StatusCode;

int CountEntries(const std::string& path) {
  int n = 0;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

class BadInputTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(); }

  // One call of `method` with `fill` applied to a fresh request; returns the
  // status and checks the message is short enough for any gRPC client to
  // receive (their default metadata limit is 8 KiB) and names no token.
  template <typename Req, typename Resp, typename Fill>
  absl::Status Call(grpc::Status (pb::SandboxBroker::Stub::*method)(grpc::ClientContext*,
                                                                      const Req&, Resp*),
                    Fill fill) {
    Req req;
    fill(&req);
    Resp resp;
    auto ctx = Ctx();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Status s = ((*stub_).*method)(ctx.get(), req, &resp);
    EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes + 3) << s.error_message().substr(0, 200);
    EXPECT_EQ(s.error_message().find("token-alpha-123"), std::string::npos);
    return FromGrpcStatus(s);
  }

  absl::Status RunStream(const std::function<void(pb::RunRequest*)>& fill) {
    pb::RunRequest req;
    fill(&req);
    auto ctx = Ctx();
    auto reader = stub_->RunStream(ctx.get(), req);
    pb::RunEvent ev;
    while (reader->Read(&ev)) {
    }
    grpc::Status s = reader->Finish();
    EXPECT_LE(s.error_message().size(), kMaxStatusMessageBytes + 3);
    return FromGrpcStatus(s);
  }

  // Raw request bytes for `method`, bypassing the client's serializer (which
  // would refuse invalid UTF-8 in a string field).
  absl::Status RawCall(const std::string& method, const std::string& bytes) {
    grpc::GenericStub generic(channel_);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer req(&slice, 1), resp;
    auto ctx = Ctx();
    absl::Notification done;
    grpc::Status status;
    generic.UnaryCall(ctx.get(), "/sandboxbroker.v1.SandboxBroker/" + method,
                      grpc::StubOptions(), &req, &resp, [&](grpc::Status s) {
                        status = std::move(s);
                        done.Notify();
                      });
    done.WaitForNotification();
    return FromGrpcStatus(status);
  }

  // The daemon still answers, and a session still works end to end.
  void ExpectHealthy() {
    pb::ListToolsRequest req;
    pb::ListToolsResponse resp;
    auto ctx = Ctx();
    ASSERT_TRUE(stub_->ListTools(ctx.get(), req, &resp).ok());
    EXPECT_FALSE(resp.tools().empty());
  }

  // No session, sandbox or workspace was created by the bad requests.
  void ExpectNothingLeft() {
    pb::ListSessionsRequest req;
    pb::ListSessionsResponse resp;
    auto ctx = Ctx();
    ASSERT_TRUE(stub_->ListSessions(ctx.get(), req, &resp).ok());
    EXPECT_EQ(resp.sessions_size(), 0);
    EXPECT_EQ(CountEntries(WorkspaceRoot()), 0);
  }
};

using Stub = pb::SandboxBroker::Stub;

TEST_F(BadInputTest, OversizedFieldsAreRefusedWithBoundedMessages) {
  const std::string huge_id(1 << 20, 'a');  // within max_message_bytes (1 MiB + framing)
  const std::string big_id(100000, 'x');
  EXPECT_EQ(Call(
                &Stub::StartSession, [&](auto* r) { r->set_session_id(big_id); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::GetSession, [&](auto* r) { r->set_session_id(big_id); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::CloseSession, [&](auto* r) { r->set_session_id(big_id); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::KeepAlive, [&](auto* r) { r->set_session_id(big_id); })
                .code(),
            C::kInvalidArgument);
  // Above max_message_bytes: refused by the transport before any handler.
  EXPECT_EQ(Call(&Stub::Run,
                                                [&](auto* r) {
                                                  r->set_session_id("s");
                                                  r->set_code(std::string(2 << 20, 'x'));
                                                })
                .code(),
            C::kResourceExhausted);
  EXPECT_EQ(Call(&Stub::WriteFile,
                                                              [&](auto* r) {
                                                                r->set_session_id(huge_id);
                                                                r->set_path("a");
                                                              })
                .code(),
            C::kResourceExhausted);
  // Oversized strings echoed into messages are cut, not echoed whole.
  EXPECT_EQ(Call(
                &Stub::ListTools, [&](auto* r) { r->set_dialect(big_id); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::ListTools, [&](auto* r) { r->set_provider(big_id); })
                .code(),
            C::kFailedPrecondition);
  EXPECT_EQ(Call(&Stub::CallTool,
                                                            [&](auto* r) {
                                                              r->set_session_id("s");
                                                              r->set_name("sandbox_local_run");
                                                              r->mutable_spec()->set_provider(big_id);
                                                            })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::ListSessions, [&](auto* r) { r->set_page_token(big_id); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::Run,
                                                [&](auto* r) {
                                                  r->set_session_id("s");
                                                  r->set_code("print(1)");
                                                  (*r->mutable_env())[big_id] = "v";
                                                  (*r->mutable_env())["A=B"] = "v";
                                                })
                .code(),
            C::kInvalidArgument);
  ExpectHealthy();
  ExpectNothingLeft();
}

// A length-delimited protobuf field: tag, varint length, bytes.
std::string Field(int number, const std::string& bytes) {
  std::string out(1, static_cast<char>((number << 3) | 2));
  size_t n = bytes.size();
  do {
    uint8_t b = n & 0x7f;
    n >>= 7;
    out.push_back(static_cast<char>(b | (n ? 0x80 : 0)));
  } while (n);
  return out + bytes;
}

TEST_F(BadInputTest, InvalidUtf8InStringFieldsIsRefusedAndTheDaemonStaysUp) {
  const std::string bad = "s\xff\xfe";
  for (const char* method : {"StartSession", "GetSession", "CloseSession", "KeepAlive"}) {
    absl::Status s = RawCall(method, Field(1, bad));
    // proto3 strings must be UTF-8: the request does not parse, and the
    // broker says which message.
    EXPECT_EQ(s.code(), C::kInvalidArgument) << method << ": " << s;
    EXPECT_EQ(s.message(), absl::StrCat("the request is not a valid sandboxbroker.v1.", method,
                                        "Request (string fields must be valid UTF-8)"));
  }
  EXPECT_EQ(RawCall("Run", Field(1, "s") + Field(2, "print(\xc0\xaf)")).code(), C::kInvalidArgument);
  EXPECT_EQ(RawCall("WriteFile", Field(1, "s") + Field(2, "\xed\xa0\x80")).code(), C::kInvalidArgument);
  EXPECT_EQ(RawCall("CallTool", Field(1, "s") + Field(2, "sandbox_local_run") +
                                    Field(3, "{\"code\":\"\xff\"}"))
                .code(),
            C::kInvalidArgument);
  // Garbage that is not protobuf at all.
  EXPECT_EQ(RawCall("Run", std::string("\xff\xff\xff\xff\x0f", 5)).code(), C::kInvalidArgument);
  ExpectHealthy();
  ExpectNothingLeft();
}

TEST_F(BadInputTest, NulBytesInIdsPathsAndEnvAreInvalidArgument) {
  const std::string nul("a\0b", 3);
  EXPECT_EQ(Call(
                &Stub::StartSession, [&](auto* r) { r->set_session_id(nul); })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::Run,
                                                [&](auto* r) {
                                                  r->set_session_id("s");
                                                  r->set_code("print(1)");
                                                  (*r->mutable_env())[nul] = "v";
                                                })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::Shell,
                                                  [&](auto* r) {
                                                    r->set_session_id("s");
                                                    r->set_command("true");
                                                    (*r->mutable_env())["V"] = nul;
                                                  })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::StartSession,
                                                           [&](auto* r) {
                                                             r->set_session_id("s");
                                                             (*r->mutable_spec()->mutable_env())[nul] =
                                                                 "v";
                                                           })
                .code(),
            C::kInvalidArgument);
  ExpectNothingLeft();
  // In paths: refused by the workspace (the sandbox exists by then).
  EXPECT_EQ(Call(&Stub::WriteFile,
                                                              [&](auto* r) {
                                                                r->set_session_id("s");
                                                                r->set_path(nul);
                                                              })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::ReadFile,
                                                            [&](auto* r) {
                                                              r->set_session_id("s");
                                                              r->set_path(nul);
                                                            })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(&Stub::StartSession,
                                                           [&](auto* r) {
                                                             r->set_session_id("seeded");
                                                             auto* f = r->mutable_spec()->add_files();
                                                             f->set_path(nul);
                                                           })
                .code(),
            C::kInvalidArgument);
  ExpectHealthy();
}

TEST_F(BadInputTest, NegativeHugeAndUnknownNumbersAreInvalidArgument) {
  for (int32_t t : {-1, -2147483647 - 1, 2147483647, 61}) {
    EXPECT_EQ(Call(&Stub::Run,
                                                  [&](auto* r) {
                                                    r->set_session_id("s");
                                                    r->set_code("print(1)");
                                                    r->set_timeout_seconds(t);
                                                  })
                  .code(),
              C::kInvalidArgument)
        << t;
    EXPECT_EQ(RunStream([&](auto* r) {
                r->set_session_id("s");
                r->set_code("print(1)");
                r->set_timeout_seconds(t);
              }).code(),
              C::kInvalidArgument)
        << t;
  }
  EXPECT_EQ(Call(
                &Stub::ListSessions, [&](auto* r) { r->set_page_size(-5); })
                .code(),
            C::kInvalidArgument);
  EXPECT_TRUE(Call(
                  &Stub::ListSessions, [&](auto* r) { r->set_page_size(2147483647); })
                  .ok());
  // Unknown enum values (proto3 keeps them).
  EXPECT_EQ(Call(&Stub::Run,
                                                [&](auto* r) {
                                                  r->set_session_id("s");
                                                  r->set_code("print(1)");
                                                  r->set_language(static_cast<pb::Language>(99));
                                                })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::StartSession,
                [&](auto* r) {
                  r->set_session_id("s");
                  r->mutable_spec()->set_language(static_cast<pb::Language>(-7));
                })
                .code(),
            C::kInvalidArgument);
  ExpectNothingLeft();
  EXPECT_EQ(Call(
                &Stub::WriteFile,
                [&](auto* r) {
                  r->set_session_id("s");
                  r->set_path("a");
                  r->set_encoding(static_cast<pb::Encoding>(1234));
                })
                .code(),
            C::kInvalidArgument);
  EXPECT_EQ(Call(
                &Stub::ReadFile,
                [&](auto* r) {
                  r->set_session_id("s");
                  r->set_path("a");
                  r->set_encoding(static_cast<pb::Encoding>(-1));
                })
                .code(),
            C::kInvalidArgument);
  ExpectHealthy();
}

TEST_F(BadInputTest, HostileToolArgumentsAreToolErrorsNotCrashes) {
  const std::string deep = "{\"code\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  const std::string deep_open = std::string(500000, '{');
  const std::string wide = [] {
    std::string s = "{";
    for (int i = 0; i < 20000; ++i) s += "\"k" + std::to_string(i) + "\":1,";
    return s + "\"code\":\"print(1)\"}";
  }();
  for (const std::string& args : {deep, deep_open, wide, std::string("\"code\""),
                                  std::string("{\"code\":\"x\",\"timeoutSeconds\":1e999}"),
                                  std::string("{\"code\":\"x\",\"timeoutSeconds\":-1e308}"),
                                  std::string("{\"code\":\"x\",\"language\":{\"a\":[]}}")}) {
    pb::CallToolResponse resp;
    pb::CallToolRequest req;
    req.set_session_id("tools");
    req.set_name("sandbox_local_run");
    req.set_arguments_json(args);
    auto ctx = Ctx();
    grpc::Status s = stub_->CallTool(ctx.get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.is_error()) << args.substr(0, 60);
    EXPECT_LE(resp.content().size(), 1024u);
  }
  ExpectHealthy();
  ExpectNothingLeft();
}

TEST_F(BadInputTest, TenThousandEnvEntriesWork) {
  pb::RunRequest req;
  req.set_session_id("env10k");
  req.set_code("import os\nprint(sum(1 for k in os.environ if k.startswith('V_')))");
  for (int i = 0; i < 10000; ++i) (*req.mutable_env())["V_" + std::to_string(i)] = "x";
  pb::RunResult out;
  auto ctx = Ctx();
  grpc::Status s = stub_->Run(ctx.get(), req, &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(out.output(), "10000\n");
  EXPECT_EQ(out.exit_code(), 0);
  pb::CloseSessionRequest close;
  close.set_session_id("env10k");
  pb::CloseSessionResponse closed;
  auto ctx2 = Ctx();
  ASSERT_TRUE(stub_->CloseSession(ctx2.get(), close, &closed).ok());
  ExpectHealthy();
  ExpectNothingLeft();
}

}  // namespace
}  // namespace sandbox
