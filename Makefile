# nsad - the NSA training daemon.
#
#   make run     install what is missing, build, start nsad with a default job
#   make test    install what is missing, build, run every CPU test
#
# Other targets: all (default build), deps, check-deps, gpu-test (GPU machine),
# bench-attn, bench-train, bench-decode and bench-dp (GPU machine), fuzz
# (FUZZ_SECONDS per harness), clean. `make V=1` shows the commands.
#
# The engine (kernels/ -> build/libnsa.{a,so}) needs libc and, when nvcc is
# found, the CUDA toolkit only. The daemon and CLI add libyaml, libmicrohttpd,
# cJSON and libcurl (Debian packages, installed by `make deps`).

# `make` alone builds all (the artifacts.o rule below would otherwise be
# the first target).
.DEFAULT_GOAL := all

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
BUILD   := build
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

OPT     ?= -O2
CFLAGS  := -std=c11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration -fPIC -pthread \
           -D_GNU_SOURCE -Ikernels -Idaemon -Iproto
LDLIBS_ENGINE := -lm -lpthread

# `make test` and `make run` build with one job per core.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)

# CUDA: compiled whenever nvcc exists (CI has nvcc but no GPU), every .cu
# file for two targets:
#   sm_90a       SASS for Hopper (H100/H200), the machine nsad trains on: the
#                wgmma/TMA kernels exist only there ('a' = arch-specific,
#                so no PTX of it runs anywhere else);
#   compute_80   Ampere's code path (mma.sync, cp.async): SASS for sm_80,
#                which sm_86/sm_89 GPUs run as it is (same major version;
#                no kernel differs by minor version - nothing tests
#                __CUDA_ARCH__ beyond the sm_90a features), and its PTX,
#                which the driver compiles for newer GPUs (Blackwell) on
#                first use.
# sm_86 SASS (built here before) added nothing but a third front-end and
# ptxas pass per file - a third of the nvcc time. Compiling both code paths
# (front end and ptxas each) still checks every CUDA file for both, as CI
# must. GENCODE=... picks others (e.g. sm_90a only on the GPU machine).
ifneq ($(NVCC),)
HAVE_CUDA := 1
GENCODE ?= -gencode arch=compute_90a,code=sm_90a \
           -gencode 'arch=compute_80,code=[sm_80,compute_80]'
NVCCFLAGS := -O3 -std=c++17 $(GENCODE) -Xcompiler -fPIC -Ikernels -lineinfo \
             --expt-relaxed-constexpr -DNSA_HAVE_CUDA
CFLAGS  += -DNSA_HAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS_ENGINE += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 \
                 -lcublasLt -lcublas -lcudart_static -ldl -lrt -lstdc++
