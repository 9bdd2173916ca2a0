#pragma once
// An exclusive advisory lock on a file (flock), held for the object's lifetime; other processes
// that lock the same path wait. Released by the kernel if the holder dies.
#include <filesystem>

namespace fastlearn {

class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path);  ///< blocks until the lock is ours
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace fastlearn
