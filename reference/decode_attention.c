/* Decode attention over a KV cache on the CPU, fp32: few queries per (row, head), each against the slots in use.
 *
 * Why: torch's SDPA kernel for the CPU reads a batch-64 decode step's cache at ~12 GB/s where a plain read of the
 * same slots reaches ~22 (docs/benchmarks.md, "The step at the roofline"): per (row, head) it runs small GEMMs whose
 * fixed cost, not the bytes, sets the pace. This loop reads each (row, head)'s keys once (every query's score at
 * once), then its values once with the softmax's exp fused in, and prefetches the values during the key pass and
 * the next (row, head)'s keys during the value pass, so the memory stream does not stall between the passes.
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

#define MAX_Q 16 /* queries per (row, head); the Python side sends more to SDPA */
#define MAX_D 128 /* head size; the Python side sends larger to SDPA */
#define LINE 16  /* floats per 64-byte cache line */

static inline void prefetch_row(const float* restrict p, int64_t D) {
  for (int64_t d = 0; d < D; d += LINE) __builtin_prefetch(p + d, 0, 3);
}

/* The arguments, by element strides (the last dim of each contiguous): q [B, H, S, D]; k, v [B, H, Talloc, D] (a
 * slot's D values adjacent); mask [B, 1, S, T] bool, nonzero = attend; out [B, S, H, D]. */
typedef struct {
  const float* q; int64_t qb, qh, qs;
  const float* k; const float* v; int64_t kb, kh, vb, vh;
  const uint8_t* mask; int64_t mb, ms;
  float* out; int64_t ob, oh, os;
  int64_t B, H, S, T, D;
} Args;

/* One (row, head) i = b * H + h: the keys once (every query's score), then the values once with the softmax's exp.
 * Inlined with S and D as constants where the entry point knows them, so the compiler unrolls the inner loops. */
static inline __attribute__((always_inline)) void attend(const Args* a, int64_t i, float* restrict sc,
                                                          const int64_t S, const int64_t D) {
  const int64_t H = a->H, T = a->T, b = i / H, h = i % H;
  const float scale = 1.0f / sqrtf((float)D);
  const float* restrict kr = a->k + b * a->kb + h * a->kh;
  const float* restrict vr = a->v + b * a->vb + h * a->vh;
  const uint8_t* restrict mr = a->mask + b * a->mb;
  const float* restrict qr = a->q + b * a->qb + h * a->qh;
  float mx[MAX_Q], z[MAX_Q], acc[MAX_Q * MAX_D];  /* on the stack: the compiler keeps them in registers */
  for (int64_t s = 0; s < S; ++s) mx[s] = -INFINITY;
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(vr + t * D, D);  /* the values' lines come in while the keys are read */
    const float* restrict kt = kr + t * D;
    for (int64_t s = 0; s < S; ++s) {
      const float* restrict qv = qr + s * a->qs;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qv[d] * kt[d];
      const float x = mr[s * a->ms + t] ? dot * scale : -INFINITY;
      sc[s * T + t] = x;
      mx[s] = x > mx[s] ? x : mx[s];
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    mx[s] = mx[s] == -INFINITY ? 0.f : mx[s];  /* every slot masked: exp(-inf) = 0, the output zeros */
    z[s] = 0.f;
    for (int64_t d = 0; d < D; ++d) acc[s * D + d] = 0.f;
  }
  const int64_t n = i + 1 < a->B * H ? i + 1 : i;  /* the next (row, head): its keys come in meanwhile */
  const float* restrict kn = a->k + (n / H) * a->kb + (n % H) * a->kh;
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(kn + t * D, D);
    const float* restrict vt = vr + t * D;
    for (int64_t s = 0; s < S; ++s) {
      const float p = expf(sc[s * T + t] - mx[s]);
      z[s] += p;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[s * D + d] += p * vt[d];
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    float* restrict o = a->out + b * a->ob + h * a->oh + s * a->os;
    const float iz = z[s] > 0.f ? 1.f / z[s] : 0.f;
    for (int64_t d = 0; d < D; ++d) o[d] = acc[s * D + d] * iz;
  }
}

/* The entry point (decode_attention.py calls it through ctypes). The (row, head)s are split evenly over the
 * threads; plain AR (one query per row) and the model's head sizes take specialised copies of the loop. */
void decode_attention(const float* q, int64_t qb, int64_t qh, int64_t qs,
                      const float* k, const float* v, int64_t kb, int64_t kh, int64_t vb, int64_t vh,
                      const uint8_t* mask, int64_t mb, int64_t ms,
                      float* out, int64_t ob, int64_t oh, int64_t os,
                      int64_t B, int64_t H, int64_t S, int64_t T, int64_t D, int nthreads) {
  const Args a = {q, qb, qh, qs, k, v, kb, kh, vb, vh, mask, mb, ms, out, ob, oh, os, B, H, S, T, D};
#pragma omp parallel num_threads(nthreads)
  {
    float* sc = malloc(sizeof(float) * (size_t)(S * T));  /* scores [S, T] */
#pragma omp for schedule(static)
    for (int64_t i = 0; i < B * H; ++i) {
      if (S == 1 && D == 32) attend(&a, i, sc, 1, 32);
      else if (D == 32) attend(&a, i, sc, S, 32);
      else if (S == 1 && D == 64) attend(&a, i, sc, 1, 64);
      else if (D == 64) attend(&a, i, sc, S, 64);
      else attend(&a, i, sc, S, D);
    }
    free(sc);
  }
}
