#pragma once
// The checkout's path and the Python of the anchors, for the benchmarks that start the project's Python anchors
// (bench/python). They come from a file bench/CMakeLists.txt generates, not from -D flags, so that the
// benchmarks' objects do not depend on where the project is checked out and another checkout hits their ccache
// entries. FASTLEARN_BENCH_SOURCE_DIR and FASTLEARN_BENCH_PYTHON replace them at run time, for a benchmark run
// away from its build (the prebuilt GPU kit of scripts/device-kit).
namespace fastlearn::bench {
const char* source_dir();
const char* python();
}  // namespace fastlearn::bench

#define FASTLEARN_SOURCE_DIR (::fastlearn::bench::source_dir())
#define FASTLEARN_PYTHON (::fastlearn::bench::python())
