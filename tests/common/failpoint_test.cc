#include "common/failpoint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/log.h"

namespace sandbox {
namespace {

TEST(FailpointTest, ParsesActionsAndRefusesTyposNamingTheEntry) {
  EXPECT_TRUE(SetFailpoints("a=sleep(0); b = kill ;").ok());
  EXPECT_TRUE(SetFailpoints("").ok());
  for (const char* bad :
       {"a", "a=sleep", "a=sleep(-1)", "a=sleep(600001)", "a=sleep(1x)", "=kill", "a=stop"}) {
    absl::Status s = SetFailpoints(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("SANDBOX_BROKER_FAILPOINTS"), std::string::npos) << s;
  }
  EXPECT_TRUE(SetFailpoints("").ok());
}

TEST(FailpointTest, OnlyTheArmedPointActsAndSaysSo) {
  std::vector<std::string> lines;
  SetLogSink([&](absl::string_view line) { lines.emplace_back(line); });
  ASSERT_TRUE(SetFailpoints("fp.test=sleep(200)").ok());
  const absl::Time t0 = absl::Now();
  Failpoint("fp.other");  // not armed
  Failpoint("fp.test");
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(200));
  ASSERT_TRUE(SetFailpoints("").ok());
  Failpoint("fp.test");  // disarmed
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("failpoint.hit name=fp.test action=sleep(200)"), std::string::npos)
      << lines[0];
}

}  // namespace
}  // namespace sandbox
