/* nsa_rng.h - a small seeded deterministic random number generator.
 *
 * xoshiro256** seeded through splitmix64, plus uniform, bounded-integer and
 * normal (Box-Muller) draws. The same (seed, stream) gives the same sequence
 * on every machine: nsaModelInit draws each tensor's weights on the host from
 * stream = the tensor's layout index, so every engine starts from the same
 * weights. No global state: each caller owns its NsaRng. */
#ifndef NSA_RNG_H
#define NSA_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct NsaRng {
    uint64_t s[4];
    int has_spare;    /* Box-Muller makes normals in pairs; the second waits here */
    double spare;
} NsaRng;

/* Seeds rng for (seed, stream); distinct streams give independent sequences.
 * Cannot fail. */
void nsaRngSeed(NsaRng *rng, uint64_t seed, uint64_t stream);

/* The next 64 random bits. */
uint64_t nsaRngNext(NsaRng *rng);

/* Uniform double in [0, 1) with 53 random bits. */
double nsaRngUniform(NsaRng *rng);

/* Uniform integer in [0, n); n must be > 0 (returns 0 for n == 0). Unbiased. */
uint32_t nsaRngBelow(NsaRng *rng, uint32_t n);

/* Standard normal N(0, 1). */
double nsaRngNormal(NsaRng *rng);

#ifdef __cplusplus
}
#endif
#endif /* NSA_RNG_H */
