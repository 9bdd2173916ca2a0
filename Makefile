# fastlearn: `make demo` runs the demo training, `make test` runs the test suite.
# Both install what is missing first (scripts/bootstrap), then configure and build into build/.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CTEST_ARGS ?=
VENV = $(shell scripts/bootstrap --print-venv)

.PHONY: all deps configure build test demo lint clean

all: build

deps:
	@scripts/bootstrap

$(BUILD_DIR)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DFASTLEARN_PYTHON=$(VENV)/bin/python

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Each TEST is its own ctest entry, but a quick module's binary is one (tests/CMakeLists.txt, WHOLE); the label is
# the test's folder under tests/: select one with `make test CTEST_ARGS="-L distributed"`. Each test runs pinned to a pair of CPUs, two tests per pair
# (scripts/ctest-resources), however many cores the machine has. A test that skips without being allowed to
# (tests/allowed_skips.txt: the GPU tests, the root-only ones) fails the run (scripts/check-skips).
test: build
	scripts/ctest-resources > $(BUILD_DIR)/ctest-resources.json
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --resource-spec-file ctest-resources.json \
	  --output-junit ctest-junit.xml $(CTEST_ARGS)
	scripts/check-skips $(BUILD_DIR)

# clang-format on every C++ file, the include order, clang-tidy on the sources changed since .lint-base (scripts/lint).
lint: configure
	scripts/lint $(BUILD_DIR)

# The README's main job: configs/fashion_mnist.toml on 2 local ranks on CPU (live progress on rank 0,
# the per-epoch table, the final test accuracy); the run's files go to build/demo. It builds only what it runs: the
# library and the `fastlearn` command (fastlearn_cli builds fastlearn-torch), not the tests.
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target fastlearn_cli
	$(BUILD_DIR)/bin/fastlearn train configs/fashion_mnist.toml --nproc-per-node 2 --out $(BUILD_DIR)/demo

clean:
	rm -rf $(BUILD_DIR)
