#pragma once
// Safe extraction of tar, tar.gz/.bz2/.xz and zip archives.
#include <filesystem>

namespace fastlearn {

/// Whether `path` names an archive extract_archive understands (by its extension).
bool is_archive(const std::filesystem::path& path);

/// Extracts `archive` into `dest` (created; must not exist yet). Entries are checked before anything
/// is written: absolute paths, `..` components, links whose target leaves `dest`, and device files,
/// FIFOs and sockets are refused with a DataError naming the archive and the entry. Extraction goes to a
/// temporary sibling folder renamed into place at the end, so `dest` is complete or absent.
void extract_archive(const std::filesystem::path& archive, const std::filesystem::path& dest);

}  // namespace fastlearn
