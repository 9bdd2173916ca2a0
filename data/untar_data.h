#pragma once
// untar_data(): a data set by URL (or a known source), downloaded, verified, extracted once into
// fastlearn's cache, and its folder returned. Wrap it in rank0_first in distributed programs.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

/// One file of a data source: where it is, and what it must be.
struct RemoteFile {
  std::string url;
  std::string md5;                   ///< hex, or "" if unknown
  std::string sha256;                ///< hex, or "" if unknown
  std::optional<std::int64_t> size;  ///< bytes, if known
};

/// A named data set made of one or more files; archives among them are extracted, others copied.
struct DataSource {
  std::string name;  ///< folder name under the cache's data/ directory
  std::vector<RemoteFile> files;
  /// The class names, in label order, when the files do not carry them (IDX files hold label numbers only):
  /// written to classes.txt in the folder, one per line, where ImageDataLoaders::from_idx reads them.
  std::vector<std::string> classes;
};

struct UntarOptions {
  std::filesystem::path cache_dir;  ///< default: fastlearn_home(); archives go to archive/, data to data/
  bool force = false;               ///< fetch and extract again even if cached
  bool progress = true;
};

/// Fetches every file of `source` and returns cache/data/<name>, complete: made in a temporary folder and
/// renamed, under a lock, so a concurrent call (another process) waits and then sees the finished folder.
/// An archive whose content is one top folder is flattened into data/<name>. A folder cached before its source
/// named its classes gets classes.txt on the next call.
std::filesystem::path untar_data(const DataSource& source, const UntarOptions& options = {});

/// untar_data of one archive URL, named after its file name without the archive extension.
std::filesystem::path untar_data(const std::string& url, const UntarOptions& options = {});

namespace urls {

/// Fashion-MNIST's ten class names, in label order (Zalando's: "T-shirt/top", "Trouser", ..., "Ankle boot").
const std::vector<std::string>& fashion_mnist_classes();

/// Fashion-MNIST from Debian's dataset-fashion-mnist package (four gzipped IDX files as file:// URLs) with its
/// class names.
/// Debian recompressed the official .gz files, so their md5 sums are those of the package's files; the
/// decompressed IDX content is Zalando's. `dir` overrides the package's folder.
DataSource fashion_mnist(const std::filesystem::path& dir = "/usr/share/datasets/fashion-mnist");

/// Fashion-MNIST from a mirror of the official files at `base_url`, checked against Zalando's md5 sums, with its
/// class names.
DataSource fashion_mnist_official(const std::string& base_url);

}  // namespace urls
}  // namespace fastlearn
