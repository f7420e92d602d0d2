/* Decode attention over a KV cache on the CPU: 1 to 16 queries per (row, head), fp32 or bf16 keys and values,
 * fp32 accumulation. The kernel behind the torch op `ssdgen::decode_attention` (reference/decode_attention.py,
 * which checks every argument before it calls here: this file trusts shapes, strides and dtypes).
 *
 * Why: torch's SDPA kernel for the CPU reads a decode step's cache at about half the speed a plain read of it
 * reaches: per (row, head) it runs small GEMMs whose fixed cost, not the bytes, sets the pace (docs/benchmarks.md,
 * "The step at the roofline"). Here each (row, head)'s keys are read once, then its values once, for all of the
 * row's queries, in blocks of TB slots; the values' lines are prefetched during the key pass and the next
 * (row, head)'s keys during the value pass, so the memory stream does not stall between passes.
 *
 * One query per row (plain AR): #37's loop, its arithmetic unchanged for fp32 (a dot product per slot, libm's expf),
 * now by blocks (the prefetches a block at a time; a bf16 block widened to fp32 first).
 * Several queries: the queries are the lanes of a vector (8 or 16 floats, GCC's vector extension, so it builds
 * on any CPU -march=native names), so a slot's scores for every query are one broadcast-FMA per head dimension,
 * with a block of the queries' dimensions held in registers, and no horizontal sum; #37's attempts computed each
 * query's score as its own dot product ending in a horizontal sum and lost to SDPA from 4 queries on. The value
 * pass is the same shape: a slot's weights for every query times a broadcast value element. The softmax's exp is
 * a polynomial over those vectors.
 *
 * Masks are arbitrary (a window's causal triangle, a packed ragged batch, a tree's branches): mask[b, 0, s, t]
 * nonzero = query s of row b attends to slot t. A row reads only up to its last attended slot, so a row's output
 * does not depend on its batch-mates' lengths. Scale 1/sqrt(D). A query with every slot masked gives zeros (the
 * model never asks for one). Each (row, head) is computed by one thread in a fixed order, so a row's output does
 * not depend on its batch-mates or the thread count.
 *
 * The multi-query kernel is written once, below the `#else`, and compiled twice by including this file into
 * itself, once per vector width (QL = 8, 16 lanes): a kernel must know its vector type at compile time.
 *
 * Built once per machine by reference/native_build.py (cc -O3 -march=native -fopenmp), cached by source,
 * compiler, flags and CPU. OpenMP resolves to the libgomp torch has already loaded: one thread pool, torch's.
 */
#ifndef QL /* ------------------------------------------------------------------- the common part, once */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TB 32     /* slots per block: a bf16 block widened to fp32 stays in L1 (32 x D x 4 B: 4 KB at D = 32) */
#define LINE 64   /* bytes per cache line */
#define MAXQ 16   /* queries per row, the op's limit */

#ifdef __AVX512F__
#define VREGS 32  /* vector registers, each VBYTES wide */
#define VBYTES 64
#else
#define VREGS 16
#define VBYTES 32
#endif

/* Every argument as the op passes it (reference/decode_attention.py `_Args` mirrors it), element strides: q [B, H,
 * S, D]; k, v [B, H, Talloc, D], a slot's D elements adjacent; mask [B, 1, S, T] bytes; out [B, S, H, D]. The
 * dtype flags: 1 = bf16, 0 = fp32. */
typedef struct {
  const void* q; int64_t qb, qh, qs, q_bf16;
  const void* k; const void* v; int64_t kb, kh, vb, vh, kv_bf16;
  const uint8_t* mask; int64_t mb, ms;
  void* out; int64_t ob, os, oh, out_bf16;
  int64_t B, H, S, T, D;
} Args;

/* One thread's scratch, allocated once per call: sc and bias T x MAXQ floats, qT and acc D x MAXQ, blk TB x D. row:
 * the batch row whose mask bias holds (-1: none yet), len that row's attended length. */
typedef struct {
  float *sc, *bias, *qT, *acc, *blk;
  int64_t row, len;
} Scratch;

typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline float bf16_f32(uint16_t x) {
  union { uint32_t u; float f; } c = {.u = (uint32_t)x << 16};
  return c.f;
}

