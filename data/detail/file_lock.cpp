#include <fastlearn/data/detail/file_lock.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace fastlearn {

FileLock::FileLock(const std::filesystem::path& path) {
  std::filesystem::create_directories(path.parent_path());
  fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw DataError(fmt::format("cannot open lock file '{}': {}", excerpt(path.string(), 256), std::strerror(errno)));
  while (flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    close(fd_);
    throw DataError(fmt::format("cannot lock '{}': {}", excerpt(path.string(), 256), std::strerror(error)));
  }
}

std::unique_ptr<FileLock> FileLock::try_lock(const std::filesystem::path& path) {
  std::unique_ptr<FileLock> lock(new FileLock);
  lock->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);  // a directory opens read-only too
  if (lock->fd_ < 0)
    throw DataError(fmt::format("cannot open '{}' to lock it: {}", excerpt(path.string(), 256), std::strerror(errno)));
  while (flock(lock->fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return nullptr;
    throw DataError(fmt::format("cannot lock '{}': {}", excerpt(path.string(), 256), std::strerror(errno)));
  }
  return lock;
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // closing releases the flock
}

}  // namespace fastlearn
