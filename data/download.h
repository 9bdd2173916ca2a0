#pragma once
// download(): fetch a URL (http, https, file) into fastlearn's cache, verified and atomically.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace fastlearn {

/// $FASTLEARN_HOME, or ~/.fastlearn.
std::filesystem::path fastlearn_home();

struct DownloadOptions {
  std::filesystem::path dest_dir;              ///< default: fastlearn_home() / "archive"
  std::string filename;                        ///< default: the last component of the URL's path
  std::optional<std::int64_t> size;            ///< expected size in bytes, when known
  std::string md5;                             ///< expected md5 (hex), when known
  std::string sha256;                          ///< expected sha256 (hex), when known
  int retries = 3;                             ///< extra attempts after a transient failure
  std::chrono::milliseconds retry_delay{500};  ///< doubled after each failed attempt
  std::chrono::seconds connect_timeout{30};
  std::chrono::seconds stall_timeout{60};  ///< abort when under 1 byte/s for this long
  bool progress = true;                    ///< progress bar on a terminal, for files over 1 MiB
};

/// Downloads `url` to dest_dir/filename and returns that path. A cached file that passes the size and
/// checksum checks is returned at once, with no network. The transfer goes to a temporary name and is
/// renamed into place only once verified; a mismatch removes it and throws DataError with both values.
/// Concurrent calls for the same file (threads or processes) wait on a lock instead of racing.
std::filesystem::path download(const std::string& url, const DownloadOptions& options = {});

/// The file name a URL would be saved under (its path's last component, without query).
std::string url_filename(const std::string& url);

}  // namespace fastlearn
