#pragma once
// The checkout's path, for the benchmarks that start the project's Python anchors (bench/python). It comes
// from a file bench/CMakeLists.txt generates, not from a -D flag, so that the benchmarks' objects do not depend
// on where the project is checked out and another checkout hits their ccache entries.
namespace fastlearn::bench {
extern const char* const source_dir;
}  // namespace fastlearn::bench

#define FASTLEARN_SOURCE_DIR (::fastlearn::bench::source_dir)
