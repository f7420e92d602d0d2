/* Decode attention over a KV cache on the CPU, fp32, for one query per (row, head): a plain-AR step.
 *
 * Why: torch's SDPA kernel for the CPU reads a batch-64 decode step's cache at ~12 GB/s where a plain read of the
 * same slots reaches ~22 (docs/benchmarks.md, "The step at the roofline"): per (row, head) it runs small GEMMs whose
 * fixed cost, not the bytes, sets the pace. This loop reads each (row, head)'s keys once, then its values once with
 * the softmax's exp fused in, and prefetches the values during the key pass and the next (row, head)'s keys during
 * the value pass, so the memory stream does not stall between the passes. It reads at a plain read's speed.
 *
 * Windows of 2 or more queries stay with SDPA: a version of this loop for them measured slower than SDPA (exp and
 * the per-query sums cost more than the bytes saved; docs/benchmarks.md).
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
  const float* q; int64_t qb, qh, qs;
  const float* k; const float* v; int64_t kb, kh, vb, vh;
  const uint8_t* mask; int64_t mb, ms;
  float* out; int64_t ob, oh, os;
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


/* exp(x) for x <= 0, vectorisable (Cephes' expf: 2^n times a degree-6 polynomial, within 2 ulp); 0 below -87. */
static inline float exp_neg(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float n = floorf(xc * 1.44269504088896341f + 0.5f);
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
  return x < -87.0f ? 0.f : p * two_n.f;
}

static inline __attribute__((always_inline)) void attend_q(const Args* a, int64_t i, float* restrict sc,
                                                            const int64_t S, const int64_t D) {
  const int64_t H = a->H, T = a->T, b = i / H, h = i % H;
  const float scale = 1.0f / sqrtf((float)D);
  const float* restrict qr = a->q + b * a->qb + h * a->qh;
  const float* restrict kr = a->k + b * a->kb + h * a->kh;
  const float* restrict vr = a->v + b * a->vb + h * a->vh;
  const uint8_t* restrict mr = a->mask + b * a->mb;
  float qv[S * D], mx[S], z[S], acc[S * D];
  for (int64_t s = 0; s < S; ++s) {
    mx[s] = -INFINITY;
    for (int64_t d = 0; d < D; ++d) qv[s * D + d] = qr[s * a->qs + d] * scale;
  }
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(vr + t * D, D);
    const float* restrict kt = kr + t * D;
    for (int64_t s = 0; s < S; ++s) {
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qv[s * D + d] * kt[d];
      const float x = mr[s * a->ms + t] ? dot : -INFINITY;
      sc[s * T + t] = x;
      mx[s] = x > mx[s] ? x : mx[s];
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    const float m = mx[s] == -INFINITY ? 0.f : mx[s];
    float* restrict row = sc + s * T;
    float zs = 0.f;
#pragma omp simd reduction(+ : zs)
    for (int64_t t = 0; t < T; ++t) {
      row[t] = exp_neg(row[t] - m);
      zs += row[t];
    }
    z[s] = zs;
    for (int64_t d = 0; d < D; ++d) acc[s * D + d] = 0.f;
  }
  const int64_t n = i + 1 < a->B * H ? i + 1 : i;
  const float* restrict kn = a->k + (n / H) * a->kb + (n % H) * a->kh;
  for (int64_t t = 0; t < T; ++t) {
    prefetch_row(kn + t * D, D);
    const float* restrict vt = vr + t * D;
    for (int64_t s = 0; s < S; ++s) {
      const float p = sc[s * T + t];
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
 * threads; the common head sizes take specialised copies of the loop. */
void decode_attention(const float* q, int64_t qb, int64_t qh, int64_t qs, const float* k, const float* v,
                      int64_t kb, int64_t kh, int64_t vb, int64_t vh, const uint8_t* mask, int64_t mb, int64_t ms,
                      float* out, int64_t ob, int64_t oh, int64_t os, int64_t B, int64_t H, int64_t S, int64_t T,
                      int64_t D, int nthreads) {
  const Args a = {q, qb, qh, qs, k, v, kb, kh, vb, vh, mask, mb, ms, out, ob, oh, os, B, H, T};
#pragma omp parallel num_threads(nthreads)
  {
    float* sc = malloc(sizeof(float) * (size_t)(S * T));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < B * H; ++i) {
      if (D == 32) {
        switch (S) {
          case 1: attend(&a, i, sc, 32); break;
          case 2: attend_q(&a, i, sc, 2, 32); break;
          case 3: attend_q(&a, i, sc, 3, 32); break;
          case 4: attend_q(&a, i, sc, 4, 32); break;
          case 5: attend_q(&a, i, sc, 5, 32); break;
          case 6: attend_q(&a, i, sc, 6, 32); break;
          case 7: attend_q(&a, i, sc, 7, 32); break;
          case 8: attend_q(&a, i, sc, 8, 32); break;
        }
      }
    }
    free(sc);
  }
}
