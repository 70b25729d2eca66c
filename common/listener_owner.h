// Whose is the server on a TCP port? A connect that succeeds proves only that
// *something* listens: another local user can bind a port between our probe and
// our own server's bind (or squat a port reserved for a process of ours) and be
// handed our password, or be judged ready in its place. The kernel knows which
// socket listens (/proc/net/tcp, tcp6: address, state, owner uid, inode) and
// which process holds it (/proc/<pid>/fd -> socket:[inode]), so a listener is
// taken as ours only when its socket is among the fds of the process tree we
// spawned. Like ss(8) -p, read straight from /proc: no library does this.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace dflash {

/// One listening TCP socket of this network namespace.
struct TcpListener {
  std::string address;  ///< "127.0.0.1:6379", "[::]:6379"
  uid_t uid = 0;        ///< who created the socket
  ino_t inode = 0;
};

/// Every TCP socket in LISTEN state on `port` (any address, IPv4 and IPv6).
/// False only if neither /proc/net/tcp nor /proc/net/tcp6 could be read.
bool ListTcpListeners(int port, std::vector<TcpListener>* out, std::string* err);

/// A process that holds socket `inode` open, found among the /proc/<pid>/fd we
/// may read (all of them as root), or -1.
pid_t FindSocketHolder(ino_t inode);

enum class ListenerProof {
  kNone,     ///< nothing listens on the port (yet)
  kOurs,     ///< every listener on it is a socket held by a process of the tree
  kForeign,  ///< one is not: `who` names it
};

/// Proves (or refuses) that what listens on `port` belongs to the tree of
/// `root` (ProcessTree, common/proc_scan.h). kForeign: `who` is "uid 65534 (nobody), pid 812 (python3), listening
/// on 127.0.0.1:23456" (the pid where /proc lets us find it). kNone also when
/// /proc/net cannot be read (`err` then says why): nothing is proven.
ListenerProof ProveListener(int port, pid_t root, std::string* who, std::string* err);

enum class PeerProof {
  kOurs,     ///< the socket that accepted the connection is held by a process of the tree
  kForeign,  ///< it is held by a process outside the tree: `who` names it
  kPending,  ///< not (yet) held by anyone: still in the listener's accept queue, or closed, or not on this host
};

/// Who is at the other end of the connected TCP socket `fd`? The kernel's socket for the connection's far end
/// (/proc/net/tcp, tcp6: its local address is our peer, its peer our local address) is proven to be held by
/// a process of `root`'s tree, or refused naming whoever holds it. A connection is one pair of sockets for its
/// whole life: once the far one is proven ours, every byte that comes back on `fd` was written by our tree
/// (an impostor that accepted it first cannot hand it over to us). `who` as ProveListener's.
PeerProof ProvePeer(int fd, pid_t root, std::string* who);

}  // namespace dflash
