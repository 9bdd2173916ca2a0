// The fastlearn command line.
#include <fastlearn/core/build_info.h>
#include <fastlearn/core/error.h>

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  CLI::App app{"fastlearn: fastai-style training over LibTorch, on one process or many"};
  app.set_version_flag("-V,--version", [] { return fastlearn::describe(fastlearn::build_info()); },
                       "Print the fastlearn and LibTorch versions and whether CUDA, NCCL and Gloo are compiled in");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fastlearn::Error& e) {
    std::cerr << "fastlearn: error: " << e.what() << "\n";
    return 1;
  }
  std::cout << app.help();
  return 0;
}
