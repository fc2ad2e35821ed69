// fl-provision end to end: init, add-client, revoke, list, and its messages on bad input.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"
#include "x509_check.h"

namespace {

using ::testing::HasSubstr;

struct Result {
  int code = -1;
  std::string output;
};

class CliTest : public ::testing::Test {
 protected:
  Result Run(std::vector<std::string> args) {
    const std::string log = scratch_.File("run" + std::to_string(runs_++) + ".log");
    args.insert(args.begin(), FL_PROVISION_BIN);
    fl::testing::Subprocess p(args, log);
    Result r;
    r.code = p.Wait(std::chrono::seconds(60)).value_or(-1);
    std::ifstream in(log);
    std::ostringstream s;
    s << in.rdbuf();
    r.output = s.str();
    return r;
  }
  fl::testing::ScratchDir scratch_{"pki_cli"};
  std::string dir_ = scratch_.File("pki");
  int runs_ = 0;
};

TEST_F(CliTest, InitAddClientRevokeList) {
  Result init = Run({"init", "--dir", dir_, "--server-name", "localhost", "--server-ip", "127.0.0.1"});
  ASSERT_EQ(init.code, 0) << init.output;
  EXPECT_THAT(init.output, HasSubstr("server/server.crt"));
  Result alice = Run({"add-client", "alice", "--dir", dir_, "--days", "1"});
  ASSERT_EQ(alice.code, 0) << alice.output;
  ASSERT_EQ(Run({"add-client", "bob", "--dir", dir_}).code, 0);
  ASSERT_EQ(Run({"add-island", "isl-0", "--dir", dir_}).code, 0);

  const std::string ca = dir_ + "/ca/ca.crt", crl = dir_ + "/ca/crl.pem";
  EXPECT_EQ(fl::pki::test::VerifyCode(ca, dir_ + "/server/server.crt", crl, X509_PURPOSE_SSL_SERVER), X509_V_OK);
  EXPECT_EQ(fl::pki::test::VerifyCode(ca, dir_ + "/clients/alice.crt", crl, X509_PURPOSE_SSL_CLIENT), X509_V_OK);

  Result revoke = Run({"revoke", "alice", "--dir", dir_});
  ASSERT_EQ(revoke.code, 0) << revoke.output;
  EXPECT_THAT(revoke.output, HasSubstr("revoked client alice"));
  EXPECT_EQ(fl::pki::test::VerifyCode(ca, dir_ + "/clients/alice.crt", crl), X509_V_ERR_CERT_REVOKED);
  EXPECT_EQ(fl::pki::test::VerifyCode(ca, dir_ + "/clients/bob.crt", crl), X509_V_OK);

  Result list = Run({"list", "--dir", dir_});
  ASSERT_EQ(list.code, 0) << list.output;
  EXPECT_THAT(list.output, HasSubstr("NAME"));
  EXPECT_THAT(list.output, ::testing::ContainsRegex("alice +client +[0-9A-F]{32} .* revoked"));
  EXPECT_THAT(list.output, ::testing::ContainsRegex("bob +client +[0-9A-F]{32} .* valid"));
  EXPECT_THAT(list.output, ::testing::ContainsRegex("isl-0 +island"));
  EXPECT_THAT(list.output, ::testing::ContainsRegex("server +server"));
}

TEST_F(CliTest, BadInputIsRefusedWithAClearMessage) {
  ASSERT_EQ(Run({"init", "--dir", dir_}).code, 0);
  Result again = Run({"init", "--dir", dir_});
  EXPECT_NE(again.code, 0);
  EXPECT_THAT(again.output, HasSubstr("already exists"));

  Result unknown = Run({"revoke", "carol", "--dir", dir_});
  EXPECT_NE(unknown.code, 0);
  EXPECT_THAT(unknown.output, HasSubstr("no certificate was issued to 'carol'"));

  ASSERT_EQ(Run({"add-client", "alice", "--dir", dir_}).code, 0);
  Result twice = Run({"add-client", "alice", "--dir", dir_});
  EXPECT_NE(twice.code, 0);
  EXPECT_THAT(twice.output, HasSubstr("--force"));
  EXPECT_EQ(Run({"add-client", "alice", "--dir", dir_, "--force"}).code, 0);

  Result bad_name = Run({"add-client", "a/b", "--dir", dir_});
  EXPECT_NE(bad_name.code, 0);
  EXPECT_THAT(bad_name.output, HasSubstr("[A-Za-z0-9._-]"));

  Result no_addr = Run({"add-server", "srv", "--dir", dir_});
  EXPECT_NE(no_addr.code, 0);
  EXPECT_THAT(no_addr.output, HasSubstr("DNS name or IP address"));

  // A bad server address is refused before anything is created.
  const std::string fresh = scratch_.File("fresh");
  Result bad_ip = Run({"init", "--dir", fresh, "--server-ip", "10.0.0.300"});
  EXPECT_NE(bad_ip.code, 0);
  EXPECT_THAT(bad_ip.output, HasSubstr("10.0.0.300"));
  EXPECT_FALSE(std::filesystem::exists(fresh));

  Result no_ca = Run({"list", "--dir", scratch_.File("missing")});
  EXPECT_NE(no_ca.code, 0);
  EXPECT_THAT(no_ca.output, HasSubstr("fl-provision init"));
}

}  // namespace
