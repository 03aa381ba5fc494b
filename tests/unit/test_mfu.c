/* test_mfu.c - MFU (daemon/mfu.c): the table of GPU peaks by driver name
 * (whole-word matches, the more specific model first), which jobs have an
 * MFU at all (CUDA in bf16/fp16 on a GPU of known peak), the FLOPs per
 * token (nsaModelFlopsPerToken at the job's seq_len) and the ratio. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "config.h"
#include "mfu.h"

static void test_peak_by_device_name(void **state) {
    (void)state;
    assert_true(mfuPeakOfDevice("NVIDIA H100 80GB HBM3") == 989e12); /* SXM */
    assert_true(mfuPeakOfDevice("NVIDIA H100 PCIe") == 756e12);
    assert_true(mfuPeakOfDevice("NVIDIA H100 NVL") == 835e12);
    assert_true(mfuPeakOfDevice("NVIDIA H200") == 989e12);
    assert_true(mfuPeakOfDevice("NVIDIA H200 NVL") == 835e12);
    assert_true(mfuPeakOfDevice("NVIDIA GH200 480GB") == 989e12);
    assert_true(mfuPeakOfDevice("NVIDIA A100-SXM4-80GB") == 312e12); /* dashes separate words */
    assert_true(mfuPeakOfDevice("NVIDIA A100 80GB PCIe") == 312e12);
    assert_true(mfuPeakOfDevice("NVIDIA L4") == 121e12);
    assert_true(mfuPeakOfDevice("NVIDIA L40S") == 362e12); /* not L4's: whole words only */
    assert_true(mfuPeakOfDevice("NVIDIA L40") == 181e12);
    assert_true(mfuPeakOfDevice("nvidia h100 pcie") == 756e12); /* case does not matter */
    /* models the table does not know: no number rather than a guess */
    assert_true(mfuPeakOfDevice("NVIDIA GeForce RTX 4090") == 0);
    assert_true(mfuPeakOfDevice("NVIDIA A10") == 0);  /* not A100's */
    assert_true(mfuPeakOfDevice("NVIDIA H1000") == 0); /* not H100's */
    assert_true(mfuPeakOfDevice("") == 0);
    assert_true(mfuPeakOfDevice(NULL) == 0);
}

static JobConfig *tinyJob(NsaDevice device, NsaPrecision precision) {
    static JobConfig cfg;
    configDefaults(&cfg);
    cfg.model.dim = 32;
    cfg.model.n_layers = 1;
    cfg.model.n_heads = 2;
    cfg.model.n_kv_groups = 1;
    cfg.model.d_k = cfg.model.d_v = 16;
    cfg.train.seq_len = 64;
    cfg.runtime.device = device;
    cfg.runtime.precision = precision;
    return &cfg;
}

static void test_which_jobs_have_an_mfu(void **state) {
    (void)state;
    const double peaks[3] = {989e12, 0, 495e12};
    const int dev0[1] = {0}, dev1[1] = {1}, dev02[2] = {0, 2};
    assert_true(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_BF16), dev0, 1, peaks, 3) == 989e12);
    assert_true(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_FP16), dev0, 1, peaks, 3) == 989e12);
    /* data parallel: the sum over the GPUs the job names */
    assert_true(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_BF16), dev02, 2, peaks, 3) == 989e12 + 495e12);
    /* fp32 on CUDA runs on CUDA cores, the CPU engine has no known peak */
    assert_true(isnan(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_F32), dev0, 1, peaks, 3)));
    assert_true(isnan(mfuJobPeak(tinyJob(NSA_DEVICE_CPU, NSA_PREC_F32), dev0, 1, peaks, 3)));
    /* a GPU of unknown peak, one beyond those known, none at all */
    assert_true(isnan(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_BF16), dev1, 1, peaks, 3)));
    assert_true(isnan(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_BF16), dev02, 2, peaks, 2)));
    assert_true(isnan(mfuJobPeak(tinyJob(NSA_DEVICE_CUDA, NSA_PREC_BF16), dev0, 0, peaks, 3)));
    /* multi-node: every rank of the job at this node's mean peak */
    assert_true(mfuWorldPeak(2e15, 8, 2) == 8e15);
    assert_true(mfuWorldPeak(2e15, 2, 2) == 2e15);
    assert_true(mfuWorldPeak(2e15, 0, 0) == 2e15);
}

static void test_flops_and_ratio(void **state) {
    (void)state;
    JobConfig *cfg = tinyJob(NSA_DEVICE_CPU, NSA_PREC_F32);
    NsaFlops f;
    NsaError err;
    assert_int_equal(nsaModelFlopsPerToken(&cfg->model, 64, &f, &err), 0);
    double fpt = 0;
    assert_int_equal(mfuFlopsPerToken(cfg, &fpt, &err), 0);
    assert_true(fpt == f.total && fpt > 0);
    cfg->model.n_layers = 0; /* a model that does not validate */
    assert_int_equal(mfuFlopsPerToken(cfg, &fpt, &err), -1);

    assert_true(fabs(mfuOf(1000.0, 6e9, 12e12) - 0.5) < 1e-15);
    assert_true(mfuOf(0.0, 6e9, 12e12) == 0.0);
    assert_true(isnan(mfuOf(NAN, 6e9, 12e12)));
    assert_true(isnan(mfuOf(1000.0, NAN, 12e12)));
    assert_true(isnan(mfuOf(1000.0, 6e9, NAN)));
    assert_true(isnan(mfuOf(1000.0, 6e9, 0)));
    assert_true(isnan(mfuOf(-1.0, 6e9, 12e12)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_by_device_name),
        cmocka_unit_test(test_which_jobs_have_an_mfu),
        cmocka_unit_test(test_flops_and_ratio),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