static inline uint16_t f32_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
  union { float f; uint32_t u; } c = {.f = f};
  if (f != f) return (uint16_t)((c.u >> 16) | 0x40);
  return (uint16_t)((c.u + 0x7FFFu + ((c.u >> 16) & 1u)) >> 16);
}

static inline float load_el(const void* p, int64_t i, int64_t bf16) {
  return bf16 ? bf16_f32(((const uint16_t*)p)[i]) : ((const float*)p)[i];
}

static inline void store_el(void* p, int64_t i, int64_t bf16, float x) {
  if (bf16) ((uint16_t*)p)[i] = f32_bf16(x);
  else ((float*)p)[i] = x;
}

/* n slots of a cache row from slot t0, as fp32: the cache itself when it is fp32, else widened into blk (bf16's
 * bits are fp32's top half, so widening is exact). */
static inline const float* slots_f32(const void* row, int64_t t0, int64_t n, int64_t D, int64_t bf16, float* blk) {
  if (!bf16) return (const float*)row + t0 * D;
  const uint16_t* src = (const uint16_t*)row + t0 * D;
  const int64_t m = n * D;
  int64_t i = 0;
  for (; i + 16 <= m; i += 16) {
    u16x16 h;
    memcpy(&h, src + i, sizeof h);
    const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    memcpy(blk + i, &w, sizeof w);
  }
  for (; i < m; ++i) blk[i] = bf16_f32(src[i]);
  return blk;
}

static inline void prefetch(const void* row, int64_t t0, int64_t n, int64_t D, int64_t bf16) {
  const int64_t size = bf16 ? 2 : 4;
  const char* p = (const char*)row + t0 * D * size;
  for (int64_t o = 0; o < n * D * size; o += LINE) __builtin_prefetch(p + o, 0, 3);
}

/* The length row b attends to: one past its last slot any query attends to (0: every slot masked). */
static int64_t attended(const Args* a, int64_t b) {
  int64_t len = 0;
  for (int64_t s = 0; s < a->S; ++s) {
    const uint8_t* m = a->mask + b * a->mb + s * a->ms;
    int64_t t = a->T;
    while (t > len && !m[t - 1]) --t;
    len = t > len ? t : len;
  }
  return len;
}

/* One query per (row, head) i = b * H + h (plain AR): its keys once (scores and their max), then its values once
 * with the exp. Inlined with D and the cache's dtype constants where the entry point knows them, so the compiler
 * unrolls the inner loops (a call would hide them from the OpenMP region the compiler outlines: 25% slower). */
static inline __attribute__((always_inline)) void attend1(const Args* a, int64_t i, Scratch* w, const int64_t D,
                                                          const int64_t bf16, const int blocked) {
  (void)blocked;  /* the compiler unrolls this loop itself where D is a constant */
  const int64_t H = a->H, b = i / H, h = i % H;
  const float scale = 1.0f / sqrtf((float)D);
  const char* kr = (const char*)a->k + (b * a->kb + h * a->kh) * (bf16 ? 2 : 4);
  const char* vr = (const char*)a->v + (b * a->vb + h * a->vh) * (bf16 ? 2 : 4);
  const uint8_t* restrict mr = a->mask + b * a->mb;
  const int64_t T = attended(a, b);
  float* restrict sc = w->sc;
  float qv[D];
  for (int64_t d = 0; d < D; ++d) qv[d] = load_el(a->q, b * a->qb + h * a->qh + d, a->q_bf16);
  float mx = -INFINITY;
  for (int64_t t0 = 0; t0 < T; t0 += TB) {
    const int64_t n = T - t0 < TB ? T - t0 : TB;
    prefetch(vr, t0, n, D, bf16);  /* the values' lines come in while the keys are read */
    const float* restrict kt = slots_f32(kr, t0, n, D, bf16, w->blk);
    for (int64_t t = 0; t < n; ++t) {
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qv[d] * kt[t * D + d];
      const float x = mr[t0 + t] ? dot * scale : -INFINITY;
      sc[t0 + t] = x;
      mx = x > mx ? x : mx;
    }
  }
  mx = mx == -INFINITY ? 0.f : mx;  /* every slot masked: every weight exp(-inf) = 0, the output zeros */
  const int64_t nx = i + 1 < a->B * H ? i + 1 : i;  /* the next (row, head): its keys come in meanwhile */
  const char* kn = (const char*)a->k + ((nx / H) * a->kb + (nx % H) * a->kh) * (bf16 ? 2 : 4);
  float z = 0.f, acc[D];  /* on the stack: the compiler keeps it in registers */
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  for (int64_t t0 = 0; t0 < T; t0 += TB) {
    const int64_t n = T - t0 < TB ? T - t0 : TB;
    prefetch(kn, t0, n, D, bf16);
    const float* restrict vt = slots_f32(vr, t0, n, D, bf16, w->blk);
    for (int64_t t = 0; t < n; ++t) {
      const float p = expf(sc[t0 + t] - mx);
      z += p;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += p * vt[t * D + d];
    }
  }
  const float iz = z > 0.f ? 1.f / z : 0.f;
  for (int64_t d = 0; d < D; ++d) store_el(a->out, b * a->ob + h * a->oh + d, a->out_bf16, acc[d] * iz);
}

