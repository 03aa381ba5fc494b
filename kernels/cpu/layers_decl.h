/* layers_decl.h - CPU reference transformer layers (embedding, RMSNorm,
 * linear, RoPE, MLP, cross-entropy, AdamW), one file each under
 * kernels/cpu/. Included per precision by cpu_ops_decl.h; no guard.
 * Backward functions ADD into their gradient outputs. */
