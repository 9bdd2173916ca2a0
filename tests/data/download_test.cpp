// download, extract_archive and untar_data: verified, atomic, safe, cached, and shared between processes.
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/archive.h>
#include <fastlearn/data/detail/checksum.h>
#include <fastlearn/data/download.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/untar_data.h>

#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <fstream>
#include <map>
#include <stdexcept>
#include <thread>

#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// A folder for the test, made fresh and removed afterwards by the test's process; its rank processes
// see the same folder.
class Scratch {
 public:
  Scratch() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ =
        fs::temp_directory_path() / fmt::format("fastlearn-{}-{}", info->name(), fastlearn::testing::test_process_id());
    if (fastlearn::testing::in_rank_process()) return;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~Scratch() {
    if (!fastlearn::testing::in_rank_process()) fs::remove_all(path_);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Entry {
  std::string name;
  std::string content;  // file content, or link target for links
  mode_t type = AE_IFREG;
};

// Writes a tar (or tar.gz / zip, by extension) with exactly these entries, hostile ones included.
void make_archive(const fs::path& path, const std::vector<Entry>& entries) {
  std::unique_ptr<struct archive, decltype(&archive_write_free)> a(archive_write_new(), &archive_write_free);
  const auto name = path.filename().string();
  if (name.ends_with(".zip")) {
    archive_write_set_format_zip(a.get());
  } else {
    archive_write_set_format_pax_restricted(a.get());
    if (name.ends_with(".gz")) archive_write_add_filter_gzip(a.get());
  }
  ASSERT_EQ(archive_write_open_filename(a.get(), path.c_str()), ARCHIVE_OK);
  for (const auto& e : entries) {
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(), &archive_entry_free);
    archive_entry_set_pathname(entry.get(), e.name.c_str());
    archive_entry_set_filetype(entry.get(), e.type);
    archive_entry_set_perm(entry.get(), e.type == AE_IFDIR ? 0755 : 0644);
    if (e.type == AE_IFLNK) archive_entry_set_symlink(entry.get(), e.content.c_str());
    if (e.type == AE_IFCHR) archive_entry_set_rdev(entry.get(), makedev(1, 3));
    if (e.type == AE_IFREG) archive_entry_set_size(entry.get(), static_cast<la_int64_t>(e.content.size()));
    archive_write_header(a.get(), entry.get());
    if (e.type == AE_IFREG) archive_write_data(a.get(), e.content.data(), e.content.size());
  }
  archive_write_close(a.get());
}

std::string md5_of(const std::string& text, const fs::path& scratch) {
  write_text(scratch / "md5.tmp", text);
  auto digest = fl::file_digest(scratch / "md5.tmp", fl::DigestKind::md5);
  fs::remove(scratch / "md5.tmp");
  return digest;
}

// A minimal HTTP/1.0 server on 127.0.0.1 for the test's own files. "/flaky/..." answers 503 the first
// time; unknown paths answer 404. Bounded: it stops when destroyed.
class LocalHttpServer {
 public:
  explicit LocalHttpServer(std::map<std::string, std::string> files) : files_(std::move(files)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("LocalHttpServer: cannot listen on a loopback socket");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~LocalHttpServer() {
    stop_ = true;
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string url(const std::string& path) const { return fmt::format("http://127.0.0.1:{}{}", port_, path); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (!stop_) {
      const int client = accept(fd_, nullptr, nullptr);
      if (client < 0) return;
      ++requests_;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const auto n = read(client, buf, sizeof buf);
        if (n <= 0) break;
        request.append(buf, static_cast<std::size_t>(n));
      }
      const auto start = request.find(' ') + 1;
      const auto path = request.substr(start, request.find(' ', start) - start);
      std::string response;
      if (path.starts_with("/flaky/") && !flaked_.exchange(true)) {
        response = "HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
      } else if (auto it = files_.find(path.starts_with("/flaky/") ? path.substr(6) : path); it != files_.end()) {
        response = fmt::format("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{}", it->second.size(), it->second);
      } else {
        response = "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n";
      }
      for (std::size_t sent = 0; sent < response.size();) {
        const auto n = write(client, response.data() + sent, response.size() - sent);
        if (n <= 0) break;
        sent += static_cast<std::size_t>(n);
      }
      close(client);
    }
  }

  std::map<std::string, std::string> files_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> flaked_{false};
  std::atomic<int> requests_{0};
};

TEST(Download, FileUrlIsVerifiedAndServedFromTheCacheAfterwards) {
  Scratch s;
  write_text(s.path() / "src/data.bin", "payload bytes");
  const auto md5 = md5_of("payload bytes", s.path());
  fl::DownloadOptions options{.dest_dir = s.path() / "cache", .size = 13, .md5 = md5};
  const auto got = fl::download("file://" + (s.path() / "src/data.bin").string(), options);
  EXPECT_EQ(got, s.path() / "cache/data.bin");
  EXPECT_EQ(read_text(got), "payload bytes");
  fs::remove_all(s.path() / "src");  // the source is gone: only the cache can answer
  EXPECT_EQ(fl::download("file://" + (s.path() / "src/data.bin").string(), options), got);
}

TEST(Download, ChecksumMismatchRemovesTheFileAndSaysBothValues) {
  Scratch s;
  write_text(s.path() / "src/data.bin", "tampered");
  const std::string wrong = "00000000000000000000000000000000";
  try {
    fl::download("file://" + (s.path() / "src/data.bin").string(), {.dest_dir = s.path() / "cache", .md5 = wrong});
    FAIL() << "a wrong md5 was accepted";
  } catch (const fl::DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(wrong), std::string::npos) << what;
    EXPECT_NE(what.find(md5_of("tampered", s.path())), std::string::npos) << what;
    EXPECT_NE(what.find("removed"), std::string::npos) << what;
  }
  for (const auto& entry : fs::directory_iterator(s.path() / "cache"))
    EXPECT_TRUE(entry.path().extension() == ".lock") << "left behind: " << entry.path();
}

TEST(Download, HttpFromALocalServerRetriesTransientFailures) {
  Scratch s;
  LocalHttpServer server({{"/weights.bin", std::string(3 << 20, 'w')}});
  const auto got = fl::download(server.url("/flaky/weights.bin"),
                                {.dest_dir = s.path(), .size = 3 << 20, .retry_delay = std::chrono::milliseconds(10)});
  EXPECT_EQ(fs::file_size(got), 3u << 20);
  EXPECT_EQ(server.requests(), 2) << "one 503, then one success";
  EXPECT_EQ(fl::download(server.url("/flaky/weights.bin"), {.dest_dir = s.path(), .size = 3 << 20}), got);
  EXPECT_EQ(server.requests(), 2) << "a verified cached file must be served without the network";
  try {
    fl::download(server.url("/missing.bin"), {.dest_dir = s.path(), .retry_delay = std::chrono::milliseconds(10)});
    FAIL() << "a 404 was accepted";
  } catch (const fl::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("404"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("after 1 attempt"), std::string::npos)
        << "a 404 is not transient: " << e.what();
  }
  EXPECT_FALSE(fs::exists(s.path() / "missing.bin"));
}

TEST(Archive, GoodTarGzAndZipExtractWithInsideLinks) {
  Scratch s;
  const std::vector<Entry> entries{
      {"set/", "", AE_IFDIR}, {"set/a.txt", "alpha"}, {"set/sub/b.txt", "beta"}, {"set/link", "sub/b.txt", AE_IFLNK}};
  for (const char* name : {"good.tar.gz", "good.zip"}) {
    make_archive(s.path() / name, entries);
    const auto dest = s.path() / (std::string(name) + ".out");
    fl::extract_archive(s.path() / name, dest);
    EXPECT_EQ(read_text(dest / "set/a.txt"), "alpha") << name;
    EXPECT_EQ(read_text(dest / "set/sub/b.txt"), "beta") << name;
    EXPECT_EQ(read_text(dest / "set/link"), "beta") << name;
  }
}

TEST(Archive, HostileEntriesAreRefusedAndNothingLandsOutside) {
  Scratch s;
  const std::vector<std::pair<std::string, std::vector<Entry>>> cases{
      {"dotdot.tar", {{"ok.txt", "fine"}, {"../x", "escaped"}}},
      {"nested.tar", {{"a/../../x", "escaped"}}},
      {"absolute.tar", {{(s.path() / "x").string(), "escaped"}}},
      {"symlink.tar", {{"link", "../../..", AE_IFLNK}, {"link/x", "escaped"}}},
      {"abs_symlink.tar", {{"link", s.path().string(), AE_IFLNK}}},
      {"device.tar", {{"null", "", AE_IFCHR}}},
      {"fifo.tar", {{"pipe", "", AE_IFIFO}}}};
  for (const auto& [name, entries] : cases) {
    make_archive(s.path() / name, entries);
    const auto dest = s.path() / "dest" / name;
    try {
      fl::extract_archive(s.path() / name, dest);
      ADD_FAILURE() << name << " was extracted";
    } catch (const fl::DataError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("unsafe archive"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dest)) << name;
    EXPECT_FALSE(fs::exists(s.path() / "x")) << name << " wrote outside the destination";
    EXPECT_FALSE(fs::exists(s.path() / "dest/x")) << name << " wrote outside the destination";
  }
  // Nothing but the (empty) parent of the destinations remains.
  EXPECT_TRUE(fs::is_empty(s.path() / "dest"));
}

TEST(UntarData, FourProcessesOnAnEmptyCacheAllGetTheSameIntactFolder) {
  Scratch s;
  std::vector<Entry> entries{{"shapes/", "", AE_IFDIR}};
  for (int i = 0; i < 50; ++i)
    entries.push_back({fmt::format("shapes/f{}.txt", i), std::string(20000 + i, 'a' + i % 26)});
  if (!fastlearn::testing::in_rank_process()) make_archive(s.path() / "shapes.tar.gz", entries);
  const std::string url = "file://" + (s.path() / "shapes.tar.gz").string();
  const auto cache = s.path() / "cache";
  fastlearn::testing::run_on_ranks(4, [&](const fastlearn::testing::RankContext& ctx) {
    ctx.store->add("ready", 1);
    while (ctx.store->add("ready", 0) < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // start together
    const auto folder = fl::untar_data(url, {.cache_dir = cache, .progress = false});
    EXPECT_EQ(folder, cache / "data/shapes");
    for (int i = 0; i < 50; ++i)
      ASSERT_EQ(read_text(folder / fmt::format("f{}.txt", i)), std::string(20000 + i, 'a' + i % 26)) << "file " << i;
  });
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(cache / "data")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"shapes", "shapes.lock"})) << "leftover staging folders";
}

