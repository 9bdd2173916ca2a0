#include <fastlearn/data/untar_data.h>

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/archive.h>
#include <fastlearn/data/detail/file_lock.h>
#include <fastlearn/data/download.h>
#include <fmt/format.h>
#include <unistd.h>

namespace fastlearn {
namespace fs = std::filesystem;

namespace {

constexpr const char* kClassesFile = "classes.txt";  // what ImageDataLoaders::from_idx reads

void write_classes(const fs::path& dir, const std::vector<std::string>& classes) {
  std::string text;
  for (const auto& name : classes) text += name + "\n";
  write_file_atomically(dir / kClassesFile, text);
}

std::string strip_archive_extension(std::string name) {
  for (const char* ext : {".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz2", ".txz", ".tar", ".zip"}) {
    if (name.ends_with(ext)) return name.substr(0, name.size() - std::string_view(ext).size());
  }
  return name;
}

// If `dir` holds exactly one folder and nothing else, that folder; else `dir`.
fs::path single_top_folder(const fs::path& dir) {
  fs::path only;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    only = entry.path();
    if (++count > 1) return dir;
  }
  return count == 1 && fs::is_directory(fs::symlink_status(only)) ? only : dir;
}

}  // namespace

fs::path untar_data(const DataSource& source, const UntarOptions& options) {
  if (source.name.empty() || !fs::path(source.name).has_filename() || source.name.find('/') != std::string::npos ||
      source.name == "." || source.name == "..") {
    throw DataError(
        fmt::format("untar_data: invalid data source name '{}': use a plain folder name", excerpt(source.name)));
  }
  if (source.files.empty())
    throw DataError(fmt::format("untar_data: data source '{}' lists no files", excerpt(source.name)));
  const fs::path home = options.cache_dir.empty() ? fastlearn_home() : options.cache_dir;
  const fs::path data_dir = home / "data";
  const fs::path dest = data_dir / source.name;
  fs::create_directories(data_dir);
  FileLock lock(data_dir / (source.name + ".lock"));
  if (fs::exists(dest) && !options.force) {  // complete: it only ever appears by rename
    if (!source.classes.empty() && !fs::exists(dest / kClassesFile)) write_classes(dest, source.classes);
    return dest;
  }

  const fs::path staging = data_dir / fmt::format("{}.staging.{}", source.name, getpid());
  fs::remove_all(staging);
  fs::create_directories(staging);
  try {
    for (const auto& file : source.files) {
      DownloadOptions download_options{.dest_dir = home / "archive",
                                       .size = file.size,
                                       .md5 = file.md5,
                                       .sha256 = file.sha256,
                                       .progress = options.progress};
      const fs::path fetched = download(file.url, download_options);
      if (is_archive(fetched)) {
        const fs::path unpacked = staging / strip_archive_extension(fetched.filename().string());
        extract_archive(fetched, unpacked);
        if (source.files.size() == 1) {
          // One archive is the whole data set: its content (or its single top folder) becomes dest.
          const fs::path top = single_top_folder(unpacked);
          const fs::path flat = data_dir / fmt::format("{}.flat.{}", source.name, getpid());
          fs::rename(top, flat);
          fs::remove_all(staging);
          fs::rename(flat, staging);
        }
      } else {
        fs::copy_file(fetched, staging / fetched.filename(), fs::copy_options::overwrite_existing);
      }
    }
    if (!source.classes.empty()) write_classes(staging, source.classes);
    if (fs::exists(dest)) fs::remove_all(dest);  // only with force
    fs::rename(staging, dest);
  } catch (...) {
    fs::remove_all(staging);
    throw;
  }
  return dest;
}

fs::path untar_data(const std::string& url, const UntarOptions& options) {
  return untar_data(DataSource{strip_archive_extension(url_filename(url)), {RemoteFile{.url = url}}}, options);
}

namespace urls {

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return names;
}

DataSource fashion_mnist(const fs::path& dir) {
  auto file = [&](const char* name, const char* md5) {
    return RemoteFile{.url = "file://" + fs::absolute(dir / name).string(), .md5 = md5};
  };
  // md5 sums of dataset-fashion-mnist 0.0~git20200523.55506a9-1 (Debian 12).
  return {"fashion_mnist",
          {file("train-images-idx3-ubyte.gz", "cf8536b0aa1a6ac5fa3f23001093305c"),
           file("train-labels-idx1-ubyte.gz", "10bea18fdb374794d4bb42e356e600c9"),
           file("t10k-images-idx3-ubyte.gz", "f78720b4224f21cce2f2ccf2d7a94c9a"),
           file("t10k-labels-idx1-ubyte.gz", "0d30e22e447f3c33dab9ed536400ac01")},
          fashion_mnist_classes()};
}

DataSource fashion_mnist_official(const std::string& base_url) {
  const std::string base = base_url.ends_with('/') ? base_url : base_url + "/";
  return {"fashion_mnist",
          {{.url = base + "train-images-idx3-ubyte.gz", .md5 = "8d4fb7e6c68d591d4c3dfef9ec88bf0d"},
           {.url = base + "train-labels-idx1-ubyte.gz", .md5 = "25c81989df183df01b3e8a0aad5dffbe"},
           {.url = base + "t10k-images-idx3-ubyte.gz", .md5 = "bef4ecab320f06d8554ea6380940ec79"},
           {.url = base + "t10k-labels-idx1-ubyte.gz", .md5 = "bb300cfdad3c16e7a12a480ee83cd310"}},
          fashion_mnist_classes()};
}

}  // namespace urls
}  // namespace fastlearn
