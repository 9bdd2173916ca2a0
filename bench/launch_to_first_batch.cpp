// launch_to_first_batch: the fixed cost of starting a data parallel run, apart from training. Wall seconds from
// starting `fastlearn launch --nproc-per-node 2 tta_train ...` (1 thread per rank) to rank 0's first training batch,
// against one process of 2 threads (tta_train alone, twice the batch) to its first batch: the same model, data and
// options as time_to_accuracy (tta_train --first-batch). Both include loading LibTorch, reading and normalizing
// Fashion-MNIST and building the learner; the 2 ranks also the launcher, the rendezvous and the process group.
// Repeats interleave; ratio = one process / 2 ranks (> 1: the 2 ranks start sooner). Prints one JSON object.
#include "support/bench_support.h"
#include "support/result_row.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>

namespace {

// Seconds from now to the first training batch of `command`, from the steady clock it prints.
double to_first_batch(const std::string& command) {
  const auto start = bench::Clock::now();
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  const int status = pclose(pipe);
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const auto brace = line.find("{\"first_batch_ns\"");
    if (brace == std::string::npos) continue;
    const auto ns = nlohmann::json::parse(line.substr(brace)).at("first_batch_ns").get<std::int64_t>();
    const auto first = bench::Clock::time_point(std::chrono::nanoseconds(ns));
    return std::chrono::duration<double>(first - start).count();
  }
  throw std::runtime_error(fmt::format("no first batch (status {}): {}\n{}", status, command, output));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  try {
    const auto bin = std::filesystem::canonical("/proc/self/exe").parent_path();
    const auto args = fmt::format(
        "--model conv_net_32_64_128_256 --epochs 6 --lr 0.01 --target 0.92 --data {} --channels-last --first-batch",
        data);
    const auto two_ranks = fmt::format(
        "OMP_NUM_THREADS=1 {}/fastlearn launch --nproc-per-node 2 --no-prefix -- {}/tta_train {} --bs 128 2>&1",
        bin.string(), bin.string(), args);
    const auto one_process = fmt::format("OMP_NUM_THREADS=2 {}/tta_train {} --bs 256 2>&1", bin.string(), args);
    to_first_batch(two_ranks);  // warm-up: the page cache holds the libraries and the data for both sides
    to_first_batch(one_process);
    const int n = bench::repeats(3);
    std::vector<double> ours, anchor;
    for (int r = 0; r < n; ++r) {
      ours.push_back(to_first_batch(two_ranks));
      anchor.push_back(to_first_batch(one_process));
    }
    const auto o = bench::summarize(ours), a = bench::summarize(anchor);
    // The seconds come from the steady clock in nanoseconds: 9 decimals keep them as measured.
    const auto result =
        bench::Row("launch_to_first_batch", o, a, "s", /*higher_is_better=*/false, 9)
            .set("repeats", n)
            .set("what",
                 "wall seconds from the start to the first training batch: fastlearn launch, 2 ranks of 1 thread "
                 "(batch 128 each) vs one process of 2 threads (batch 256), time_to_accuracy's setting; ratio = one "
                 "process / 2 ranks");
    std::cout << bench::results_line({result}) << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "launch_to_first_batch: " << e.what() << "\n";
    return 1;
  }
}
