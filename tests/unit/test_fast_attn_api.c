/* test_fast_attn_api.c - the host-side contract of the fast CUDA attention
 * op (kernels/cuda/fast_attn/) that a machine without a GPU can check: every
 * unsupported shape is refused before any device work with one line naming
 * the field, its value and what is allowed; NULL plans, inputs and scratch
 * owners are refused; a plan on a machine without a usable GPU fails
 * cleanly (with one, plans sharing a scratch are checked too). The
 * numerical checks against the CPU reference need a GPU and live in
 * tests/gpu/test_fast_attn.cu (make -C bench fast-test). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "nsa.h"

#ifdef NSA_HAVE_CUDA

static NsaAttnDims protoDims(void) {
    NsaAttnDims d = {.B = 1, .S = 256, .H = 12, .G = 2, .d_k = 64, .d_v = 64, .cmp_len = 32,
                     .cmp_stride = 16, .sel_len = 64, .n_sel = 16, .window = 512};
    return d;
}

/* Plan creation must fail on d and the message must contain every needle. */
static void expectRefused(NsaAttnDims d, const char *needle1, const char *needle2) {
    NsaError err;
    memset(&err, 0, sizeof(err));
    NsaAttnCudaPlan *plan = nsaAttnCudaPlanCreate(&d, NULL, &err);
    if (plan) nsaAttnCudaPlanFree(plan);
    assert_null(plan);
    print_message("# refused: %s\n", err.message);
    assert_non_null(strstr(err.message, needle1));
    if (needle2) assert_non_null(strstr(err.message, needle2));
    /* measuring a plan applies the same checks */
    memset(&err, 0, sizeof(err));
    size_t state_bytes = 1, scratch_bytes = 1;
    assert_int_equal(nsaAttnCudaPlanMeasure(&d, NULL, &state_bytes, &scratch_bytes, &err), -1);
    assert_non_null(strstr(err.message, needle1));
    if (needle2) assert_non_null(strstr(err.message, needle2));
    /* and asking first (what the CUDA engine does to pick its attention
     * kernels) gives the same answer */
    memset(&err, 0, sizeof(err));
    assert_int_equal(nsaAttnCudaSupports(&d, &err), -1);
    assert_non_null(strstr(err.message, needle1));
    if (needle2) assert_non_null(strstr(err.message, needle2));
}

static void test_refuses_unbuilt_head_dims(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    d.d_k = 96;
    expectRefused(d, "(d_k, d_v) = (96, 64)", "allowed");
    d = protoDims();
    d.d_k = 64;
    d.d_v = 128;
    expectRefused(d, "(d_k, d_v) = (64, 128)", "(192, 128)");
}

static void test_refuses_too_many_heads_per_group(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    d.H = 64;
    d.G = 2; /* 32 heads per group */
    expectRefused(d, "H/G = 32", "1 to 16");
}

static void test_refuses_large_n_sel(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    d.n_sel = 33;
    expectRefused(d, "n_sel = 33", "1 to 32");
}

static void test_refuses_invalid_dims(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    d.G = 5; /* does not divide H = 12 */
    expectRefused(d, "G = 5", "divisor");
    d = protoDims();
    d.cmp_len = 128;
    d.cmp_stride = 1;
    d.sel_len = 1; /* 64 compressed blocks of 128 tokens span 192 selection blocks */
    expectRefused(d, "spans 192 selection blocks", "fewer than 128");
}

/* The block geometry's limits, each a valid NSA shape the reference
 * kernels take: the engine must be able to tell before it plans. */
static void test_refuses_block_geometry(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    d.cmp_len = 1024;
    d.cmp_stride = 8;
    d.sel_len = 1024; /* a token sits in 128 overlapping compressed blocks */
    expectRefused(d, "cmp_len / cmp_stride = 128", "up to 64");
    d = protoDims();
    d.S = 4 * 1024 * 1024;
    d.sel_len = 64; /* 65,536 selection blocks: a 256 KB histogram */
    expectRefused(d, "S / sel_len = 65536", "up to 51200");
}

/* What the fast op takes, it says it takes: the production shape at 64k,
 * the paper's, and the limits' edges. */