/* The multi-query kernels, one per vector width: attend8 (2 to 8 queries), attend16 (9 to 16). */
#define QL 8
#include __FILE__
#undef QL
#define QL 16
#include __FILE__
#undef QL

/* One (row, head), the kernel chosen by the query count; D a constant where it is a common head size (blocked:
 * the multi-query kernels then unroll over registers, which needs D a multiple of DC: 32 and 64 are). Each
 * constant costs 1-2 s of CPU in the build; other head sizes (the reference models' is 32) take plain loops. */
static inline __attribute__((always_inline)) void attend(const Args* a, int64_t i, Scratch* w, const int64_t bf16) {
  const int64_t D = a->D, S = a->S;
#define BY_D(f) (D == 32 ? f(a, i, w, 32, bf16, 1) : D == 64 ? f(a, i, w, 64, bf16, 1) : f(a, i, w, D, bf16, 0))
  if (S == 1) BY_D(attend1);
  else if (S <= 8) BY_D(attend8);
  else BY_D(attend16);
#undef BY_D
}

static void release(Scratch* w) {
  free(w->sc); free(w->bias); free(w->qT); free(w->acc); free(w->blk);
}

static int reserve(Scratch* w, const Args* a) {
  const size_t vt = (size_t)a->T * MAXQ * sizeof(float), vd = (size_t)a->D * MAXQ * sizeof(float);
  const size_t round = (vt + LINE) / LINE * LINE, roundd = (vd + LINE) / LINE * LINE;  /* never 0 bytes */
  w->sc = aligned_alloc(LINE, round);
  w->bias = aligned_alloc(LINE, round);
  w->qT = aligned_alloc(LINE, roundd);
  w->acc = aligned_alloc(LINE, roundd);
  w->blk = aligned_alloc(LINE, ((size_t)TB * a->D * sizeof(float) + LINE - 1) / LINE * LINE);
  w->row = -1, w->len = 0;
  return w->sc && w->bias && w->qT && w->acc && w->blk;
}

/* The entry point (decode_attention.py calls it through ctypes): 0 done, 1 out of memory (nothing written is
 * trusted then; the caller raises). The (row, head)s are split evenly over the threads. */
int decode_attention(const Args* a, int nthreads) {
  int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
  {
    Scratch w;
    if (!reserve(&w, a)) failed = 1;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < a->B * a->H; ++i) {
      if (failed) continue;
      attend(a, i, &w, a->kv_bf16);  /* the dtype only changes how a block is read: not worth a copy each */
    }
    release(&w);
  }
  return failed;
}

#else /* ----------------------------------------------- the multi-query kernel, once per QL (the lanes) */
#define CAT2(x, y) x##y
#define CAT(x, y) CAT2(x, y)
#define VF CAT(vf, QL)
#define VI CAT(vi, QL)
#define NAME(x) CAT(x, QL)
/* registers per vector; head dimensions whose query vectors (or output sums) a pass keeps in registers, half the
 * register file; slots whose scores are summed at once, a quarter of it */
#define RPV (QL * 4 > VBYTES ? QL * 4 / VBYTES : 1)
#define DC ((VREGS / 2) / RPV)
#define U ((VREGS / 4) / RPV)

typedef float VF __attribute__((vector_size(QL * 4)));
typedef int32_t VI __attribute__((vector_size(QL * 4)));

static inline VF NAME(sel)(VI m, VF x, VF y) { return (VF)((m & (VI)x) | (~m & (VI)y)); }

