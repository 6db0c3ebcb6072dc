# Two entry points for newcomers (see README):
#   make demo   installs dependencies, builds, starts `ballast serve` and streams from every model
#   make test   installs dependencies, builds and runs the whole test suite (ctest), then the
#               CI checks (scripts/ci-checks.sh: format, clang thread-safety + ASan/UBSan, TSan)
# Other targets: deps, build, ctest (build + ctest only), check (the CI checks only), clean.

BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
# Warnings are errors in our sources (Debian 12's GCC 12); WERROR=OFF to relax.
WERROR ?= ON
CMAKE_FLAGS ?=

.PHONY: all deps build ctest check test demo clean

all: build

deps:
	@bash deploy/install-deps.sh

$(BUILD_DIR)/build.ninja: Makefile
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DBALLAST_WERROR=$(WERROR) $(CMAKE_FLAGS)
	@touch $@

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

ctest: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 300

check: deps
	@bash scripts/ci-checks.sh

test: ctest
	@$(MAKE) --no-print-directory check

demo: build
	@bash scripts/demo.sh $(BUILD_DIR)/server/ballast

clean:
	rm -rf $(BUILD_DIR) build-clang build-tsan
