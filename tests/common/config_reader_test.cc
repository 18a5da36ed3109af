#include "common/config_reader.h"

#include <gtest/gtest.h>

namespace sandbox {
namespace {

TEST(ConfigReader, ReadsTypedValuesWithDefaults) {
  auto j = nlohmann::json::parse(R"({"n": 5, "s": "x", "b": true, "m": {"a": "1"}, "l": ["p"]})");
  ConfigReader r(j, "section");
  EXPECT_EQ(r.Int("n", 1, 0, 10), 5);
  EXPECT_EQ(r.Int("absent", 7), 7);
  EXPECT_EQ(r.String("s", ""), "x");
  EXPECT_TRUE(r.Bool("b", false));
  EXPECT_EQ(r.StringMap("m").at("a"), "1");
  EXPECT_EQ(r.StringList("l").at(0), "p");
  EXPECT_TRUE(r.Finish().ok());
}

TEST(ConfigReader, UnknownKeyIsNamedWithItsPath) {
  auto j = nlohmann::json::parse(R"({"known": 1, "typo": 2})");
  ConfigReader r(j, "providers.local");
  r.Int("known", 0);
  absl::Status s = r.Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "providers.local.typo: unknown key");
}

TEST(ConfigReader, BadValuesAreNamed) {
  struct Case {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"n": "5"})", "n: must be an integer"},
      {R"({"n": 1.5})", "n: must be an integer"},
      {R"({"n": -1})", "n: must be between 0 and 10"},
      {R"({"n": 11})", "n: must be between 0 and 10"},
      {R"({"n": 18446744073709551615})", "n: must be at most 10"},
  };
  for (const auto& c : cases) {
    auto j = nlohmann::json::parse(c.json);
    ConfigReader r(j, "");
    r.Int("n", 0, 0, 10);
    EXPECT_EQ(r.Finish().message(), c.message) << c.json;
  }
  auto j = nlohmann::json::parse(R"({"e": "maybe", "m": {"a": 1}})");
  ConfigReader r(j, "x");
  r.Enum("e", "yes", {"yes", "no"});
  EXPECT_EQ(r.Finish().message(), "x.e: must be one of: yes, no");
  ConfigReader r2(j, "x");
  r2.StringMap("m");
  r2.Enum("e", "maybe", {"maybe"});
  EXPECT_EQ(r2.Finish().message(), "x.m: value of \"a\" must be a string");
}

}  // namespace
}  // namespace sandbox
