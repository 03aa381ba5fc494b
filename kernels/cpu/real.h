/* real.h - precision templating for the CPU reference.
 *
 * Every source in kernels/cpu is compiled twice: once as float (the CPU
 * training engine, suffix F32) and once with -DNSA_CPU_F64 as double (the
 * oracle for gradient checks, suffix F64). Inside a templated source, `real`
 * is the element type and FN(name) gives the name with its suffix. */
#ifndef NSA_CPU_REAL_H
#define NSA_CPU_REAL_H

#ifdef NSA_CPU_F64
typedef double real;
#define FN(name) name##F64
#else
typedef float real;
#define FN(name) name##F32
#endif

#endif
