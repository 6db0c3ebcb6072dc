// TcpProxy: a loopback TCP proxy that puts faults on one link between two
// daemons (the scheduler dials a node through it, or a node its
// scheduler), for the link-fault tests.
//
//   pass       bytes are forwarded, each `delay` after it arrived (0: at once);
//   cut        every connection is reset (RST) now, and new ones at accept;
//   blackhole  connections stay open but nothing is forwarded, and new ones
//              are accepted but never reach the target: a partition. Back
//              in pass, held bytes are delivered in order (as TCP would
//              retransmit them), unless a side gave up meanwhile.
//
// One thread polls every connection (no thread per connection).
// Thread-safety: SetMode/SetDelay may be called from any thread.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ballast::testing {

class TcpProxy {
 public:
  enum class Mode { kPass, kCut, kBlackhole };

  // Listens on a free loopback port at once; connections go to
  // 127.0.0.1:`target_port`.
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a = Loopback(0);
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    thread_ = std::thread([this] { Loop(); });
  }
  ~TcpProxy() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
    for (auto& c : conns_) Close(*c, /*reset=*/true);
    ::close(listen_fd_);
    ::close(wake_fd_);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  void SetMode(Mode m) {
    {
      absl::MutexLock lock(&mu_);
      mode_ = m;
    }
    Wake();
  }
  void SetDelay(absl::Duration d) {
    {
      absl::MutexLock lock(&mu_);
      delay_ = d;
    }
    Wake();
  }

 private:
  struct Chunk {
    absl::Time due;
    std::string bytes;
  };
  struct Pipe {
    int from = -1, to = -1;
    std::deque<Chunk> queue;
    bool eof = false;      // `from` closed its side
    bool shut = false;     // ... and that was passed on
    bool blocked = false;  // `to` refused bytes (EAGAIN): wait for POLLOUT
  };
  struct Conn {
    int client = -1, upstream = -1;
    Pipe up, down;  // client -> upstream, upstream -> client
    bool dead = false;
  };

  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  static void Reset(int fd) {
    if (fd < 0) return;
    linger l{1, 0};  // close sends RST
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    ::close(fd);
  }
  static void Close(Conn& c, bool reset) {
    if (c.dead) return;
    c.dead = true;
    if (reset) {
      Reset(c.client);
      Reset(c.upstream);
    } else {
      ::close(c.client);
      ::close(c.upstream);
    }
  }
  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  void Accept(Mode mode) {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      if (mode == Mode::kCut) {
        Reset(fd);
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->client = fd;
      if (mode == Mode::kPass) Connect(*c);
      conns_.push_back(std::move(c));
    }
  }
  // Dials the target for an accepted client (blocking: loopback).
  void Connect(Conn& c) {
    c.upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Loopback(target_port_);
    if (::connect(c.upstream, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      Close(c, /*reset=*/true);
      return;
    }
    ::fcntl(c.upstream, F_SETFL, ::fcntl(c.upstream, F_GETFL) | O_NONBLOCK);
    c.up = {c.client, c.upstream, {}, false, false, false};
    c.down = {c.upstream, c.client, {}, false, false, false};
  }
  // Reads what `p.from` has into the queue, due `delay` from now.
  static bool Read(Pipe& p, absl::Duration delay) {
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(p.from, buf, sizeof(buf));
      if (n > 0) {
        p.queue.push_back({absl::Now() + delay, std::string(buf, static_cast<size_t>(n))});
      } else if (n == 0) {
        p.eof = true;
        return true;
      } else {
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
    }
  }
  // Writes the chunks that are due; false if the other side is gone.
  static bool Flush(Pipe& p, absl::Time now) {
    p.blocked = false;
    while (!p.queue.empty() && p.queue.front().due <= now) {
      std::string& b = p.queue.front().bytes;
      const ssize_t n = ::send(p.to, b.data(), b.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        p.blocked = errno == EAGAIN || errno == EWOULDBLOCK;
        return p.blocked;
      }
      b.erase(0, static_cast<size_t>(n));
      if (!b.empty()) return true;
      p.queue.pop_front();
    }
    if (p.eof && p.queue.empty() && !p.shut) {
      ::shutdown(p.to, SHUT_WR);
      p.shut = true;
    }
    return true;
  }

  void Loop() {
    for (;;) {
      Mode mode;
      absl::Duration delay;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        mode = mode_;
        delay = delay_;
      }
      if (mode == Mode::kCut) {
        for (auto& c : conns_) Close(*c, /*reset=*/true);
      }
      const absl::Time now = absl::Now();
      absl::Time next = now + absl::Milliseconds(100);
      for (auto& c : conns_) {
        if (c->dead) continue;
        if (c->upstream < 0) {
          if (mode == Mode::kPass) Connect(*c);
          continue;
        }
        if (mode == Mode::kPass && !(Flush(c->up, now) && Flush(c->down, now))) {
          Close(*c, /*reset=*/true);
          continue;
        }
        // Only bytes that will be sent wake the loop (a blackhole holds
        // them; a full socket waits for POLLOUT instead).
        for (Pipe* p : {&c->up, &c->down}) {
          if (mode == Mode::kPass && !p->blocked && !p->queue.empty()) {
            next = std::min(next, p->queue.front().due);
          }
        }
        if (c->up.shut && c->down.shut) Close(*c, /*reset=*/false);
      }
      std::erase_if(conns_, [](const auto& c) { return c->dead; });
      std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      for (auto& c : conns_) {
        if (c->upstream < 0) continue;
        const short client_events = (c->up.eof ? 0 : POLLIN) | (c->down.blocked ? POLLOUT : 0);
        const short upstream_events = (c->down.eof ? 0 : POLLIN) | (c->up.blocked ? POLLOUT : 0);
        if (client_events) fds.push_back({c->client, client_events, 0});
        if (upstream_events) fds.push_back({c->upstream, upstream_events, 0});
      }
      const int timeout_ms =
          static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(next - absl::Now())));
      ::poll(fds.data(), fds.size(), timeout_ms);
      uint64_t drained;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_, &drained, sizeof(drained));
      {
        absl::MutexLock lock(&mu_);  // what changed during the poll applies now
        mode = mode_;
        delay = delay_;
      }
      if (fds[0].revents & POLLIN) Accept(mode);
      for (auto& c : conns_) {
        if (c->dead || c->upstream < 0) continue;
        if (!(Read(c->up, delay) && Read(c->down, delay))) {
          Close(*c, /*reset=*/mode != Mode::kBlackhole);  // a partition passes on nothing
        }
      }
    }
  }

  const int target_port_;
  int listen_fd_ = -1, wake_fd_ = -1, port_ = 0;
  absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kPass;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Conn>> conns_;  // the loop's thread only
  std::thread thread_;
};

}  // namespace ballast::testing
