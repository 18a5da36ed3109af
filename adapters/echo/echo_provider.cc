#include "adapters/echo/echo_provider.h"

#include <atomic>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adapters/api/output.h"
#include "common/config_reader.h"
#include "common/event_loop.h"
#include "common/status_macros.h"

namespace sandbox {
namespace {

std::atomic<uint64_t> next_id{0};

class EchoSandbox final : public Sandbox {
 public:
  explicit EchoSandbox(int64_t hold_ms)
      : id_(absl::StrCat("echo-", ++next_id)), hold_(absl::Milliseconds(hold_ms)) {}
  const std::string& id() const override { return id_; }

  absl::StatusOr<ExecResult> Exec(const ExecRequest& r) override {
    if (hold_ > absl::ZeroDuration()) absl::SleepFor(hold_);
    return Echo(r);
  }

  void ExecAsync(ExecRequest r, ExecDone done) override {
    if (hold_ <= absl::ZeroDuration()) {
      done(Echo(r));
      return;
    }
    EventLoop::Shared()->After(hold_,
                               [r = std::move(r), done = std::move(done)] { done(Echo(r)); });
  }

  static absl::StatusOr<ExecResult> Echo(const ExecRequest& r) {
    OutputCollector out(r.max_output_bytes, r.on_output);
    out.Append(OutputStream::kStdout, r.code);
    ExecResult result;
    result.truncated = out.truncated();
    result.output = out.Take();
    return result;
  }
  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    absl::MutexLock l(&mu_);
    files_[std::string(path)] = std::string(data);
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    absl::MutexLock l(&mu_);
    auto it = files_.find(std::string(path));
    if (it == files_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  // In memory: answered at once, or after hold_ms on a timer, like runs.
  void WriteFileAsync(std::string path, std::string data, StatusDone done) override {
    Later([this, path = std::move(path), data = std::move(data), done = std::move(done)] {
      done(WriteFile(path, data));
    });
  }
  void ReadFileAsync(std::string path, ReadDone done) override {
    Later([this, path = std::move(path), done = std::move(done)] { done(ReadFile(path)); });
  }
  absl::Status Destroy() override { return absl::OkStatus(); }

 private:
  void Later(std::function<void()> fn) {
    if (hold_ <= absl::ZeroDuration()) return fn();
    EventLoop::Shared()->After(hold_, std::move(fn));
  }

  const std::string id_;
  const absl::Duration hold_;
  absl::Mutex mu_;
  std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<EchoProvider>> EchoProvider::Create(const nlohmann::json& config) {
  ConfigReader r(config, "providers.echo");
  const int64_t hold_ms = r.Int("hold_ms", 0, 0, 3600000);
  RETURN_IF_ERROR(r.Finish());
  return std::make_unique<EchoProvider>(hold_ms);
}

absl::StatusOr<std::unique_ptr<Sandbox>> EchoProvider::Create(const SandboxSpec&) {
  return std::unique_ptr<Sandbox>(new EchoSandbox(hold_ms_));
}

}  // namespace sandbox
