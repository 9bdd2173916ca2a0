#pragma once
// An exclusive advisory lock on a file (flock), held for the object's lifetime; other processes
// that lock the same path wait. Released by the kernel if the holder dies.
#include <filesystem>
#include <memory>

namespace fastlearn {

class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path);  ///< blocks until the lock is ours
  /// Locks an existing file or directory without waiting: nullptr when another process holds its lock.
  static std::unique_ptr<FileLock> try_lock(const std::filesystem::path& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  FileLock() = default;
  int fd_ = -1;
};

}  // namespace fastlearn
