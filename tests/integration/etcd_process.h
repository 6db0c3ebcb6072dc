// A single-member etcd (Debian's etcd-server, /usr/bin/etcd) on loopback
// ports in a temporary directory, for the tests of the etcd state store
// and of a highly available scheduler pair. Tests skip when it is missing
// (deploy/install-deps.sh installs it).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/process.h"

namespace ballast::testing {

class EtcdProcess {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static bool Installed() { return std::filesystem::exists(kBinary); }

  // Starts it under `dir` (created) and waits until its client port
  // accepts; ok() says whether it did.
  explicit EtcdProcess(const std::filesystem::path& dir) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    port_ = FreePort();
    const int peer = FreePort();
    const std::string client = absl::StrCat("http://127.0.0.1:", port_);
    const std::string peers = absl::StrCat("http://127.0.0.1:", peer);
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{kBinary, "--name", "t", "--data-dir", (dir_ / "data").string(),
                                 "--listen-client-urls", client, "--advertise-client-urls", client,
                                 "--listen-peer-urls", peers, "--initial-advertise-peer-urls",
                                 peers, "--initial-cluster", "t=" + peers},
        (dir_ / "etcd.log").string());
    ok_ = WaitForPort(port_, 20000);
  }
  bool ok() const { return ok_; }
  int port() const { return port_; }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Log() const { return process_->Log(); }
  void Signal(int sig) { process_->Signal(sig); }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  bool ok_ = false;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace ballast::testing
