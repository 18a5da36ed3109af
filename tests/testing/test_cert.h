#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace sandbox {

// A self-signed certificate for 127.0.0.1 (also its own CA).
struct Cert {
  std::string cert, key, cert_file, key_file;
};

inline Cert MakeCert(const std::string& dir) {
  Cert c;
  c.cert_file = dir + "/cert.pem";
  c.key_file = dir + "/key.pem";
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ",
      c.key_file, " -out ", c.cert_file, " 2>/dev/null");
  EXPECT_EQ(system(cmd.c_str()), 0);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  c.cert = slurp(c.cert_file);
  c.key = slurp(c.key_file);
  return c;
}

}  // namespace sandbox