TEST(UntarData, FashionMnistFromTheDebianPackageIsVerifiedAndLoads) {
  Scratch s;
  const auto folder = fl::untar_data(fl::urls::fashion_mnist(), {.cache_dir = s.path(), .progress = false});
  EXPECT_EQ(folder, s.path() / "data/fashion_mnist");
  auto dls = fl::ImageDataLoaders::from_idx(folder, {.bs = 256});
  EXPECT_EQ(dls.c(), 10);
  EXPECT_EQ(dls.valid().n(), 10000);
  // The ten names travel with the files (classes.txt), so predictions name the classes.
  EXPECT_EQ(dls.vocab(), fl::urls::fashion_mnist_classes());
  EXPECT_EQ(dls.vocab().front(), "T-shirt/top");
  EXPECT_EQ(dls.vocab().back(), "Ankle boot");
  // A copy cached before the names were written gets them on the next call, the rest left as it was.
  fs::remove(folder / "classes.txt");
  EXPECT_EQ(fl::untar_data(fl::urls::fashion_mnist(), {.cache_dir = s.path(), .progress = false}), folder);
  EXPECT_EQ(read_text(folder / "classes.txt").substr(0, 21), "T-shirt/top\nTrouser\nP");
  // A tampered copy of the package's files is caught by the md5 sums.
  write_text(s.path() / "fake/train-images-idx3-ubyte.gz", "not the data set");
  auto tampered = fl::urls::fashion_mnist(s.path() / "fake");
  tampered.name = "tampered";
  EXPECT_THROW(fl::untar_data(tampered, {.cache_dir = s.path() / "c2", .progress = false}), fl::DataError);
  EXPECT_FALSE(fs::exists(s.path() / "c2/data/tampered"));
}

}  // namespace