/* exp(x) for x <= 0 lane by lane (Cephes' expf: 2^n times a degree-6 polynomial, within 2 ulp); 0 below -87. */
static inline VF NAME(exp_neg)(VF x) {
  const VF xc = NAME(sel)(x < -87.0f, (VF){0} + -87.0f, x);
  const VF f = xc * 1.44269504088896341f + 0.5f;
  VF n = __builtin_convertvector(__builtin_convertvector(f, VI), VF);  /* truncation: floor needs one less below */
  n = n - NAME(sel)(n > f, (VF){0} + 1.0f, (VF){0});
  const VF r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;
  VF p = (VF){0} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const VI two_n = (__builtin_convertvector(n, VI) + 127) << 23;
  return NAME(sel)(x < -87.0f, (VF){0}, p * (VF)two_n);
}

/* Row b's mask as one vector per slot, 0 where query s (lane s) attends and -inf where not; lanes past S attend
 * everywhere (their query is zero, their output never written). Built once per row a thread meets, for all its
 * heads; w->len the row's attended length. */
static inline void NAME(row_bias)(const Args* a, int64_t b, Scratch* w) {
  if (w->row == b) return;
  VF* restrict bias = (VF*)w->bias;
  const int64_t len = attended(a, b);
  for (int64_t t = 0; t < len; ++t) bias[t] = (VF){0};
  for (int64_t s = 0; s < a->S; ++s) {
    const uint8_t* m = a->mask + b * a->mb + s * a->ms;
    for (int64_t t = 0; t < len; ++t) bias[t][s] = m[t] ? 0.f : -INFINITY;
  }
  w->row = b, w->len = len;
}

/* The scores of U slots from t at once, their query vectors qr in registers: U independent sums, enough to keep
 * the FMA units busy (one sum is a chain of DC dependent FMAs, each waiting for the last). */
static inline __attribute__((always_inline)) void NAME(score_slots)(const VF* restrict qr, const float* restrict kt,
                                                                    VF* restrict sc, int64_t t, int64_t c,
                                                                    const int64_t D, const int64_t u) {
  VF x[U];
#pragma GCC unroll 8
  for (int64_t r = 0; r < u; ++r) x[r] = c ? sc[t + r] : (VF){0};
#pragma GCC unroll 16
  for (int64_t j = 0; j < DC; ++j)
#pragma GCC unroll 8
    for (int64_t r = 0; r < u; ++r) x[r] += qr[j] * kt[(t + r) * D + c + j];
#pragma GCC unroll 8
  for (int64_t r = 0; r < u; ++r) sc[t + r] = x[r];
}

/* Keys of slots [t0, t0 + n) against every query: sc[t] = sum_d qT[d] * k[t, d] + bias[t]; mx, the lanes' running
 * max. With D a constant (blocked), a chunk of DC head dimensions' query vectors stays in registers at a time,
 * unrolled; other head sizes take a plain loop (compiled once, not unrolled: the build stays short). */
static inline __attribute__((always_inline)) VF NAME(scores)(const VF* restrict qT, const float* restrict kt,
                                                             VF* restrict sc, const VF* restrict bias, int64_t n,
                                                             const int64_t D, const int blocked, VF mx) {
  if (blocked) {
    for (int64_t c = 0; c < D; c += DC) {
      VF qr[DC];
#pragma GCC unroll 16
      for (int64_t j = 0; j < DC; ++j) qr[j] = qT[c + j];
      int64_t t = 0;
      for (; t + U <= n; t += U) NAME(score_slots)(qr, kt, sc, t, c, D, U);
      for (; t < n; ++t) NAME(score_slots)(qr, kt, sc, t, c, D, 1);
    }
  } else {
    for (int64_t t = 0; t < n; ++t) {
      VF x = (VF){0};
      for (int64_t d = 0; d < D; ++d) x += qT[d] * kt[t * D + d];
      sc[t] = x;
    }
  }
  for (int64_t t = 0; t < n; ++t) {
    const VF x = sc[t] + bias[t];
    sc[t] = x;
    mx = NAME(sel)(x > mx, x, mx);
  }
  return mx;
}

/* Values of slots [t0, t0 + n) weighted for every query: acc[d] += p[t] * v[t, d]; blocked as `scores`, a chunk
 * of DC head dimensions' sums in registers at a time. */
