// Linked into every test binary not labelled `gpu`: before main (and before CUDA starts), the tests of
// the CPU suite and every process they start (ranks, the CLI, examples) see no GPU and use Gloo, so the
// suite means the same on a machine with GPUs. Tests that need a GPU are in gpu_test.cpp.
#include <cstdlib>

namespace {

const bool pinned_to_cpu = [] {
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);
  ::setenv("FASTLEARN_BACKEND", "gloo", 1);
  return true;
}();

}  // namespace
