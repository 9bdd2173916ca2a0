// fmt's out-of-line functions, compiled once for the whole library. LibTorch ships fmt's headers but no fmt
// library; included header-only (FMT_HEADER_ONLY), every file that formats compiled fmt's implementation again
// (about 8 s of each such file's compile). format-inl.h defines the non-template functions; the templates that
// format.h declares extern are instantiated here for the character types it names.
#ifndef FMT_HEADER_ONLY  // cmake/FastlearnTorch.cmake: set for an fmt other than 12.x
#include <fmt/format-inl.h>

namespace fmt::detail {
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto thousands_sep_impl<wchar_t>(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl<char>(locale_ref) -> char;
template auto decimal_point_impl<wchar_t>(locale_ref) -> wchar_t;
}  // namespace fmt::detail
#endif
