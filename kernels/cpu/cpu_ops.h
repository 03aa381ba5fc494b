/* cpu_ops.h - the CPU reference ops, both precisions.
 *
 * Templated sources include this after real.h: the declarations below are
 * then made for that source's precision through FN()/real. Non-templated code
 * (the dispatcher, tests) includes it without real.h and gets both the F32
 * and the F64 declarations. The op bodies live in one file per op. */
#ifndef NSA_CPU_OPS_H
#define NSA_CPU_OPS_H

#include "../nsa.h"

#ifdef NSA_CPU_REAL_H
#include "cpu_ops_decl.h"
#else
#define NSA_CPU_OPS_BOTH
typedef float real_f32_t;
typedef double real_f64_t;
#define real real_f32_t
#define FN(name) name##F32
#include "cpu_ops_decl.h"
#undef real
#undef FN
#define real real_f64_t
#define FN(name) name##F64
#include "cpu_ops_decl.h"
#undef real
#undef FN
#endif

#endif
