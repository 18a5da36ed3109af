// Path normalisation and confinement for file operations
// (adapters/local/workspace_fs.cc), against a real directory tree with
// planted symlinks (relative, absolute, to a directory and to a file, a loop)
// and a hard link, all pointing out of the workspace.
//
// Input: op byte, then the path and the data separated by 0xFF.
// Invariants: an accepted path's components are plain names (no "", ".",
// "..", '/', NUL; at most 255 bytes); a successful write lands at exactly
// root/components with no symlink on the way (realpath equals the lexical
// path) and holds the data; a successful read returns that file's bytes from
// inside the workspace; nothing outside the workspace is ever created,
// changed or removed, including by RemoveTree.

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_join.h"
#include "adapters/local/workspace_fs.h"
#include "fuzz/fuzz_check.h"

namespace {

constexpr char kSecret[] = "host secret";

struct Tree {
  std::string base;     // temp dir
  std::string root;     // base/ws: the workspace
  std::string outside;  // base/outside: must never change
};

std::string Slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> List(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = opendir(dir.c_str());
  FUZZ_CHECK(d != nullptr);
  while (dirent* e = readdir(d)) out.insert(e->d_name);
  closedir(d);
  return out;
}

void Plant(const Tree& t) {
  FUZZ_CHECK(mkdir(t.root.c_str(), 0700) == 0);
  FUZZ_CHECK(mkdir((t.root + "/sub").c_str(), 0700) == 0);
  std::ofstream(t.root + "/sub/inside.txt") << "inside";
  FUZZ_CHECK(symlink("../outside", (t.root + "/out").c_str()) == 0);
  FUZZ_CHECK(symlink(t.outside.c_str(), (t.root + "/abs").c_str()) == 0);
  FUZZ_CHECK(symlink("../../outside/secret", (t.root + "/sub/secret").c_str()) == 0);
  FUZZ_CHECK(symlink("..", (t.root + "/sub/up").c_str()) == 0);
  FUZZ_CHECK(symlink("loop", (t.root + "/loop").c_str()) == 0);
  FUZZ_CHECK(link((t.outside + "/secret").c_str(), (t.root + "/hard").c_str()) == 0);
}

const Tree& GetTree() {
  static const Tree* tree = [] {
    char tmpl[] = "/tmp/sb-fuzz-ws-XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl) != nullptr);
    auto* t = new Tree{tmpl, std::string(tmpl) + "/ws", std::string(tmpl) + "/outside"};
    FUZZ_CHECK(mkdir(t->outside.c_str(), 0700) == 0);
    std::ofstream(t->outside + "/secret") << kSecret;
    Plant(*t);
    std::atexit([] { (void)sandbox::RemoveTree(GetTree().base); });
    return t;
  }();
  return *tree;
}

void CheckOutsideIntact(const Tree& t) {
  FUZZ_CHECK(List(t.outside) == (std::set<std::string>{".", "..", "secret"}));
  FUZZ_CHECK(Slurp(t.outside + "/secret") == kSecret);
  const std::set<std::string> base = List(t.base);
  if (base != std::set<std::string>{".", "..", "ws", "outside"}) {
    for (const std::string& n : base) std::fprintf(stderr, "in %s: %s\n", t.base.c_str(), n.c_str());
  }
  FUZZ_CHECK(base == (std::set<std::string>{".", "..", "ws", "outside"}));
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Tree& t = GetTree();
  static int runs = 0;
  if (++runs % 2000 == 0) {  // keep the tree small; RemoveTree is checked too
    FUZZ_CHECK(sandbox::RemoveTree(t.root).ok());
    Plant(t);
    CheckOutsideIntact(t);
  }
  const int op = data[0] % 3;
  absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string path(sandbox::fuzz::NextField(&in));
  const std::string contents(in);
  const sandbox::WorkspaceFs fs(t.root, "/workspace", -1, -1, 4096);

  auto parts = fs.Resolve(path);
  if (parts.ok()) {
    FUZZ_CHECK(!parts->empty());
    for (const std::string& c : *parts) {
      FUZZ_CHECK(!c.empty() && c != "." && c != ".." && c.size() <= 255);
      FUZZ_CHECK(c.find('/') == std::string::npos && c.find('\0') == std::string::npos);
    }
  } else {
    const auto code = parts.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
               code == absl::StatusCode::kPermissionDenied);
  }
  const std::string lexical = parts.ok() ? t.root + "/" + absl::StrJoin(*parts, "/") : "";

  if (op == 1) {
    absl::Status s = fs.Write(path, contents);
    if (s.ok()) {
      FUZZ_CHECK(parts.ok());
      FUZZ_CHECK(RealPath(lexical) == RealPath(t.root) + "/" + absl::StrJoin(*parts, "/"));
      FUZZ_CHECK(Slurp(lexical) == contents);
    }
  } else if (op == 2) {
    auto r = fs.Read(path);
    if (r.ok() && r->has_value()) {
      FUZZ_CHECK(parts.ok());
      FUZZ_CHECK(RealPath(lexical) == RealPath(t.root) + "/" + absl::StrJoin(*parts, "/"));
      FUZZ_CHECK(**r == Slurp(lexical));
    }
  }
  CheckOutsideIntact(t);
  return 0;
}
