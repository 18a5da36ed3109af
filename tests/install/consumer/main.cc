// consumer ADDR: runs print(6 * 7) in a session on the broker at ADDR
// through the installed client library; prints the output.
#include <iostream>

#include "client/remote_sandbox.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer HOST:PORT\n";
    return 2;
  }
  auto sb = sandbox::RemoteSandbox::Connect(argv[1], "", "consumer");
  auto r = sb->Run("print(6 * 7)");
  if (!r.ok()) {
    std::cerr << r.status() << "\n";
    return 1;
  }
  std::cout << r->output();
  auto missing = sb->ReadFile("nope.txt");
  if (!missing.ok() || missing->has_value()) {
    std::cerr << "a missing file should read as nullopt\n";
    return 1;
  }
  return sb->Close().ok() ? 0 : 1;
}
