// One try of a network probe, never blocking: a non-blocking connect to an IP
// literal, then (if there is a request) the request written and the first line
// of the answer read, bounded. The caller owns the loop: it waits on fd() for
// events(), calls OnReady(), and ends the try at its own deadline. Knows no
// HTTP: contract/probe_spec.h builds the request and judges the reply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/fd.h"

namespace dflash {

class NetProbe {
 public:
  /// Starts connecting to `host` (an IPv4 or IPv6 literal) port `port`; once
  /// connected `request` is sent (empty: the connect alone is the answer) and
  /// up to `max_reply` bytes are read, until a newline or EOF. False if it
  /// ended at once (done() is then true: a bad address, no fd, a refusal).
  bool Start(const std::string& host, int port, std::string request, size_t max_reply);

  /// Before Start: once connected, the request waits until Release() (the caller proves first who accepted
  /// the connection: common/listener_owner.h ProvePeer). While held, events() is 0 (a reset still wakes).
  void HoldRequest() { hold_ = true; }
  /// Connected, and the request held back.
  bool held() const { return hold_ && connected_ && !done_; }
  /// Lets the request go: wait for events() again.
  void Release() { hold_ = false; }

  /// The socket to wait on (-1 once done) and the epoll events it waits for.
  int fd() const { return done_ ? -1 : fd_.get(); }
  /// The socket itself, open until the probe is destroyed even once done: who is at its other end can still
  /// be asked (common/listener_owner.h ProvePeer).
  int socket() const { return fd_.get(); }
  uint32_t events() const;
  /// The socket is ready: one step as far as it goes without blocking.
  /// True once the try is over (done()).
  bool OnReady();

  bool done() const { return done_; }
  bool connected() const { return connected_; }
  /// What was read (at most max_reply bytes); `complete`: a newline or EOF ended it.
  const std::string& reply() const { return reply_; }
  bool complete() const { return complete_; }
  /// Why the try failed ("connection refused"), empty if it did not fail.
  const std::string& error() const { return error_; }

 private:
  void Finish(const std::string& error);

  UniqueFd fd_;
  std::string request_, reply_, error_;
  size_t sent_ = 0, max_reply_ = 0;
  bool connected_ = false, complete_ = false, done_ = false, hold_ = false;
};

}  // namespace dflash
