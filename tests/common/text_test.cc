#include "common/text.h"

#include <gtest/gtest.h>

#include <set>

namespace sandbox {
namespace {

TEST(RepairUtf8, ValidTextIsUnchanged) {
  const std::string s = "plain ascii, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80";
  EXPECT_TRUE(IsValidUtf8(s));
  EXPECT_EQ(RepairUtf8(s), s);
}

TEST(RepairUtf8, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(RepairUtf8("a\xFF"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");
  // Overlong encoding of '/', a lone surrogate, a lone continuation byte.
  EXPECT_EQ(RepairUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));
  EXPECT_EQ(RepairUtf8("\x80"), "\xEF\xBF\xBD");
  // A sequence cut at the end (as an output cap can do).
  EXPECT_EQ(RepairUtf8("ok\xE2\x82"), "ok\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_TRUE(IsValidUtf8(RepairUtf8("\xF5\x80\x80\x80 \xFE")));
}

TEST(RandomHex, IsHexOfTheAskedLengthAndDoesNotRepeat) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string h = RandomHex(16);
    ASSERT_EQ(h.size(), 32u);
    ASSERT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos);
    seen.insert(h);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

}  // namespace
}  // namespace sandbox
