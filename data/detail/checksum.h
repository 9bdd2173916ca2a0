#pragma once
// File digests (md5, sha256) for verifying downloads.
#include <filesystem>
#include <string>

namespace fastlearn {

enum class DigestKind { md5, sha256 };

/// Lower-case hex digest of the file's bytes; DataError if it cannot be read.
std::string file_digest(const std::filesystem::path& path, DigestKind kind);

}  // namespace fastlearn
