// fl-provision: creates and maintains the testbed's certificate authority (docs/security.md).
#include <cstdio>
#include <ctime>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fl/pki/pki.h"

namespace {

int Fail(const absl::Status& s) {
  std::cerr << "fl-provision: " << s.message() << "\n";
  return 1;
}

void PrintIssued(const fl::pki::Issued& i, const std::string& dir) {
  const fl::pki::Paths paths{dir};
  std::cout << "issued " << fl::pki::KindName(i.kind) << " certificate " << i.name << " (serial " << i.serial_hex
            << ", valid until " << fl::pki::FormatTime(i.not_after) << "): " << paths.Cert(i.kind, i.name) << ", "
            << paths.Key(i.kind, i.name) << "\n";
  if (i.kind == fl::pki::Kind::kIsland) {
    std::cout << "CurveZMQ key pair for the ring: " << paths.CurvePublic(i.name) << ", " << paths.CurveSecret(i.name)
              << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fl-provision: the testbed's certificate authority (root CA, server/client/island certificates, CRL)"};
  app.require_subcommand(1);
  std::string dir;
  int days = 365;
  bool force = false;

  // init
  CLI::App* init = app.add_subcommand("init", "create a new CA in a new or empty directory (and a server certificate)");
  int ca_days = 3650;
  int crl_days = 30;
  std::string ca_name = "fl-testbed root CA";
  std::string server_cert_name = "server";
  std::vector<std::string> server_names, server_ips;
  init->add_option("--dir", dir, "the CA's directory (must not exist, or be empty)")->required();
  init->add_option("--ca-days", ca_days, "validity of the root CA in days")->check(CLI::Range(1, 36500));
  init->add_option("--ca-name", ca_name, "the root CA's common name");
  init->add_option("--crl-days", crl_days, "days until the CRL must be re-signed (`fl-provision crl`)")
      ->check(CLI::Range(1, 3650));
  init->add_option("--days", days, "validity of the server certificate in days")->check(CLI::Range(1, 36500));
  init->add_option("--server-name", server_names, "a DNS name of the server (repeatable): issues server/<cert>.crt");
  init->add_option("--server-ip", server_ips, "an IP address of the server (repeatable)");
  init->add_option("--server-cert", server_cert_name, "file name of the server certificate in server/");

  // add-client, add-island, add-server
  std::string name;
  std::vector<std::string> dns, ips;
  auto add_issue_options = [&](CLI::App* sub) {
    sub->add_option("name", name, "1-64 characters of [A-Za-z0-9._-]")->required();
    sub->add_option("--dir", dir, "the CA's directory (made by `init`)")->required();
    sub->add_option("--days", days, "validity in days")->check(CLI::Range(1, 36500));
    sub->add_flag("--force", force, "replace an existing certificate and key of that name (the old one is revoked)");
  };
  CLI::App* add_client = app.add_subcommand("add-client", "issue a client certificate (CN and fl-client://<name>)");
  add_issue_options(add_client);
  CLI::App* add_island = app.add_subcommand(
      "add-island", "issue an island certificate (CN and fl-island://<name>) and its CurveZMQ key pair for the ring");
  add_issue_options(add_island);
  CLI::App* add_server = app.add_subcommand("add-server", "issue a server certificate for DNS names and IPs");
  add_issue_options(add_server);
  add_server->add_option("--dns", dns, "a DNS name clients dial (repeatable)");
  add_server->add_option("--ip", ips, "an IP address clients dial (repeatable)");

  // revoke, crl, list
  std::string kind_text;
  CLI::App* revoke = app.add_subcommand("revoke", "revoke a name's certificate and rewrite ca/crl.pem");
  revoke->add_option("name", name, "the name given at issue")->required();
  revoke->add_option("--dir", dir, "the CA's directory")->required();
  revoke->add_option("--kind", kind_text, "server, client or island (when a name is several)");
  CLI::App* crl = app.add_subcommand("crl", "re-sign ca/crl.pem with a fresh nextUpdate (run before it lapses)");
  crl->add_option("--dir", dir, "the CA's directory")->required();
  CLI::App* list = app.add_subcommand("list", "list what the CA issued");
  list->add_option("--dir", dir, "the CA's directory")->required();

  CLI11_PARSE(app, argc, argv);

  fl::pki::IssueOptions issue;
  issue.validity = fl::pki::Validity::Days(days);
  issue.force = force;

  if (init->parsed()) {
    fl::pki::CaOptions o;
    o.common_name = ca_name;
    o.validity = fl::pki::Validity::Days(ca_days);
    o.crl_days = crl_days;
    // The server certificate's arguments are checked before the CA exists, so a typo leaves no half-made directory.
    issue.dns_names = server_names;
    issue.ip_addresses = server_ips;
    const bool with_server = !server_names.empty() || !server_ips.empty();
    if (with_server) {
      if (absl::Status s = fl::pki::ValidateIssue(fl::pki::Kind::kServer, server_cert_name, issue); !s.ok()) {
        return Fail(s);
      }
    }
    if (absl::Status s = fl::pki::CreateCa(dir, o); !s.ok()) return Fail(s);
    std::cout << "created CA '" << ca_name << "' in " << dir << " (" << fl::pki::Paths{dir}.CaCert() << ")\n";
    if (with_server) {
      absl::StatusOr<fl::pki::Issued> i = fl::pki::Issue(dir, fl::pki::Kind::kServer, server_cert_name, issue);
      if (!i.ok()) return Fail(i.status());
      PrintIssued(*i, dir);
    }
    return 0;
  }
  for (auto [sub, kind] : {std::pair{add_client, fl::pki::Kind::kClient}, std::pair{add_island, fl::pki::Kind::kIsland},
                           std::pair{add_server, fl::pki::Kind::kServer}}) {
    if (!sub->parsed()) continue;
    issue.dns_names = dns;
    issue.ip_addresses = ips;
    absl::StatusOr<fl::pki::Issued> i = fl::pki::Issue(dir, kind, name, issue);
    if (!i.ok()) return Fail(i.status());
    PrintIssued(*i, dir);
    return 0;
  }
  if (revoke->parsed()) {
    fl::pki::Kind kind{};
    if (!kind_text.empty()) {
      absl::StatusOr<fl::pki::Kind> k = fl::pki::ParseKind(kind_text);
      if (!k.ok()) return Fail(k.status());
      kind = *k;
    }
    absl::StatusOr<std::vector<fl::pki::Issued>> r = fl::pki::Revoke(dir, name, kind_text.empty() ? nullptr : &kind);
    if (!r.ok()) return Fail(r.status());
    for (const fl::pki::Issued& i : *r) {
      std::cout << "revoked " << fl::pki::KindName(i.kind) << " " << i.name << " (serial " << i.serial_hex << ")\n";
    }
    std::cout << "wrote " << fl::pki::Paths{dir}.Crl() << "\n";
    return 0;
  }
  if (crl->parsed()) {
    if (absl::Status s = fl::pki::RefreshCrl(dir); !s.ok()) return Fail(s);
    std::cout << "wrote " << fl::pki::Paths{dir}.Crl() << "\n";
    return 0;
  }
  if (list->parsed()) {
    absl::StatusOr<std::vector<fl::pki::Issued>> all = fl::pki::List(dir);
    if (!all.ok()) return Fail(all.status());
    const int64_t now = ::time(nullptr);
    std::printf("%-24s %-7s %-32s %-20s %s\n", "NAME", "KIND", "SERIAL", "NOT-AFTER", "STATUS");
    for (const fl::pki::Issued& i : *all) {
      std::string status = i.revoked            ? "revoked " + fl::pki::FormatTime(i.revoked_at)
                           : i.not_after <= now ? "expired"
                                                : "valid";
      if (!i.current) status += " (replaced)";
      std::printf("%-24s %-7s %-32s %-20s %s\n", i.name.c_str(), std::string(fl::pki::KindName(i.kind)).c_str(),
                  i.serial_hex.c_str(), fl::pki::FormatTime(i.not_after).c_str(), status.c_str());
    }
    return 0;
  }
  return 0;
}
