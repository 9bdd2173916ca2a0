#include <fastlearn/data/download.h>

#include <curl/curl.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/checksum.h>
#include <fastlearn/data/detail/file_lock.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace fastlearn {
namespace fs = std::filesystem;

fs::path fastlearn_home() {
  if (const char* home = std::getenv("FASTLEARN_HOME"); home && *home) return home;
  const char* user_home = std::getenv("HOME");
  if (!user_home || !*user_home) throw DataError("neither FASTLEARN_HOME nor HOME is set: cannot place the data cache");
  return fs::path(user_home) / ".fastlearn";
}

std::string url_filename(const std::string& url) {
  auto path = url.substr(0, url.find_first_of("?#"));
  const auto slash = path.find_last_of('/');
  auto name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..")
    throw DataError(
        fmt::format("cannot derive a file name from URL '{}'; pass DownloadOptions::filename", excerpt(url, 256)));
  return name;
}

namespace {

void ensure_curl_initialised() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Transfer {
  std::FILE* out = nullptr;
  std::string url;
  bool show_progress = false;
  std::chrono::steady_clock::time_point last_draw{};
};

std::size_t write_chunk(char* data, std::size_t size, std::size_t count, void* user) {
  return std::fwrite(data, size, count, static_cast<Transfer*>(user)->out) * size;
}

int draw_progress(void* user, curl_off_t total, curl_off_t done, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (!t->show_progress || total < (1 << 20) || now - t->last_draw < std::chrono::milliseconds(200)) return 0;
  t->last_draw = now;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * done / std::max<curl_off_t>(total, 1));
  std::fprintf(stderr, "\r%s [%s%s] %5.1f%% of %.1f MiB", excerpt(url_filename(t->url), 256).c_str(),
               std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(), 100.0 * done / total,
               total / 1048576.0);
  if (done >= total) std::fprintf(stderr, "\n");
  return 0;
}

enum class Outcome { ok, transient, fatal };

struct Attempt {
  Outcome outcome;
  std::string error;
};

Attempt fetch_once(const std::string& url, const fs::path& target, const DownloadOptions& options) {
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (!curl) return {Outcome::fatal, "curl_easy_init failed"};
  Transfer transfer{
      .out = std::fopen(target.c_str(), "wb"), .url = url, .show_progress = options.progress && isatty(STDERR_FILENO)};
  if (!transfer.out)
    return {Outcome::fatal, fmt::format("cannot write '{}': {}", excerpt(target.string(), 256), std::strerror(errno))};
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_PROTOCOLS_STR, "http,https,file");
  curl_easy_setopt(curl.get(), CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl.get(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl.get(), CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_CONNECTTIMEOUT, static_cast<long>(options.connect_timeout.count()));
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_LOW_SPEED_TIME, static_cast<long>(options.stall_timeout.count()));
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, write_chunk);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, draw_progress);
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, &transfer);
  curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl.get(), CURLOPT_USERAGENT, "fastlearn");
  const CURLcode code = curl_easy_perform(curl.get());
  const bool written = std::fflush(transfer.out) == 0 && fsync(fileno(transfer.out)) == 0;
  std::fclose(transfer.out);
  if (code == CURLE_OK) {
    if (!written)
      return {Outcome::fatal,
              fmt::format("writing '{}' failed: {}", excerpt(target.string(), 256), std::strerror(errno))};
    return {Outcome::ok, ""};
  }
  long status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &status);
  const std::string what =
      fmt::format("{}{}", *error ? error : curl_easy_strerror(code), status ? fmt::format(" (HTTP {})", status) : "");
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
      return {Outcome::transient, what};
    case CURLE_HTTP_RETURNED_ERROR:
      return {status >= 500 || status == 408 || status == 429 ? Outcome::transient : Outcome::fatal, what};
    default:
      return {Outcome::fatal, what};
  }
}

// Checks size and checksums; returns what is wrong, or "" when the file is as expected.
std::string verify(const fs::path& file, const DownloadOptions& options) {
  const auto size = static_cast<std::int64_t>(fs::file_size(file));
  if (options.size && size != *options.size) return fmt::format("size {} bytes, expected {}", size, *options.size);
  if (!options.md5.empty()) {
    const auto got = file_digest(file, DigestKind::md5);
    if (got != options.md5) return fmt::format("md5 {}, expected {}", got, excerpt(options.md5));
  }
  if (!options.sha256.empty()) {
    const auto got = file_digest(file, DigestKind::sha256);
    if (got != options.sha256) return fmt::format("sha256 {}, expected {}", got, excerpt(options.sha256));
  }
  return "";
}

}  // namespace

fs::path download(const std::string& url, const DownloadOptions& options) {
  const fs::path dir = options.dest_dir.empty() ? fastlearn_home() / "archive" : options.dest_dir;
  const fs::path dest = dir / (options.filename.empty() ? url_filename(url) : options.filename);
  fs::create_directories(dir);
  FileLock lock(fs::path(dest) += ".lock");

  if (fs::exists(dest)) {
    if (verify(dest, options).empty()) return dest;
    fs::remove(dest);  // a corrupt or outdated cached copy: fetch it again
  }
  ensure_curl_initialised();
  const fs::path temp = fs::path(dest) += fmt::format(".partial.{}", getpid());
  auto delay = options.retry_delay;
  for (int attempt = 0;; ++attempt) {
    const auto result = fetch_once(url, temp, options);
    if (result.outcome == Outcome::ok) break;
    fs::remove(temp);
    if (result.outcome == Outcome::fatal || attempt >= options.retries) {
      throw DataError(
          fmt::format("download of '{}' failed after {} attempt(s): {}", excerpt(url, 256), attempt + 1, result.error));
    }
    std::this_thread::sleep_for(delay);
    delay *= 2;
  }
  if (const auto problem = verify(temp, options); !problem.empty()) {
    fs::remove(temp);
    throw DataError(
        fmt::format("download of '{}' is corrupt: {}; the file was removed. If the source changed, "
                    "update the expected checksum",
                    excerpt(url, 256), problem));
  }
  fs::rename(temp, dest);
  return dest;
}

}  // namespace fastlearn
