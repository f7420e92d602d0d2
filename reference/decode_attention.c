/* Decode attention over a KV cache on the CPU, fp32, for one query per (row, head): a plain-AR step.
 *
 * Why: torch's SDPA kernel for the CPU reads a batch-64 decode step's cache at ~12 GB/s where a plain read of the
 * same slots reaches ~22 (docs/benchmarks.md, "The step at the roofline"): per (row, head) it runs small GEMMs whose
 * fixed cost, not the bytes, sets the pace. This loop reads each (row, head)'s keys once, then its values once with
 * the softmax's exp fused in, and prefetches the values during the key pass and the next (row, head)'s keys during
 * the value pass, so the memory stream does not stall between the passes. It reads at a plain read's speed.
 *
 * Windows of 2 or more queries stay with SDPA: versions of this loop for them measured slower than SDPA from 4
 * queries per row on (docs/benchmarks.md; lab/results/roofline_37/c_loop/windows_attempt.c).
 *
 * Same result as SDPA with a boolean mask up to float rounding: scale 1/sqrt(D), masked slots excluded. A query with
 * every slot masked gives zeros (the model never asks for one). Each (row, head) is computed by one thread in a fixed
 * order, so a row's output does not depend on its batch-mates or the thread count.
 *
 * Built at run time by reference/decode_attention.py (cc -O3 -march=native -fopenmp), which falls back to SDPA when
 * no compiler is there. OpenMP resolves to the libgomp torch has already loaded: one thread pool, torch's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define LINE 16 /* floats per 64-byte cache line */

static inline void prefetch_row(const float* restrict p, int64_t D) {
  for (int64_t d = 0; d < D; d += LINE) __builtin_prefetch(p + d, 0, 3);
}

/* The arguments, by element strides (the last dim of each contiguous): q [B, H, 1, D]; k, v [B, H, Talloc, D] (a
 * slot's D values adjacent); mask [B, 1, 1, T] bool, nonzero = attend; out [B, 1, H, D]. */
typedef struct {
  const float* q; int64_t qb, qh;
  const float* k; const float* v; int64_t kb, kh, vb, vh;
  const uint8_t* mask; int64_t mb;
  float* out; int64_t ob, oh;
  int64_t B, H, T;
} Args;

/* One (row, head) i = b * H + h: its keys once (scores and their max), then its values once with the exp. Inlined
 * with D a constant where the entry point knows it, so the compiler unrolls the inner loops (a call would hide it
 * from the OpenMP region the compiler outlines, and the loop ran 25% slower). sc: T floats of scratch. */
static inline __attribute__((always_inline)) void attend(const Args* a, int64_t i, float* restrict sc,
                                                          const int64_t D) {
  const int64_t H = a->H, T = a->T, b = i / H, h = i % H;
  const float scale = 1.0f / sqrtf((float)D);
  const float* restrict qv = a->q + b * a->qb + h * a->qh;
  const float* restrict kr = a->k + b * a->kb + h * a->kh;
  const float* restrict vr = a->v + b * a->vb + h * a->vh;
  const uint8_t* restrict mr = a->mask + b * a->mb;
  float mx = -INFINITY;
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(vr + t * D, D);  /* the values' lines come in while the keys are read */
    const float* restrict kt = kr + t * D;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += qv[d] * kt[d];
    const float x = mr[t] ? dot * scale : -INFINITY;
    sc[t] = x;
    mx = x > mx ? x : mx;
  }
  mx = mx == -INFINITY ? 0.f : mx;  /* every slot masked: every weight exp(-inf) = 0, the output zeros */
  float z = 0.f;
  const int64_t n = i + 1 < a->B * H ? i + 1 : i;  /* the next (row, head): its keys come in meanwhile */
  const float* restrict kn = a->k + (n / H) * a->kb + (n % H) * a->kh;
  float acc[D];  /* on the stack: the compiler keeps it in registers */
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(kn + t * D, D);
    const float* restrict vt = vr + t * D;
    const float p = expf(sc[t] - mx);
    z += p;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += p * vt[d];
  }
  float* restrict o = a->out + b * a->ob + h * a->oh;
  const float iz = z > 0.f ? 1.f / z : 0.f;
  for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * iz;
}

/* The entry point (decode_attention.py calls it through ctypes). The (row, head)s are split evenly over the
 * threads; the common head sizes take specialised copies of the loop. */
void decode_attention(const float* q, int64_t qb, int64_t qh, const float* k, const float* v, int64_t kb,
                      int64_t kh, int64_t vb, int64_t vh, const uint8_t* mask, int64_t mb, float* out, int64_t ob,
                      int64_t oh, int64_t B, int64_t H, int64_t T, int64_t D, int nthreads) {
  const Args a = {q, qb, qh, k, v, kb, kh, vb, vh, mask, mb, out, ob, oh, B, H, T};
#pragma omp parallel num_threads(nthreads)
  {
    float* sc = malloc(sizeof(float) * (size_t)T);  /* a few KB; NULL only when the process is out of memory */
#pragma omp for schedule(static)
    for (int64_t i = 0; i < B * H; ++i) {
      if (sc == NULL) __builtin_trap();  /* stop loudly rather than write through a null pointer */
      if (D == 32) attend(&a, i, sc, 32);
      else if (D == 64) attend(&a, i, sc, 64);
      else if (D == 128) attend(&a, i, sc, 128);
      else attend(&a, i, sc, D);
    }
    free(sc);
  }
}
