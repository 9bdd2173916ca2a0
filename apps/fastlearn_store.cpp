// fastlearn-store: the rendezvous store of `fastlearn launch`, which starts it (distributed/store_process.h) so
// that the launcher itself never loads LibTorch. Serves LibTorch's TCPStore on the socket it is given, writes
// "ready" once it does, and exits when the launcher closes the lifeline (or dies).
#include <fastlearn/distributed/launch_store.h>
#include <fastlearn/distributed/store_process.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  try {
    std::string addr;
    int port = 0;
    const auto fds = fastlearn::detail::parse_store_child_args(argc, argv, addr, port);
    for (int fd : {fds.listen, fds.ready, fds.lifeline}) fcntl(fd, F_SETFD, FD_CLOEXEC);
    const auto server = fastlearn::detail::serve_store_here(addr, {.fd = fds.listen, .port = port});
    if (write(fds.ready, "ready\n", 6) != 6) return 1;  // the launcher is gone
    close(fds.ready);
    char byte = 0;
    for (;;) {
      const auto got = read(fds.lifeline, &byte, 1);
      if (got == 0 || (got < 0 && errno != EINTR)) break;
    }
    std::fflush(stderr);
    _exit(0);  // no destructors: the store's thread ends with the process
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fastlearn-store: error: %s\n", e.what());
    return 1;
  }
}
