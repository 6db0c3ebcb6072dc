# Two entry points for newcomers (see README):
#   make demo   installs dependencies, builds, starts `ballast serve` and streams from every model
#   make test   installs dependencies, builds and runs the whole test suite (ctest)
# Other targets: deps, build, clean.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps build test demo clean

all: build

deps:
	@bash deploy/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 300

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)/server/ballast

clean:
	rm -rf $(BUILD_DIR)
