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

// The ASCII fast path (8 bytes at a time) still finds every bad byte and
// lets multi-byte characters across its word boundaries through.
TEST(RepairUtf8, LongTextIsCheckedAtEveryOffset) {
  const std::string ascii(64, 'a');
  for (size_t at = 0; at < ascii.size(); ++at) {
    std::string bad = ascii;
    bad[at] = '\xFF';
    EXPECT_FALSE(IsValidUtf8(bad)) << at;
    std::string want = ascii;
    want.replace(at, 1, "\xEF\xBF\xBD");
    EXPECT_EQ(RepairUtf8(bad), want) << at;
    std::string good = ascii;
    good.insert(at, "\xE2\x82\xAC");  // the euro sign, 3 bytes
    EXPECT_TRUE(IsValidUtf8(good)) << at;
    EXPECT_EQ(RepairUtf8(good), good) << at;
  }
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
