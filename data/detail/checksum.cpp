#include <fastlearn/data/detail/checksum.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

namespace fastlearn {

std::string file_digest(const std::filesystem::path& path, DigestKind kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read '{}' to compute its checksum", excerpt(path.string(), 256)));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  const EVP_MD* md = kind == DigestKind::md5 ? EVP_md5() : EVP_sha256();
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) throw DataError("OpenSSL digest initialisation failed");
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad())
    throw DataError(fmt::format("reading '{}' failed while computing its checksum", excerpt(path.string(), 256)));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace fastlearn