static void test_supports_what_it_takes(void **state) {
    (void)state;
    NsaError err;
    NsaAttnDims d = protoDims();
    d.S = 65536;
    d.B = 2;
    assert_int_equal(nsaAttnCudaSupports(&d, &err), 0);
    NsaAttnDims paper = {.B = 1, .S = 65536, .H = 64, .G = 4, .d_k = 192, .d_v = 128,
                         .cmp_len = 32, .cmp_stride = 16, .sel_len = 64, .n_sel = 16,
                         .window = 512};
    assert_int_equal(nsaAttnCudaSupports(&paper, &err), 0);
    d = protoDims();
    d.H = 16;
    d.G = 1;
    d.n_sel = 32;
    d.cmp_len = 512;
    d.cmp_stride = 8; /* 64 overlapping blocks, the most */
    d.sel_len = 512;
    assert_int_equal(nsaAttnCudaSupports(&d, &err), 0);
    d.S = 51200 * 64;
    d.sel_len = 64;
    d.cmp_len = 32;
    d.cmp_stride = 16;
    assert_int_equal(nsaAttnCudaSupports(&d, &err), 0);
    memset(&err, 0, sizeof(err));
    assert_int_equal(nsaAttnCudaSupports(NULL, &err), -1);
    assert_non_null(strstr(err.message, "NULL"));
}

/* Plan creation and measuring must fail on options o, the message naming
 * the field; options are checked before any device is looked for. */
static void expectOptionRefused(NsaAttnCudaOptions o, const char *needle) {
    NsaAttnDims d = protoDims();
    NsaError err;
    memset(&err, 0, sizeof(err));
    NsaAttnCudaPlan *plan = nsaAttnCudaPlanCreate(&d, &o, &err);
    if (plan) nsaAttnCudaPlanFree(plan);
    assert_null(plan);
    print_message("# refused: %s\n", err.message);
    assert_non_null(strstr(err.message, needle));
    assert_non_null(strstr(err.message, "allowed"));
    memset(&err, 0, sizeof(err));
    assert_int_equal(nsaAttnCudaPlanMeasure(&d, &o, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, needle));
}

static void test_refuses_bad_options(void **state) {
    (void)state;
    expectOptionRefused((NsaAttnCudaOptions){.sel = (NsaAttnSelDesign)9}, "sel = 9");
    expectOptionRefused((NsaAttnCudaOptions){.mma = (NsaAttnMma)-1}, "mma = -1");
    expectOptionRefused((NsaAttnCudaOptions){.sel_unfused = 2}, "sel_unfused = 2");
    expectOptionRefused((NsaAttnCudaOptions){.cmp_parts = 17}, "cmp_parts = 17");
    expectOptionRefused((NsaAttnCudaOptions){.cmp_parts = -1}, "cmp_parts = -1");
    expectOptionRefused((NsaAttnCudaOptions){.sel_chunk_tokens = 100}, "sel_chunk_tokens = 100");
    expectOptionRefused((NsaAttnCudaOptions){.sel_chunk_tokens = 600}, "sel_chunk_tokens = 600");
    expectOptionRefused((NsaAttnCudaOptions){.sel_chunk_tokens = 2097152},
                        "sel_chunk_tokens = 2097152");
}

static void test_refuses_null(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    NsaAttnDeviceInputs in;
    memset(&in, 0, sizeof(in));
    NsaError err;
    memset(&err, 0, sizeof(err));
    assert_int_equal(nsaAttnForwardCuda(NULL, &d, &in, NULL, NULL, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "plan is NULL"));
    assert_int_equal(nsaAttnBackwardCuda(NULL, &d, &in, NULL, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "plan is NULL"));
    assert_int_equal(nsaAttnCudaPlanBytes(NULL), 0);
    assert_int_equal(nsaAttnCudaPlanMeasure(NULL, NULL, NULL, NULL, &err), -1);
    assert_non_null(strstr(err.message, "dims are NULL"));
    nsaAttnCudaPlanFree(NULL); /* a no-op */
    memset(&err, 0, sizeof(err));
    assert_null(nsaAttnCudaPlanCreateSharing(&d, NULL, NULL, &err));
    assert_non_null(strstr(err.message, "share scratch with is NULL"));
    d.n_sel = 33; /* bad dims are named before the owner is looked at */
    memset(&err, 0, sizeof(err));
    assert_null(nsaAttnCudaPlanCreateSharing(&d, NULL, NULL, &err));
    assert_true(err.message[0] != '\0');
}