# NCCL (the multi-GPU transport, kernels/nsa_comm_nccl.c) comes in when its
# header is there; the library is loaded when a job first asks for it
# (dlopen, so nothing links libnccl and a machine with the header alone
# builds everything). Without either, a multi-GPU job fails with an error
# that says so (never a silent single-GPU run).
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
ifneq ($(NCCL_H),)
HAVE_NCCL := 1
CFLAGS  += -DNSA_HAVE_NCCL
NVCCFLAGS += -DNSA_HAVE_NCCL
endif
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# ---- sources ---------------------------------------------------------------
ENGINE_C   := $(wildcard kernels/*.c)
CPU_SRC    := $(wildcard kernels/cpu/*.c)
CUDA_SRC   := $(if $(HAVE_CUDA),$(wildcard kernels/cuda/*.cu kernels/cuda/*/*.cu))
DAEMON_SRC := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
CTL_SRC    := $(wildcard ctl/*.c)
TEST_SRC   := $(wildcard tests/unit/test_*.c)
TEST_HELPERS := $(filter-out $(TEST_SRC),$(wildcard tests/unit/*.c))

# The CUDA objects first, the fast op's (the longest compiles) leading: a
# parallel build starts the longest jobs first and fills the end with the
# short C ones, instead of waiting on one nvcc at the end.
CUDA_FIRST := $(filter kernels/cuda/fast_attn/%,$(CUDA_SRC)) $(filter-out kernels/cuda/fast_attn/%,$(CUDA_SRC))
ENGINE_OBJ := $(CUDA_FIRST:%.cu=$(BUILD)/obj/%.o) \
              $(ENGINE_C:%.c=$(BUILD)/obj/%.o) \
              $(CPU_SRC:kernels/cpu/%.c=$(BUILD)/obj/cpu/f32/%.o) \
              $(CPU_SRC:kernels/cpu/%.c=$(BUILD)/obj/cpu/f64/%.o)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(BUILD)/obj/%.o)
CTL_OBJ    := $(CTL_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN   := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
TEST_HELPER_OBJ := $(TEST_HELPERS:%.c=$(BUILD)/obj/%.o)

DAEMON_LIBS := -lyaml -lmicrohttpd -lcjson -lcurl

# env.json records the commit nsad was built from (daemon/artifacts.c);
# artifacts.o is rebuilt when the commit differs from the last build's
# (a stamp rewritten only then: any checkout, worktree or detached HEAD).
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
$(BUILD)/obj/daemon/artifacts.o: CFLAGS += -DNSAD_GIT_COMMIT='"$(GIT_COMMIT)"'
$(BUILD)/obj/daemon/artifacts.o: $(BUILD)/git-commit
$(BUILD)/git-commit: FORCE
	@mkdir -p $(@D)
	@echo '$(GIT_COMMIT)' | cmp -s - $@ || echo '$(GIT_COMMIT)' > $@
.PHONY: FORCE
FORCE:
CTL_LIBS    := -lcurl -lcjson

.PHONY: all deps check-deps run test unit-test gpu-test bench-attn bench-train bench-decode bench-dp clean corpus fuzz
all: $(BUILD)/libnsa.a $(BUILD)/libnsa.so $(BUILD)/nsad $(BUILD)/nsactl

# ---- the two set-up commands ------------------------------------------------
deps:
	$(Q)./scripts/deps.sh

run: deps
	$(Q)./scripts/make-corpus.sh
	$(Q)$(MAKE) --no-print-directory -j$(JOBS) all
	$(Q)./scripts/run.sh

test: deps
	$(Q)./scripts/make-corpus.sh
	$(Q)$(MAKE) --no-print-directory -j$(JOBS) all tests
	$(Q)./tests/run.sh

# The fortunes text corpus (build/data/fortunes.txt) that tests and `make run` train on.
corpus:
	$(Q)./scripts/make-corpus.sh

# ---- engine -------------------------------------------------------------------
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/cpu/f32/%.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	@echo "  CC f32  $<"
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/cpu/f64/%.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	@echo "  CC f64  $<"
	$(Q)$(CC) $(CFLAGS) -DNSA_CPU_F64 -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libnsa.a: $(ENGINE_OBJ)
	@mkdir -p $(BUILD)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(BUILD)/libnsa.so: $(ENGINE_OBJ)
	@mkdir -p $(BUILD)
	@echo "  LD      $@"
	$(Q)$(CC) -shared -o $@ $^ $(LDLIBS_ENGINE)

# ---- daemon and CLI -------------------------------------------------------------
$(BUILD)/nsad: $(BUILD)/obj/daemon/main.o $(DAEMON_OBJ) $(BUILD)/libnsa.a
	@echo "  LD      $@"
	$(Q)$(CC) -o $@ $^ $(DAEMON_LIBS) $(LDLIBS_ENGINE) -rdynamic

# nsactl shares daemon/paths.c with nsad (both find the same default
# state dir and socket) and daemon/strbuf.c.
$(BUILD)/nsactl: $(CTL_OBJ) $(BUILD)/obj/daemon/paths.o $(BUILD)/obj/daemon/strbuf.o
	@echo "  LD      $@"
	$(Q)$(CC) -o $@ $^ $(CTL_LIBS) -lm

# ---- tests ----------------------------------------------------------------------
.PHONY: tests gpu-programs
tests: $(TEST_BIN)
# the helpers are not intermediate files: keep them, or every `make tests`
# rebuilds them and relinks every test
.SECONDARY: $(TEST_HELPER_OBJ)

# With nvcc, the programs that run only on the GPU machine (tests/gpu,
# bench) are built too, against this build's libnsa.a - the engine is
# compiled once - so that no change leaves them broken between GPU
# sessions (tests/integration/test_gpu_sources.sh checks they are).
ifdef HAVE_CUDA
tests: gpu-programs
endif
gpu-programs: $(BUILD)/libnsa.a
	$(Q)$(MAKE) --no-print-directory -C tests/gpu NVCC="$(NVCC)" all
	$(Q)$(MAKE) --no-print-directory -C bench NVCC="$(NVCC)" build

$(BUILD)/tests/%: tests/unit/%.c $(TEST_HELPER_OBJ) $(DAEMON_OBJ) $(BUILD)/libnsa.a
	@mkdir -p $(dir $@)
	@echo "  CC/LD   $@"
	$(Q)$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(TEST_HELPER_OBJ) $(DAEMON_OBJ) \
	    $(BUILD)/libnsa.a -lcmocka $(DAEMON_LIBS) $(LDLIBS_ENGINE) -rdynamic

# ---- fuzzing (clang's libFuzzer) ---------------------------------------------
# Each harness in tests/fuzz (fuzz_NAME.c) links the daemon's modules and the
# harnesses' shared helpers (the other tests/fuzz/*.c) compiled again by
# clang with ASan, UBSan and libFuzzer's coverage (build/fuzz/obj) and the
# ordinary engine (build/libnsa.a). `make test` builds them when clang is
# installed (`make deps` installs it) and runs the seed corpus through them
# (tests/integration/test_fuzz_corpus.sh); `make fuzz` fuzzes each harness
# for FUZZ_SECONDS, keeping what it finds in build/fuzz/corpus/NAME.
FUZZ_CC      ?= $(shell command -v clang 2>/dev/null)
FUZZ_SECONDS ?= 60
FUZZ_NAMES   := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN     := $(FUZZ_NAMES:%=$(BUILD)/fuzz/fuzz_%)
FUZZ_HELPERS := $(filter-out tests/fuzz/fuzz_%.c,$(wildcard tests/fuzz/*.c))
FUZZ_OBJ     := $(DAEMON_SRC:%.c=$(BUILD)/fuzz/obj/%.o) $(FUZZ_HELPERS:%.c=$(BUILD)/fuzz/obj/%.o)
FUZZ_CFLAGS  := -std=c11 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=undefined -D_GNU_SOURCE -pthread -Ikernels -Idaemon -Iproto \
                $(if $(HAVE_CUDA),-DNSA_HAVE_CUDA -I$(CUDA_HOME)/include)

.SECONDARY: $(FUZZ_OBJ)
$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  FUZZCC  $<"
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_OBJ) $(BUILD)/libnsa.a
	@echo "  FUZZLD  $@"
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_OBJ) $(BUILD)/libnsa.a \
	    $(DAEMON_LIBS) $(LDLIBS_ENGINE) -rdynamic

# the harnesses are tests too (their seed corpus runs in `make test`)
tests: $(if $(FUZZ_CC),$(FUZZ_BIN))

fuzz: $(FUZZ_BIN)
	$(Q)test -n "$(FUZZ_CC)" || { echo "make fuzz: clang is not installed (make deps)"; exit 1; }
	$(Q)./tests/fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_NAMES)

unit-test: tests
	$(Q)./tests/run.sh unit

# GPU tests and benchmarks run on the GPU machine (CUDA toolkit only).
gpu-test:
	$(Q)$(MAKE) --no-print-directory -C tests/gpu run

bench-attn:
	$(Q)$(MAKE) --no-print-directory -C bench attn

bench-train:
	$(Q)$(MAKE) --no-print-directory -C bench train

bench-decode:
	$(Q)$(MAKE) --no-print-directory -C bench decode

# Data-parallel tokens/s on 1 and N GPUs of this host (GPU machine, 2+ GPUs).
bench-dp:
	$(Q)$(MAKE) --no-print-directory -C tests/gpu all
	$(Q)./tests/gpu/bench_dp.sh

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
