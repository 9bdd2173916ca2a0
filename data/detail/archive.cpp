#include <fastlearn/data/detail/archive.h>

#include <archive.h>
#include <archive_entry.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <unistd.h>

#include <memory>

namespace fastlearn {
namespace fs = std::filesystem;

bool is_archive(const fs::path& path) {
  const auto name = path.filename().string();
  for (const char* ext : {".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip"})
    if (name.ends_with(ext)) return true;
  return false;
}

namespace {

using Reader = std::unique_ptr<struct archive, decltype(&archive_read_free)>;
using Writer = std::unique_ptr<struct archive, decltype(&archive_write_free)>;

// A relative path with no "..", or "" when `path` would leave the folder it is resolved in.
bool stays_inside(const fs::path& path) {
  if (path.empty() || path.is_absolute()) return false;
  int depth = 0;
  for (const auto& part : path) {
    if (part == "..") {
      if (--depth < 0) return false;
    } else if (part != "." && !part.empty()) {
      ++depth;
    }
  }
  return true;
}

// Refuses entries that could write outside the destination or create special files.
void check_entry(const fs::path& archive, struct archive_entry* entry) {
  const char* raw = archive_entry_pathname(entry);
  const std::string name = raw ? raw : "";
  auto refuse = [&](const std::string& why) {
    throw DataError(fmt::format("unsafe archive '{}': entry '{}' {}; nothing was extracted",
                                excerpt(archive.string(), 256), excerpt(name, 256), why));
  };
  const fs::path path(name);
  if (name.empty()) refuse("has no name");
  if (path.is_absolute()) refuse("is an absolute path");
  for (const auto& part : path)
    if (part == "..") refuse("has a '..' component");
  switch (archive_entry_filetype(entry)) {
    case AE_IFREG:
    case AE_IFDIR:
      break;
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(entry);
      const fs::path link = target ? target : "";
      if (!stays_inside(path.parent_path() / link))
        refuse(fmt::format("is a symlink to '{}', outside the destination", excerpt(link.string(), 256)));
      break;
    }
    default:
      refuse("is a device file, FIFO or socket");
  }
  if (const char* hard = archive_entry_hardlink(entry); hard && !stays_inside(hard))
    refuse(fmt::format("is a hard link to '{}', outside the destination", excerpt(hard, 256)));
}

void copy_data(struct archive* in, struct archive* out, const fs::path& archive) {
  const void* buffer = nullptr;
  size_t size = 0;
  la_int64_t offset = 0;
  for (;;) {
    const int r = archive_read_data_block(in, &buffer, &size, &offset);
    if (r == ARCHIVE_EOF) return;
    if (r < ARCHIVE_WARN)
      throw DataError(
          fmt::format("archive '{}' is corrupt: {}", excerpt(archive.string(), 256), archive_error_string(in)));
    if (archive_write_data_block(out, buffer, size, offset) < ARCHIVE_WARN)
      throw DataError(
          fmt::format("extracting '{}' failed: {}", excerpt(archive.string(), 256), archive_error_string(out)));
  }
}

}  // namespace

void extract_archive(const fs::path& archive, const fs::path& dest) {
  if (fs::exists(dest))
    throw DataError(fmt::format("cannot extract '{}': '{}' exists already", excerpt(archive.string(), 256),
                                excerpt(dest.string(), 256)));
  Reader reader(archive_read_new(), &archive_read_free);
  archive_read_support_filter_all(reader.get());
  archive_read_support_format_tar(reader.get());
  archive_read_support_format_gnutar(reader.get());
  archive_read_support_format_zip(reader.get());
  if (archive_read_open_filename(reader.get(), archive.c_str(), 1 << 16) != ARCHIVE_OK)
    throw DataError(fmt::format("cannot open archive '{}': {}", excerpt(archive.string(), 256),
                                archive_error_string(reader.get())));

  const fs::path temp = fs::path(dest) += fmt::format(".partial.{}", getpid());
  fs::remove_all(temp);
  fs::create_directories(temp);
  try {
    Writer writer(archive_write_disk_new(), &archive_write_free);
    // libarchive's own guards back up check_entry. (Not NOABSOLUTEPATHS: entries are rewritten to absolute
    // paths under the staging folder, after check_entry has refused absolute names.)
    archive_write_disk_set_options(
        writer.get(), ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS);
    for (;;) {
      struct archive_entry* entry = nullptr;
      const int r = archive_read_next_header(reader.get(), &entry);
      if (r == ARCHIVE_EOF) break;
      if (r < ARCHIVE_WARN)
        throw DataError(fmt::format("archive '{}' is corrupt: {}", excerpt(archive.string(), 256),
                                    archive_error_string(reader.get())));
      check_entry(archive, entry);
      const fs::path out = temp / archive_entry_pathname(entry);
      archive_entry_set_pathname(entry, out.c_str());
      if (const char* hard = archive_entry_hardlink(entry)) archive_entry_set_hardlink(entry, (temp / hard).c_str());
      if (archive_write_header(writer.get(), entry) < ARCHIVE_WARN)
        throw DataError(fmt::format("extracting '{}' failed: {}", excerpt(archive.string(), 256),
                                    archive_error_string(writer.get())));
      if (archive_entry_size(entry) > 0) copy_data(reader.get(), writer.get(), archive);
      if (archive_write_finish_entry(writer.get()) < ARCHIVE_WARN)
        throw DataError(fmt::format("extracting '{}' failed: {}", excerpt(archive.string(), 256),
                                    archive_error_string(writer.get())));
    }
  } catch (...) {
    fs::remove_all(temp);
    throw;
  }
  fs::rename(temp, dest);
}

}  // namespace fastlearn
