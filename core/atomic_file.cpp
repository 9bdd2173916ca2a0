#include <fastlearn/core/atomic_file.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ostream>
#include <random>
#include <streambuf>
#include <string>
#include <vector>

namespace fastlearn {
namespace {

[[noreturn]] void fail(const std::filesystem::path& path, std::string_view step, int error) {
  throw Error(fmt::format("cannot write '{}': {}: {}", excerpt(path.string(), 256), step, std::strerror(error)));
}

// Writes all of [data, data + size) to `fd`; returns 0 or the errno of the failed write().
int write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t done = ::write(fd, data, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (done < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += done;
    size -= static_cast<std::size_t>(done);
  }
  return 0;
}

// A buffered output stream buffer over a file descriptor that remembers the errno of the first failed
// write; std::ostream itself only reports "bad".
class FdStreamBuf : public std::streambuf {
 public:
  explicit FdStreamBuf(int fd) : fd_(fd), buffer_(std::size_t{1} << 16) { reset(); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type ch) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }

  std::streamsize xsputn(const char* data, std::streamsize size) override {
    // Large blocks (tensor data) go straight to the file instead of through the buffer.
    if (size < static_cast<std::streamsize>(buffer_.size())) return std::streambuf::xsputn(data, size);
    if (!flush_buffer()) return 0;
    if (error_ == 0) error_ = write_all(fd_, data, static_cast<std::size_t>(size));
    return error_ == 0 ? size : 0;
  }

  int sync() override { return flush_buffer() ? 0 : -1; }

  // Seeking (a writer that fills in a placeholder once it knows the value) writes out what is buffered first.
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode) override {
    if (!flush_buffer()) return pos_type(off_type(-1));
    const int whence = dir == std::ios_base::beg ? SEEK_SET : dir == std::ios_base::cur ? SEEK_CUR : SEEK_END;
    const auto at = ::lseek(fd_, off, whence);
    if (at < 0 && error_ == 0) error_ = errno;
    return pos_type(off_type(at));
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }

 private:
  void reset() { setp(buffer_.data(), buffer_.data() + buffer_.size()); }

  bool flush_buffer() {
    if (error_ == 0) error_ = write_all(fd_, pbase(), static_cast<std::size_t>(pptr() - pbase()));
    reset();
    return error_ == 0;
  }

  int fd_;
  int error_ = 0;
  std::vector<char> buffer_;
};

// The temporary file: closed and removed on destruction unless it was renamed into place.
class TempFile {
 public:
  TempFile(const std::filesystem::path& target, const std::filesystem::path& dir) {
    thread_local std::mt19937_64 random{std::random_device{}()};
    for (int attempt = 0;; ++attempt) {
      path_ = dir / fmt::format(".{}.tmp.{}.{:016x}", target.filename().string(), ::getpid(), random());
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return;
      const int error = errno;
      if (error != EEXIST || attempt == 100) {
        fail(target, fmt::format("creating the temporary '{}'", excerpt(path_.string(), 256)), error);
      }
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  int fd() const { return fd_; }
  const std::filesystem::path& path() const { return path_; }

  // Closes the descriptor; returns 0 or the errno (close() can report delayed write errors, e.g. on NFS).
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result == 0 ? 0 : errno;
  }
  void committed() { committed_ = true; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write) {
  if (!path.has_filename())
    throw Error(fmt::format("cannot write '{}': the path has no file name", excerpt(path.string(), 256)));
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  TempFile temp(path, dir);
  {
    FdStreamBuf buffer(temp.fd());
    std::ostream out(&buffer);
    out.exceptions(std::ios::badbit);  // stop the writer at the first failed write instead of letting it go on
    try {
      write(out);
      out.flush();
    } catch (const std::ios_base::failure&) {
      if (buffer.error() != 0)
        fail(path, fmt::format("writing '{}'", excerpt(temp.path().string(), 256)), buffer.error());
      throw;
    }
    if (buffer.error() != 0)
      fail(path, fmt::format("writing '{}'", excerpt(temp.path().string(), 256)), buffer.error());
    // A stream in a failed state ignores further output and flushes: what reached the file may be partial.
    if (!out) {
      throw Error(fmt::format("cannot write '{}': the writer left the output stream in a failed state",
                              excerpt(path.string(), 256)));
    }
  }
  if (::fsync(temp.fd()) != 0) {
    const int error = errno;  // read before fmt::format can change it
    fail(path, fmt::format("fsync of '{}'", excerpt(temp.path().string(), 256)), error);
  }
  if (const int error = temp.close(); error != 0)
    fail(path, fmt::format("closing '{}'", excerpt(temp.path().string(), 256)), error);
  if (::rename(temp.path().c_str(), path.c_str()) != 0) {
    const int error = errno;
    fail(path, fmt::format("renaming '{}' over it", excerpt(temp.path().string(), 256)), error);
  }
  temp.committed();

  // Without syncing the directory the rename itself may be lost on power failure. EINVAL means the file
  // system cannot sync directories (some FUSE and network file systems): nothing more can be done there.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int error = dir_fd < 0 || ::fsync(dir_fd) != 0 ? errno : 0;
  if (dir_fd >= 0) ::close(dir_fd);
  if (error != 0 && error != EINVAL) {
    fail(path,
         fmt::format("the new file is in place, but syncing its directory '{}' failed", excerpt(dir.string(), 256)),
         error);
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  write_file_atomically(
      path, [bytes](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

}  // namespace fastlearn
