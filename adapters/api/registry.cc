#include "adapters/api/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/event_loop.h"

namespace sandbox {

absl::string_view LanguageName(Language language) {
  switch (language) {
    case Language::kPython:
      return "python";
    case Language::kNode:
      return "node";
    case Language::kShell:
      return "shell";
  }
  return "python";
}

void Sandbox::ExecAsync(ExecRequest request, ExecDone done) {
  WorkPool::Shared()->Submit(
      [this, request = std::move(request), done = std::move(done)]() { done(Exec(request)); });
}

void Sandbox::WriteFileAsync(std::string path, std::string data, StatusDone done) {
  WorkPool::Shared()->Submit([this, path = std::move(path), data = std::move(data),
                              done = std::move(done)]() { done(WriteFile(path, data)); });
}

void Sandbox::ReadFileAsync(std::string path, ReadDone done) {
  WorkPool::Shared()->Submit(
      [this, path = std::move(path), done = std::move(done)]() { done(ReadFile(path)); });
}

void Sandbox::FilesAsync(FileOp op, FilesDone done) {
  WorkPool::Shared()->Submit(
      [this, op = std::move(op), done = std::move(done)]() { done(Files(op)); });
}

void Sandbox::CodeAsync(CodeOp op, CodeDone done) {
  WorkPool::Shared()->Submit(
      [this, op = std::move(op), done = std::move(done)]() { done(Code(op)); });
}

void Sandbox::KeepAliveAsync(StatusDone done) {
  WorkPool::Shared()->Submit([this, done = std::move(done)]() { done(KeepAlive()); });
}

void Sandbox::DestroyAsync(StatusDone done) {
  WorkPool::Shared()->Submit([this, done = std::move(done)]() { done(Destroy()); });
}

void Provider::CreateAsync(SandboxSpec spec, SandboxDone done) {
  WorkPool::Shared()->Submit(
      [this, spec = std::move(spec), done = std::move(done)]() { done(Create(spec)); });
}

void Provider::AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) {
  WorkPool::Shared()->Submit([this, id = std::move(sandbox_id), spec = std::move(spec),
                              done = std::move(done)]() { done(Attach(id, spec)); });
}

void ProviderRegistry::Add(std::unique_ptr<Provider> provider) {
  std::string name(provider->name());
  unavailable_.erase(name);
  providers_[name] = std::move(provider);
}

void ProviderRegistry::AddUnavailable(std::string name, std::string reason) {
  providers_.erase(name);
  unavailable_[std::move(name)] = std::move(reason);
}

absl::StatusOr<Provider*> ProviderRegistry::Find(absl::string_view name) const {
  if (auto it = providers_.find(name); it != providers_.end()) {
    return it->second.get();
  }
  if (auto it = unavailable_.find(name); it != unavailable_.end()) {
    return absl::FailedPreconditionError(it->second);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "unknown provider \"", name, "\" (configured: ", absl::StrJoin(Names(), ", "), ")"));
}

std::vector<std::string> ProviderRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : providers_) out.push_back(name);
  return out;
}

}  // namespace sandbox

namespace sandbox {
std::vector<std::string> ProviderRegistry::UnavailableNames() const {
  std::vector<std::string> out;
  for (const auto& [name, reason] : unavailable_) out.push_back(name);
  return out;
}
}  // namespace sandbox
