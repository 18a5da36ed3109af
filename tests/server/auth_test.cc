#include "server/config/auth.h"

#include <gtest/gtest.h>

namespace sandbox {
namespace {

TEST(Authenticator, NoTokensMeansOneDefaultTenant) {
  Authenticator a(std::map<std::string, std::string>{});
  EXPECT_TRUE(a.open());
  EXPECT_EQ(*a.Authenticate(nullptr), "default");
}

TEST(Authenticator, MapsBearerTokensToTenants) {
  Authenticator a({{"token-of-acme", "acme"}, {"token-of-beta", "beta"}});
  absl::string_view h1 = "Bearer token-of-acme", h2 = "bearer   token-of-beta ";
  EXPECT_EQ(*a.Authenticate(&h1), "acme");
  EXPECT_EQ(*a.Authenticate(&h2), "beta");
}

TEST(Authenticator, RefusesMissingMalformedAndUnknownTokensWithoutEchoingThem) {
  Authenticator a(std::map<std::string, std::string>{{"token-of-acme", "acme"}});
  absl::string_view basic = "Basic dXNlcjo=", bare = "token-of-acme", unknown = "Bearer guess-me";
  for (const absl::string_view* h :
       std::initializer_list<const absl::string_view*>{nullptr, &basic, &bare, &unknown}) {
    auto r = a.Authenticate(h);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(r.status().message().find("guess-me"), absl::string_view::npos);
    EXPECT_EQ(r.status().message().find("token-of-acme"), absl::string_view::npos);
  }
}

}  // namespace
}  // namespace sandbox
