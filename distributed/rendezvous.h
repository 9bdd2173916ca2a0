#pragma once
// Rendezvous: the key-value store through which the ranks of a job find each other, made from an init
// method: "env://" (the master address and port of the resolved environment), "tcp://host:port", or
// "file:///shared/path" (a file every rank can reach; use a fresh path per job). Rank 0 serves the TCP
// store, bound only to the master address (the c10d store has no authentication), never to every
// interface unless the master address says so (0.0.0.0).
#include <fastlearn/distributed/env.h>

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace fastlearn {

struct InitMethod {
  enum class Kind { env, tcp, file } kind = Kind::env;
  std::string host;  ///< tcp
  int port = 0;      ///< tcp
  std::string path;  ///< file
};

/// Parses an init method; ConfigError naming the accepted forms otherwise.
InitMethod parse_init_method(const std::string& text);

/// Connects this rank to the job's store (rank 0 serves it for env:// and tcp://); waits up to `timeout`
/// for the server. DistributedError naming the address on failure (port in use, nobody listening, ...).
c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env, const InitMethod& method,
                                           std::chrono::milliseconds timeout);

}  // namespace fastlearn
