/* RMSNorm written the way llama2.c's run.c and llm.c's train code write it: float32 throughout,
 * one row at a time, the sum of squares accumulated left to right in a float, eps = 1e-5 fixed
 * inside the square root, and 1/sqrtf for the statistic.
 *
 * Our own code of that shape, compiled by the zoo at test time and called through ctypes.
 * Rows are contiguous, `size` floats each; `weight` has `size` entries.
 */
#include <math.h>

/* y[j] = weight[j] * (rstd * x[j]),  rstd = 1 / sqrt(mean(x^2) + 1e-5), for one row. */
static void rmsnorm_row(float *o, const float *x, const float *weight, int size) {
    float ss = 0.0f;
    for (int j = 0; j < size; j++) {
        ss += x[j] * x[j];                  /* sum of squares, float accumulator */
    }
    ss /= size;                             /* mean of squares */
    ss += 1e-5f;                            /* eps inside the square root, always 1e-5 */
    ss = 1.0f / sqrtf(ss);                  /* rstd: sqrtf rounded, then the division */
    for (int j = 0; j < size; j++) {
        o[j] = weight[j] * (ss * x[j]);     /* x times rstd first, then the weight */
    }
}

void rmsnorm_forward(float *out, const float *x, const float *weight, int rows, int size) {
    for (int r = 0; r < rows; r++) {
        rmsnorm_row(out + (long)r * size, x + (long)r * size, weight, size);
    }
}

/* Backward for one row, in the staged form of llm.c's layernorm_backward without the mean:
 *   xhat = x * rstd,  dxhat = dy * w,  c = mean(dxhat * xhat)
 *   dx = rstd * (dxhat - xhat * c)          (direct term minus the path through rstd)
 *   dw += dy * xhat                         (accumulated over rows by the caller's loop)
 * All in float32, rstd recomputed exactly as the forward computes it.
 */
static void rmsnorm_backward_row(float *dx, float *dweight, const float *dy, const float *x,
                                 const float *weight, int size) {
    float ss = 0.0f;
    for (int j = 0; j < size; j++) {
        ss += x[j] * x[j];
    }
    ss /= size;
    ss += 1e-5f;
    float rstd = 1.0f / sqrtf(ss);
    float c = 0.0f;
    for (int j = 0; j < size; j++) {
        float xhat = x[j] * rstd;
        float dxhat = dy[j] * weight[j];
        c += dxhat * xhat;
    }
    c /= size;
    for (int j = 0; j < size; j++) {
        float xhat = x[j] * rstd;
        float dxhat = dy[j] * weight[j];
        dx[j] = rstd * (dxhat - xhat * c);  /* direct term minus the path through rstd */
        dweight[j] += dy[j] * xhat;
    }
}

/* dweight must arrive zeroed: it is accumulated over the rows. */
void rmsnorm_backward(float *dx, float *dweight, const float *dy, const float *x,
                      const float *weight, int rows, int size) {
    for (int r = 0; r < rows; r++) {
        long off = (long)r * size;
        rmsnorm_backward_row(dx + off, dweight, dy + off, x + off, weight, size);
    }
}
