// fake-e2b: the fake E2B server as a development tool.
//   fake-e2b --port 0 --api-key e2b_test_key
// The first line on stdout is "listening on 127.0.0.1:PORT".

#include "tests/fakes/fake_e2b.h"
#include "tests/fakes/fake_main.h"

int main(int argc, char** argv) {
  return sandbox::FakeMain<sandbox::FakeE2B>(argc, argv, "fake-e2b");
}
