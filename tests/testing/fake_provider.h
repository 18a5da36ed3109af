#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "adapters/api/provider.h"

namespace sandbox {

// An in-memory provider that counts what happens to its sandboxes, for
// session-table tests. Creation can be held at a gate or made to fail; Exec
// can be held until released, so tests control "a call in flight".
class FakeProvider final : public Provider {
 public:
  struct Counters {
    std::atomic<int> creates{0};
    std::atomic<int> destroys{0};
    std::atomic<int> live{0};
  };

  explicit FakeProvider(std::string name = "fake") : name_(std::move(name)) {}

  absl::string_view name() const override { return name_; }

  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override {
    if (create_gate_ != nullptr) create_gate_->WaitForNotification();
    ++counters_->creates;
    {
      absl::MutexLock l(&mu_);
      if (fail_next_ > 0) {
        --fail_next_;
        return absl::UnavailableError("fake: create failed");
      }
      last_spec_ = spec;
    }
    ++counters_->live;
    return std::unique_ptr<Sandbox>(
        new FakeSandbox(absl::StrCat(name_, "-", ++next_id_), counters_, exec_gate_, usage_hook_));
  }

  void FailNextCreates(int n) {
    absl::MutexLock l(&mu_);
    fail_next_ = n;
  }
  // Creation blocks until the notification fires (set before use).
  void set_create_gate(absl::Notification* n) { create_gate_ = n; }
  // Exec blocks until the notification fires (set before use).
  void set_exec_gate(std::shared_ptr<absl::Notification> n) { exec_gate_ = std::move(n); }
  // Runs inside each sandbox's Usage() (set before use).
  void set_usage_hook(std::function<void()> f) {
    usage_hook_ = std::make_shared<std::function<void()>>(std::move(f));
  }
  std::shared_ptr<Counters> counters() const { return counters_; }
  SandboxSpec last_spec() {
    absl::MutexLock l(&mu_);
    return last_spec_;
  }

 private:
  class FakeSandbox final : public Sandbox {
   public:
    FakeSandbox(std::string id, std::shared_ptr<Counters> c,
                std::shared_ptr<absl::Notification> gate,
                std::shared_ptr<std::function<void()>> usage_hook)
        : id_(std::move(id)),
          counters_(std::move(c)),
          gate_(std::move(gate)),
          usage_hook_(std::move(usage_hook)) {}
    std::optional<SandboxUsage> Usage() const override {
      if (usage_hook_) (*usage_hook_)();
      return SandboxUsage{};
    }
    const std::string& id() const override { return id_; }
    absl::StatusOr<ExecResult> Exec(const ExecRequest& r) override {
      if (gate_) gate_->WaitForNotification();
      ExecResult out;
      out.output = r.code;
      return out;
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
    absl::Status Destroy() override {
      if (!destroyed_.exchange(true)) {
        ++counters_->destroys;
        --counters_->live;
      }
      return absl::OkStatus();
    }

   private:
    const std::string id_;
    std::shared_ptr<Counters> counters_;
    std::shared_ptr<absl::Notification> gate_;
    std::shared_ptr<std::function<void()>> usage_hook_;
    std::atomic<bool> destroyed_{false};
    absl::Mutex mu_;
    std::map<std::string, std::string> files_ ABSL_GUARDED_BY(mu_);
  };

  const std::string name_;
  std::shared_ptr<Counters> counters_ = std::make_shared<Counters>();
  absl::Notification* create_gate_ = nullptr;
  std::shared_ptr<absl::Notification> exec_gate_;
  std::shared_ptr<std::function<void()>> usage_hook_;
  std::atomic<int> next_id_{0};
  absl::Mutex mu_;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  SandboxSpec last_spec_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
