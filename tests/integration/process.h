// Child processes for integration tests: spawn `ballast` subcommands with
// their output in a log file, signal them, and reap them. Also free loopback
// ports and a minimal HTTP GET for /metrics.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/ports.h"

namespace ballast::testing {

class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log_path)
      : log_path_(log_path) {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~ChildProcess() { Stop(SIGTERM); }
  pid_t pid() const { return pid_; }

  // Sends `sig` and reaps the child (SIGKILL after 10 s).
  int Stop(int sig) {
    if (pid_ <= 0) return exit_status_;
    kill(pid_, sig);
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        exit_status_ = status;
        return status;
      }
      usleep(10000);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &exit_status_, 0);
    pid_ = -1;
    return exit_status_;
  }
  // Sends `sig` without waiting (SIGSTOP, SIGCONT).
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Reaps the child if it has exited (a zombie still answers kill(pid, 0)).
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return false;
    }
    return true;
  }
  std::string Log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int exit_status_ = 0;
  std::string log_path_;
};

// A loopback port free now, for a child process to listen on. Chosen at
// random below the kernel's ephemeral range (32768 and up by default), so
// neither the outgoing connections of tests running beside this one nor
// their own port 0 binds take it before the child binds it (a CI run
// failed when a scheduler's metrics port, picked by binding port 0, was
// taken by the time the scheduler started). A port is never handed out
// twice in one process: the children have not bound the earlier ones yet,
// so they would still look free (a CI run failed when a second node was
// given the scheduler's metrics port). Not thread-safe: call from the
// test's thread.
inline int FreePort() {
  static std::mt19937 rng(static_cast<unsigned>(getpid()) * 2654435761u ^
                          static_cast<unsigned>(time(nullptr)));
  static std::set<int> handed_out;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    if (handed_out.count(port) > 0) continue;
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) {
      handed_out.insert(port);
      return port;
    }
  }
  // Kernel-chosen ports, still never one handed out before.
  for (;;) {
    const int port = server::FreeLoopbackPort();
    if (handed_out.insert(port).second) return port;
  }
}

// Waits until something accepts TCP connections on 127.0.0.1:port.
inline bool WaitForPort(int port, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    if (ok) return true;
    usleep(20000);
  }
  return false;
}

// GET http://127.0.0.1:port/path; returns the body ("" on failure).
inline std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (write(fd, req.data(), req.size()) < 0) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

}  // namespace ballast::testing
