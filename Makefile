# The two commands of the README, with their set-up:
#   make demo   set up, build, and train the DDP example on 2 ranks over `mojo`
#   make test   set up, build, and run the test suite
#   make spack-check   also install torch-mojo with Spack (slow; not in `make test`)
#   make package-check the site environments concretized, the conda recipe's build
#                      script, the container install step (what CI runs after `make test`)
#   make scale-check   the long runs between simulated nodes, up to 8 (slow; what CI runs after `make test`)
#   make slurm-check   jobs under a real Slurm started on this machine (slow; what CI runs after `make test`)
#   make clients-check accelerate, the Trainer and Lightning on mojo against gloo (what CI runs after `make test`)
#   make torchft-check torchft's replica groups on mojo and on gloo, killed and rejoined (what CI runs after `make test`)
#   make torchcomms-check torchcomms built once into the cache, torch-mojo's backend for it,
#                      and training through it (what CI runs after `make test`)
#   make torchcomms-suite torchcomms' own tests on mojo, every file, at 2 and 4 ranks (slow)
#   make pytorch-suite PyTorch's own distributed tests on mojo (slow; a subset is in `make test`)
# A second run reuses the environment and the build.

VENV := .venv
BIN := $(VENV)/bin
NPROC ?= 2
SOURCES := $(shell find cpp kernels modulefiles cmake -type f) CMakeLists.txt pyproject.toml

.PHONY: demo test spack-check package-check scale-check slurm-check clients-check torchft-check torchcomms-check torchcomms-suite pytorch-suite build setup clean

# The trained weights go to build/, out of the source tree.
demo: build
	$(BIN)/torchrun --standalone --nproc-per-node=$(NPROC) examples/train_ddp.py --save build/demo-checkpoint.pt

test: build
	$(BIN)/python -m pytest tests --durations=15

# `spack install py-torch-mojo` with Spack from ../shared/vendor, and the
# installed module training 2 ranks (about ten minutes).
spack-check: build
	$(BIN)/python -m pytest tests -m spack_install

# What builds or solves packages, short of the Spack install (about ten
# minutes): Spack's audit and the site environments' solves, the conda
# recipe's build script, the container's install step.
package-check: build
	$(BIN)/python -m pytest tests -m packaging

# The long runs between simulated nodes (about ten minutes): the matrix
# across 8 nodes of one rank and 4 interleaved nodes, the soak across 8,
# the forced algorithms at 5 nodes, rails on two domains and out of step,
# libfabric's net provider. 2 nodes, and the shorter runs up to 4, are in
# `make test`.
scale-check: build
	$(BIN)/python -m pytest tests -m scale

# Under a real Slurm (Debian's slurm-wlm and munge, installed as root where
# missing; tests/slurm_site.py starts slurmctld and two slurmd): srun with
# each --mpi plugin, uneven nodes, two steps at once, the doctor, the sbatch
# example (about five minutes).
slurm-check: build
	scripts/apt-install.sh slurm-wlm munge
	$(BIN)/python -m pytest tests -m slurm

# examples/clients/ on mojo against gloo, with the clients' pinned versions
# (requirements-clients.txt) added to .venv (about three minutes).
clients-check: build
	$(BIN)/pip install --quiet -r requirements-clients.txt -c requirements-dev.txt
	$(BIN)/python -m pytest tests -m clients

# examples/torchft/ on mojo and on torchft's gloo: a Lighthouse and replica
# groups under torchrun, killed and rejoined (one, two of three, a rank of
# an HSDP group), one stopped and dropped, the Lighthouse absent or gone,
# with torchft's pinned version (requirements-torchft.txt) added to .venv
# (about five minutes).
torchft-check: build
	$(BIN)/pip install --quiet -r requirements-torchft.txt -c requirements-dev.txt
	$(BIN)/python -m pytest tests -m torchft

# torchcomms 0.3.0 from ../shared/vendor, built once into the cache (about
# seven minutes the first time) and installed into .venv; torch-mojo rebuilt
# with its torchcomms backend; then the command given, with
# TORCH_MOJO_TORCHCOMMS_SOURCE naming torchcomms' sources.
define with_torchcomms
	@if ! ls ../shared/vendor/torchcomms-*.tar.gz >/dev/null 2>&1 && [ -z "$$TORCHCOMMS_SOURCE_TARBALL" ]; then \
	  echo "$@: skipped: no torchcomms sources (../shared/vendor/torchcomms-*.tar.gz, or TORCHCOMMS_SOURCE_TARBALL)"; \
	  exit 0; fi; \
	source=$$(scripts/build-torchcomms.sh $(VENV)) && \
	  $(BIN)/python -m pip install --no-build-isolation --no-deps -e . \
	    --config-settings=cmake.define.TORCH_MOJO_TORCHCOMMS_SOURCE=$$source && \
	  export TORCH_MOJO_TORCHCOMMS_SOURCE=$$source && $(1)
endef

# The tests marked torchcomms: the demo, the examples and the conformance
# matrix through torchcomms, reconfigure, torchft's replica group killed and
# rejoined through torchcomms, and a file of each kind of
# torchcomms' own tests (about ten minutes after the build).
torchcomms-check: build
	$(BIN)/pip install --quiet -r requirements-torchft.txt -c requirements-dev.txt
	$(call with_torchcomms,$(BIN)/python -m pytest tests -m torchcomms --durations=10)

# Every file of torchcomms' own integration tests on mojo, at 2 and 4 ranks
# (about 8 and 12 minutes; the counts in docs/integrations.md).
torchcomms-suite: build
	$(call with_torchcomms,$(BIN)/python -m tests.torchcomms_suite.run --source $$source --world-size 2 && \
	  $(BIN)/python -m tests.torchcomms_suite.run --source $$source --world-size 4)

# PyTorch's DistributedTest at 2 and 3 ranks on mojo (about 24 and 38 minutes).
pytorch-suite: build
	$(BIN)/python -m tests.pytorch_suite.run --world-size 2
	$(BIN)/python -m tests.pytorch_suite.run --world-size 3

build: $(VENV)/.built

setup: $(VENV)/.ready

$(VENV)/.ready: scripts/setup-env.sh requirements-dev.txt
	scripts/setup-env.sh
	touch $@

# Editable install: Python files are used from python/, the compiled parts
# are rebuilt here when a C++ or Mojo source changes.
$(VENV)/.built: $(VENV)/.ready $(SOURCES)
	$(BIN)/python -m pip install --no-build-isolation --no-deps -e .
	touch $@

clean:
	rm -rf build $(VENV)/.built
