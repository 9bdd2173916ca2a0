#pragma once
// Internal: TCP ports on this host for the rendezvous — a listening socket (rank 0's store, the launcher's store)
// and a free port for a program that must bind it itself (torchrun, Python DDP in the benchmarks).
#include <string>

namespace fastlearn::detail {

struct ListeningSocket {
  int fd = -1;
  int port = 0;
};

/// A socket bound to `host`:`port` (0: a port the kernel picks) and listening, close-on-exec. Throws
/// std::runtime_error with the bare reason ("cannot resolve ...", "Address already in use"): the caller says who
/// listens and what to do.
ListeningSocket listen_tcp(const std::string& host, int port);

/// A port of `host` free at this moment, for a program that binds it later. Taken at random from below the
/// kernel's ephemeral range (ip_local_port_range), where neither bind() to port 0 nor outgoing connections take
/// ports, so only another explicit choice can collide in between; the kernel's pick when that range is full.
/// Throws std::runtime_error like listen_tcp.
int free_port_for_later(const std::string& host);

}  // namespace fastlearn::detail