/* With a GPU the plan is made and freed; without one it fails with a
 * message, never a crash. Either way no silent success with a NULL plan. */
static void test_plan_on_this_machine(void **state) {
    (void)state;
    NsaAttnDims d = protoDims();
    NsaError err;
    memset(&err, 0, sizeof(err));
    NsaAttnCudaPlan *plan = nsaAttnCudaPlanCreate(&d, NULL, &err);
    size_t state_bytes = 0, scratch_bytes = 0;
    NsaError merr;
    memset(&merr, 0, sizeof(merr));
    const int measured = nsaAttnCudaPlanMeasure(&d, NULL, &state_bytes, &scratch_bytes, &merr);
    if (plan) {
        assert_true(nsaAttnCudaPlanBytes(plan) > 0);
        /* the measure is what the plan allocated: state and scratch */
        assert_int_equal(measured, 0);
        assert_int_equal(nsaAttnCudaPlanBytes(plan), state_bytes + scratch_bytes);
        NsaAttnDeviceInputs in;
        memset(&in, 0, sizeof(in));
        assert_int_equal(nsaAttnForwardCuda(plan, &d, &in, NULL, NULL, NULL, NULL, &err), -1);
        assert_non_null(strstr(err.message, "NULL"));
        d.S = 512; /* larger than planned */
        in.q = in.k_cmp = in.v_cmp = in.k_sel = in.v_sel = in.k_win = in.v_win = in.gates = &d;
        assert_int_equal(nsaAttnForwardCuda(plan, &d, &in, &d, NULL, NULL, NULL, &err), -1);
        assert_non_null(strstr(err.message, "exceed the plan"));
        /* a plan sharing the scratch holds less; unlike dims and a
         * sharer as owner are refused */
        d = protoDims();
        NsaAttnCudaPlan *sharer = nsaAttnCudaPlanCreateSharing(&d, NULL, plan, &err);
        assert_non_null(sharer);
        assert_true(nsaAttnCudaPlanBytes(sharer) > 0);
        assert_true(nsaAttnCudaPlanBytes(sharer) < nsaAttnCudaPlanBytes(plan));
        assert_int_equal(nsaAttnCudaPlanBytes(sharer), state_bytes); /* a sharer holds its state */
        assert_null(nsaAttnCudaPlanCreateSharing(&d, NULL, sharer, &err));
        assert_non_null(strstr(err.message, "shares another"));
        d.S = 128;
        assert_null(nsaAttnCudaPlanCreateSharing(&d, NULL, plan, &err));
        assert_non_null(strstr(err.message, "differ from the scratch owner"));
        nsaAttnCudaPlanFree(sharer);
        nsaAttnCudaPlanFree(plan);
    } else {
        print_message("# no plan on this machine: %s\n", err.message);
        assert_true(err.message[0] != '\0');
        /* no device to measure for either: the same kind of clear failure */
        assert_int_equal(measured, -1);
        print_message("# no measure on this machine: %s\n", merr.message);
        assert_true(merr.message[0] != '\0');
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuses_unbuilt_head_dims),
        cmocka_unit_test(test_refuses_too_many_heads_per_group),
        cmocka_unit_test(test_refuses_large_n_sel),
        cmocka_unit_test(test_refuses_invalid_dims),
        cmocka_unit_test(test_refuses_block_geometry),
        cmocka_unit_test(test_supports_what_it_takes),
        cmocka_unit_test(test_refuses_bad_options),
        cmocka_unit_test(test_refuses_null),
        cmocka_unit_test(test_plan_on_this_machine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* built without CUDA: the fast op is not in libnsa */

static void test_built_without_cuda(void **state) {
    (void)state;
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_built_without_cuda)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