static inline __attribute__((always_inline)) void NAME(values)(VF* restrict acc, const float* restrict vt,
                                                               const VF* restrict p, int64_t n, const int64_t D,
                                                               const int blocked) {
  if (!blocked) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d) acc[d] += p[t] * vt[t * D + d];
    return;
  }
  for (int64_t c = 0; c < D; c += DC) {
    VF o[DC];
#pragma GCC unroll 16
    for (int64_t j = 0; j < DC; ++j) o[j] = acc[c + j];
    for (int64_t t = 0; t < n; ++t) {
      const float* restrict vd = vt + t * D + c;
      const VF pt = p[t];
#pragma GCC unroll 16
      for (int64_t j = 0; j < DC; ++j) o[j] += pt * vd[j];
    }
#pragma GCC unroll 16
    for (int64_t j = 0; j < DC; ++j) acc[c + j] = o[j];
  }
}

/* 2 to QL queries of (row, head) i = b * H + h: the keys once, block by block (scores for every query), the
 * softmax's weights, then the values once. */
static inline __attribute__((always_inline)) void NAME(attend)(const Args* a, int64_t i, Scratch* w,
                                                               const int64_t D, const int64_t bf16,
                                                               const int blocked) {
  const int64_t H = a->H, S = a->S, b = i / H, h = i % H;
  const float scale = 1.0f / sqrtf((float)D);
  const char* kr = (const char*)a->k + (b * a->kb + h * a->kh) * (bf16 ? 2 : 4);
  const char* vr = (const char*)a->v + (b * a->vb + h * a->vh) * (bf16 ? 2 : 4);
  VF* restrict qT = (VF*)w->qT;  /* [D]: lane s = query s's element d, scaled */
  VF* restrict sc = (VF*)w->sc;  /* [T]: lane s = query s's score at slot t, then its weight */
  VF* restrict acc = (VF*)w->acc;  /* [D]: lane s = query s's weighted sum of values at d */
  NAME(row_bias)(a, b, w);
  const int64_t T = w->len;
  for (int64_t d = 0; d < D; ++d) {
    qT[d] = (VF){0};
    for (int64_t s = 0; s < S; ++s) qT[d][s] = load_el(a->q, b * a->qb + h * a->qh + s * a->qs + d, a->q_bf16) * scale;
  }
  VF mx = (VF){0} + -INFINITY;
  for (int64_t t0 = 0; t0 < T; t0 += TB) {
    const int64_t n = T - t0 < TB ? T - t0 : TB;
    prefetch(vr, t0, n, D, bf16);  /* the values' lines come in while the keys are read */
    mx = NAME(scores)(qT, slots_f32(kr, t0, n, D, bf16, w->blk), sc + t0, (const VF*)w->bias + t0, n, D, blocked, mx);
  }
  mx = NAME(sel)(mx == -INFINITY, (VF){0}, mx);  /* every slot masked: every weight 0, the output zeros */
  VF z = (VF){0};
  for (int64_t t = 0; t < T; ++t) {
    const VF p = NAME(exp_neg)(sc[t] - mx);
    sc[t] = p;
    z += p;
  }
  for (int64_t d = 0; d < D; ++d) acc[d] = (VF){0};
  const int64_t nx = i + 1 < a->B * H ? i + 1 : i;  /* the next (row, head): its keys come in meanwhile */
  const char* kn = (const char*)a->k + ((nx / H) * a->kb + (nx % H) * a->kh) * (bf16 ? 2 : 4);
  for (int64_t t0 = 0; t0 < T; t0 += TB) {
    const int64_t n = T - t0 < TB ? T - t0 : TB;
    prefetch(kn, t0, n, D, bf16);
    NAME(values)(acc, slots_f32(vr, t0, n, D, bf16, w->blk), sc + t0, n, D, blocked);
  }
  for (int64_t s = 0; s < S; ++s) {
    const float iz = z[s] > 0.f ? 1.f / z[s] : 0.f;
    const int64_t o = b * a->ob + s * a->os + h * a->oh;
    for (int64_t d = 0; d < D; ++d) store_el(a->out, o + d, a->out_bf16, acc[d][s] * iz);
  }
}

#undef U
#undef DC
#undef RPV
#undef NAME
#undef VI
#undef VF
#undef CAT
#undef CAT2
#endif
