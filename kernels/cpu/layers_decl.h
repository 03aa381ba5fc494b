/* layers_decl.h - CPU reference transformer layers (embedding, RMSNorm,
 * linear, RoPE, activations, cross-entropy, AdamW), one file each under
 * kernels/cpu/. Included per precision by cpu_ops_decl.h; no guard.
 * Backward functions ADD into their gradient outputs unless they say
 * "writes". N is the number of rows (tokens), always a size_t. */

/* embed.c: out[n][:] = table[tokens[n]][:] (tokens already range-checked). */
void FN(nsaCpuEmbedForward)(real *out, const real *table, const int32_t *tokens, size_t N, int C);
void FN(nsaCpuEmbedBackward)(real *dtable, const real *dout, const int32_t *tokens, size_t N,
                             int C);

/* rmsnorm.c: y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); rstd [N] is
 * saved for the backward. y may not alias x. */
void FN(nsaCpuRmsNormForward)(real *y, real *rstd, const real *x, const real *w, size_t N, int C,
                              double eps);
void FN(nsaCpuRmsNormBackward)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                               const real *rstd, size_t N, int C);

/* linear.c: the definitions, y[N][out] = x[N][in] W^T with W [out][in]
 * (writes y); backward dx += dy W (dx may be NULL to skip), dW += dy^T x. */
void FN(nsaCpuLinearForward)(real *y, const real *x, const real *w, size_t N, int in, int out);
void FN(nsaCpuLinearBackward)(real *dx, real *dw, const real *dy, const real *x, const real *w,
                              size_t N, int in, int out);
/* linear.c: the fast path. t[c][r] = a[r][c] for a [rows][cols];
 * y[r][m] = (accumulate ? y[r][m] : 0) + sum_k a[r][k] b[k][m] with
 * a [rows][K], b [K][M]. Each element sums over k in order, so splitting the
 * rows over calls (threads) gives the same bits. */
void FN(nsaCpuTranspose)(real *t, const real *a, size_t rows, int cols);
void FN(nsaCpuMatmul)(real *y, const real *a, const real *b, size_t rows, int K, int M,
                      int accumulate);
/* nsaCpuMatmul's columns [m_lo, m_hi) only: splitting the columns over calls
 * (threads) gives the same bits too. */
void FN(nsaCpuMatmulCols)(real *y, const real *a, const real *b, size_t rows, int K, int M,
                          int m_lo, int m_hi, int accumulate);

/* rope.c: rotates, in place, each head vector of x[B*S][heads][dim] at its
 * absolute position t = row % S. Split-halves pairing: (i, i + dim/2) is
 * rotated by angle t * theta_i, theta_i = base^(-2i/dim).
 * cos_sin [S_max][dim/2][2] is the table nsaCpuRopeTable writes (writes).
 * The backward rotates the gradient by the opposite angle, in place
 * (writes: the rotation is its own adjoint up to the sign of the angle). */
void FN(nsaCpuRopeTable)(real *cos_sin, int S_max, int dim, double base);
void FN(nsaCpuRopeForward)(real *x, const real *cos_sin, int B, int S, int heads, int dim);
void FN(nsaCpuRopeBackward)(real *dx, const real *cos_sin, int B, int S, int heads, int dim);

/* activation.c: elementwise. silu(a) = a * sigmoid(a) (writes out);
 * swiglu: out = silu(a) * b; sigmoid: out = 1/(1+exp(-a)), in place allowed.
 * The sigmoid backward takes the saved output g: da += dout * g (1 - g). */
void FN(nsaCpuSiluForward)(real *out, const real *a, size_t n);
void FN(nsaCpuSiluBackward)(real *da, const real *dout, const real *a, size_t n);
void FN(nsaCpuSwigluForward)(real *out, const real *a, const real *b, size_t n);
void FN(nsaCpuSwigluBackward)(real *da, real *db, const real *dout, const real *a, const real *b,
                              size_t n);
void FN(nsaCpuSigmoidForward)(real *out, const real *a, size_t n);
void FN(nsaCpuSigmoidBackward)(real *da, const real *dout, const real *g, size_t n);

/* crossentropy.c: per row n with targets[n] != -1,
 *   loss_n = logsumexp(logits[n]) - logits[n][targets[n]],
 * computed in double. Forward writes lse [N] (the row log-sum-exp) and
 * returns the sum of loss_n over counted rows; *count gets their number.
 * Backward writes dlogits = scale * (softmax(logits) - onehot(target)) on
 * counted rows and 0 on ignored rows. */
double FN(nsaCpuCrossEntropyForward)(real *lse, const real *logits, const int32_t *targets,
                                     size_t N, int V, size_t *count);
void FN(nsaCpuCrossEntropyBackward)(real *dlogits, const real *logits, const real *lse,
                                    const int32_t *targets, size_t N, int V, double scale);

/* adamw.c: sum of squares of g[0..n) in double (for the global norm). */
double FN(nsaCpuSumSquares)(const real *g, size_t n);

/* adamw.c: one AdamW update of n elements, in place on p, m, v:
 *   g' = g * grad_scale (clipping); m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 *   p -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + weight_decay * p)
 * with bc1 = 1 - b1^t, bc2 = 1 - b2^t; weight_decay is 0 for undecayed
 * tensors. The decay uses p before this step's update (decoupled). */
void FN(nsaCpuAdamW)(real *p, const real *g, real *m, real *v, size_t n, double lr, double beta1,
                     double beta2, double eps, double weight_decay, double bc1, double bc2,
                     double grad_scale);
