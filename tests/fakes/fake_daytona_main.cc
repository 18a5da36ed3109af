// fake-daytona: the fake Daytona server as a development tool.
//   fake-daytona --port 0 --api-key dtn_test_key
// The first line on stdout is "listening on 127.0.0.1:PORT"; the API is then
// under http://127.0.0.1:PORT/api.

#include "tests/fakes/fake_daytona.h"
#include "tests/fakes/fake_main.h"

int main(int argc, char** argv) {
  return sandbox::FakeMain<sandbox::FakeDaytona>(argc, argv, "fake-daytona");
}
