// AVX-512 (F, BW, VL) fast paths of lynx_cpu.cpp, included by it inside its namespace when the
// compiler targets AVX-512 (-march=native on such a CPU). Every value goes through the same
// float32 operations as the scalar code, in the same order, so both paths write the same bytes.
// Only results that do not depend on order are reached differently: min / max reductions, the
// chunk's max |x - mu| (from its min and max: spread()), the code count (a segment search or a
// binary search, both exact counts of thresholds <= |x|); the chunk mean keeps the reference's
// adjacent-pairs tree. Inputs are assumed finite (as the scalar code's min / max are).
//
// Compress, per (page, K|V) item and head: pass 1 reads the page's rows for the per-channel
// min / max (prefetched into L2 while the previous head was coded); then per block of rows (one
// chunk of C tokens on the channel axis, ~8 KB on the token axis) the rows are normalised into
// an L1 tile, the chunk statistics follow (token-axis chunks four at a time, through a
// transposing shuffle tree), then the codes, four registers at a time so that four searches
// overlap (the end cells' residual costs one more permute and compare: Split512); the 4 + 4
// split's nibbles are packed in registers, other splits through pack().
// The two normalising multiplications (by 1 / scale, 1 / sigma) and the searches bound it.
// K and V each have their own split (Table), so each takes the paths of its own.
// Decompress (4 + 4 split): decompress_body of lynx_cpu_avx2.h with Rows512 below, 16 bytes of
// each stream per 32 values.

// ---- 16 values of the KV dtype <-> float32 -------------------------------------------------
template <typename Conv>
inline __m512 load16(const typename Conv::raw* p);
template <>
inline __m512 load16<F32>(const float* p) { return _mm512_loadu_ps(p); }
template <>
inline __m512 load16<F16>(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
template <>
inline __m512 load16<BF16>(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

// float32 -> bf16 bits in the high half of each lane: f32_to_bf16 (round to nearest even;
// NaN -> quiet NaN, as the scalar code).
inline __m512i bf16_round_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
}

// Values 0, 2, .., 30 (even) and 1, 3, .., 31 (odd) of a group of 32 -> out[0..32) in order.
template <typename Conv>
inline void store_even_odd(typename Conv::raw* out, __m512 even, __m512 odd);
// Decoded values saturate to the dtype's finite range (saturate() in lynx_cpu.cpp); max_ps /
// min_ps return their second operand when either is NaN, so a NaN stays NaN.
template <typename Conv>
inline __m512 saturate16(__m512 x) {
  return _mm512_min_ps(_mm512_set1_ps(Conv::max), _mm512_max_ps(_mm512_set1_ps(-Conv::max), x));
}

template <>
inline void store_even_odd<F32>(float* out, __m512 even, __m512 odd) {
  even = saturate16<F32>(even);
  odd = saturate16<F32>(odd);
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  _mm512_storeu_ps(out, _mm512_permutex2var_ps(even, lo, odd));
  _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(even, hi, odd));
}
template <>
inline void store_even_odd<F16>(uint16_t* out, __m512 even, __m512 odd) {
  even = saturate16<F16>(even);
  odd = saturate16<F16>(odd);
  const int rc = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i e = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(even, rc));
  const __m512i o = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(odd, rc));
  _mm512_storeu_si512(out, _mm512_or_si512(e, _mm512_slli_epi32(o, 16)));
}
template <>
inline void store_even_odd<BF16>(uint16_t* out, __m512 even, __m512 odd) {
  even = saturate16<BF16>(even);
  odd = saturate16<BF16>(odd);
  const __m512i e = _mm512_srli_epi32(bf16_round_hi(even), 16);
  // (odd & 0xffff0000) | e
  _mm512_storeu_si512(out, _mm512_ternarylogic_epi32(bf16_round_hi(odd), e,
                                                     _mm512_set1_epi32((int)0xffff0000u), 0xe4));
}

template <typename Conv>
inline void store16(typename Conv::raw* out, __m512 x);
template <>
inline void store16<F32>(float* out, __m512 x) { _mm512_storeu_ps(out, saturate16<F32>(x)); }
template <>
inline void store16<F16>(uint16_t* out, __m512 x) {
  x = saturate16<F16>(x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <>
inline void store16<BF16>(uint16_t* out, __m512 x) {
  x = saturate16<BF16>(x);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_hi(x), 16)));
}

inline __m512 round_f16_16(__m512 x) {  // f16_to_f32(f32_to_f16(x)) per lane
  return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline __m512 abs16(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

// ---- codes ---------------------------------------------------------------------------------
// The code count I = #{thresholds <= |x|} as a 7-step branchless binary search over the 128
// padded thresholds, each step's candidates held in registers (permutes, no gathers: on these
// Xeons a gather costs more than the whole search). Four searches run interleaved: one search
// is a chain of ~50 cycles, so four keep the permute / compare port busy.
struct Search512 {
  __m512 t64, t32, t16, t8, t4, t2a, t2b, t1a, t1b, t1c, t1d;
  explicit Search512(const float* thr) {
    alignas(64) float buf[11][16];
    for (auto& row : buf)
      for (auto& x : row) x = INFINITY;
    auto cand = [&](int step, float* out, int count, int first) {
      for (int k = 0; k < count; ++k) out[k] = thr[(k + first) * 2 * step + step - 1];
    };
    cand(64, buf[0], 1, 0);
    cand(32, buf[1], 2, 0);
    cand(16, buf[2], 4, 0);
    cand(8, buf[3], 8, 0);
    cand(4, buf[4], 16, 0);
    cand(2, buf[5], 16, 0);
    cand(2, buf[6], 16, 16);
    for (int q = 0; q < 4; ++q) cand(1, buf[7 + q], 16, 16 * q);
    __m512* dst[11] = {&t64, &t32, &t16, &t8, &t4, &t2a, &t2b, &t1a, &t1b, &t1c, &t1d};
    for (int i = 0; i < 11; ++i) *dst[i] = _mm512_load_ps(buf[i]);
    t64 = _mm512_set1_ps(thr[63]);  // the first step compares every lane with one threshold
  }
  static inline __m512i step(__m512i idx, __m512 cand, __m512 v, int inc) {
    const __mmask16 m = _mm512_cmp_ps_mask(cand, v, _CMP_LE_OQ);
    return _mm512_mask_add_epi32(idx, m, idx, _mm512_set1_epi32(inc));
  }
  template <int N>
  inline void count(const __m512* v, __m512i* idx) const {
    for (int i = 0; i < N; ++i) idx[i] = step(_mm512_setzero_si512(), t64, v[i], 64);
    for (int i = 0; i < N; ++i)
      idx[i] = step(idx[i], _mm512_permutexvar_ps(_mm512_srli_epi32(idx[i], 6), t32), v[i], 32);
    for (int i = 0; i < N; ++i)
      idx[i] = step(idx[i], _mm512_permutexvar_ps(_mm512_srli_epi32(idx[i], 5), t16), v[i], 16);
    for (int i = 0; i < N; ++i)
      idx[i] = step(idx[i], _mm512_permutexvar_ps(_mm512_srli_epi32(idx[i], 4), t8), v[i], 8);
    for (int i = 0; i < N; ++i)
      idx[i] = step(idx[i], _mm512_permutexvar_ps(_mm512_srli_epi32(idx[i], 3), t4), v[i], 4);
    for (int i = 0; i < N; ++i)
      idx[i] = step(idx[i], _mm512_permutex2var_ps(t2a, _mm512_srli_epi32(idx[i], 2), t2b), v[i], 2);
    for (int i = 0; i < N; ++i) {
      const __m512i k = _mm512_srli_epi32(idx[i], 1);
      const __mmask16 top = _mm512_test_epi32_mask(k, _mm512_set1_epi32(32));
      const __m512 c = _mm512_mask_blend_ps(top, _mm512_permutex2var_ps(t1a, k, t1b),
                                            _mm512_permutex2var_ps(t1c, k, t1d));
      idx[i] = step(idx[i], c, v[i], 1);
    }
  }
};

// The same count from 32 equal segments of [0, 1]: segment g = min(trunc(min(x, 1) * 32), 31)
// (x * 32 is exact, so segment g holds exactly the x in [g / 32, (g + 1) / 32), the last one
// also x >= 1), I = (thresholds below the segment) + #{thresholds inside it that are <= x}.
// Exact whenever no segment holds more than kMax thresholds (ok): 6 independent lookups and 5
// compares instead of the binary search's 7 dependent steps (~2/3 of its instructions). The
// default tables hold at most 5 per segment (alpha 0.25 / 0.5, y_max 112); large alphas crowd
// the low segments and keep the binary search.
struct SegSearch512 {
  static constexpr int kMax = 5;
  __m512 t[kMax][2];  // t[k]: threshold k of each segment (+inf past its count), 32 entries
  __m512i base[2];    // thresholds below each segment
  bool ok = true;
  static int segment(float x) { return std::min((int)(std::min(x, 1.0f) * 32.0f), 31); }
  SegSearch512(const float* thr, int64_t y_max) {
    alignas(64) float tk[kMax][32];
    alignas(64) int32_t b[32] = {0};
    int32_t cnt[32] = {0};
    for (int64_t j = 0; j < y_max; ++j) ++cnt[segment(thr[j])];  // thr sorted: segments too
    for (int g = 1; g < 32; ++g) b[g] = b[g - 1] + cnt[g - 1];
    for (int g = 0; g < 32; ++g) {
      ok = ok && cnt[g] <= kMax;
      for (int k = 0; k < kMax; ++k) tk[k][g] = k < cnt[g] ? thr[b[g] + k] : INFINITY;
    }
    for (int k = 0; k < kMax; ++k) {
      t[k][0] = _mm512_load_ps(tk[k]);
      t[k][1] = _mm512_load_ps(tk[k] + 16);
    }
    base[0] = _mm512_load_si512(b);
    base[1] = _mm512_load_si512(b + 16);
  }
  template <int N>
  inline void count(const __m512* v, __m512i* idx) const {
    __m512i g[N];
    for (int i = 0; i < N; ++i) {
      const __m512 x32 = _mm512_mul_ps(_mm512_min_ps(v[i], _mm512_set1_ps(1.0f)), _mm512_set1_ps(32.0f));
      g[i] = _mm512_min_epi32(_mm512_cvttps_epi32(x32), _mm512_set1_epi32(31));
      idx[i] = _mm512_permutex2var_epi32(base[0], g[i], base[1]);
    }
    for (int k = 0; k < kMax; ++k)
      for (int i = 0; i < N; ++i) {
        const __m512 c = _mm512_permutex2var_ps(t[k][0], g[i], t[k][1]);
        const __mmask16 m = _mm512_cmp_ps_mask(c, v[i], _CMP_LE_OQ);
        idx[i] = _mm512_mask_add_epi32(idx[i], m, idx[i], _mm512_set1_epi32(1));
      }
  }
};

// t[k] of a 128-float table (magnitudes, or the coder's split values) for 16 indices k (bits
// 0..6 used, higher bits ignored): 4 two-register permutes + 3 blends.
struct Levels512 {
  __m512 l[8];
  explicit Levels512(const float* lv) {
    for (int i = 0; i < 8; ++i) l[i] = _mm512_loadu_ps(lv + 16 * i);
  }
  inline __m512 get(__m512i code) const {
    const __mmask16 b5 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(32));
    const __mmask16 b6 = _mm512_test_epi32_mask(code, _mm512_set1_epi32(64));
    const __m512 q0 = _mm512_permutex2var_ps(l[0], code, l[1]);
    const __m512 q1 = _mm512_permutex2var_ps(l[2], code, l[3]);
    const __m512 q2 = _mm512_permutex2var_ps(l[4], code, l[5]);
    const __m512 q3 = _mm512_permutex2var_ps(l[6], code, l[7]);
    return _mm512_mask_blend_ps(b6, _mm512_mask_blend_ps(b5, q0, q1),
                                _mm512_mask_blend_ps(b5, q2, q3));
  }
};

// The end cells' split values (Table::split) by j = (I + bias) mod 2^(r+1): I's place in cell 0
// (j < 2^r) or in the top cell (j >= 2^r, as top is odd). The table repeats with period
// 2^(r+1), so a lookup takes I + bias as it is: one permute (its low 5 bits) for r <= 4, not a
// 128-entry lookup. Middle-cell codes land on the same j's: the coder masks them.
struct Split512 {
  Levels512 t;
  bool wide;  // r >= 5: a period over 32 entries, the full lookup
  static Levels512 build(const Table& tb) {
    alignas(64) float c[128];
    const int64_t n = int64_t(1) << tb.residual_bits;
    for (int64_t k = 0; k < 128; ++k) {
      const int64_t j = k & (2 * n - 1);
      const int64_t i = j < n ? j - tb.bias : tb.y_max + (j - n) - tb.bias;  // the code at j
      c[k] = i >= 0 && i <= tb.y_max ? tb.split[i] : INFINITY;  // +inf: no end-cell code
    }
    return Levels512(c);
  }
  explicit Split512(const Table& tb) : t(build(tb)), wide(tb.residual_bits >= 5) {}
};

// Anchor and residual codes of xf, as quantize_codes: N registers (16 values each) at a time.
// code<N>(xf, a, r): signed int8 codes to a[0..16N), r[0..16N). code4_packed44: the 4 + 4
// split's 64 codes packed straight into 32 anchor and 32 residual bytes.
template <typename Search>
struct Coder512T {
  Search search;
  Split512 split;
  __m512i bias, top1;  // top1 = top - 1
  __m128i shift;
  Coder512T(const Search& s, const Table& tb)
      : search(s), split(tb), bias(_mm512_set1_epi32((int)tb.bias)),
        top1(_mm512_set1_epi32((int)(tb.y_max >> tb.residual_bits) - 1)),
        shift(_mm_cvtsi32_si128((int)tb.residual_bits)) {}
  // m and res of N registers; m is already ~m (-m - 1) for negative xf. res: d = (m << r) - I
  // in a middle cell, d + (d + !h) = 2 d + 1 - h in an end cell (m - 1 >= top - 1 unsigned).
  template <int N>
  inline void codes(const __m512* xf, __m512i* m, __m512i* res) const {
    __m512 ax[N];
    for (int i = 0; i < N; ++i) ax[i] = abs16(xf[i]);
    __m512i code[N], ib[N];
    search.template count<N>(ax, code);
    __m512 sv[N];
    for (int i = 0; i < N; ++i) ib[i] = _mm512_add_epi32(code[i], bias);
    if (split.wide)  // per call, not per value
      for (int i = 0; i < N; ++i) sv[i] = split.t.get(ib[i]);
    else
      for (int i = 0; i < N; ++i) sv[i] = _mm512_permutex2var_ps(split.t.l[0], ib[i], split.t.l[1]);
    for (int i = 0; i < N; ++i) {
      const __m512i mm = _mm512_sra_epi32(ib[i], shift);
      const __m512i d = _mm512_sub_epi32(_mm512_sll_epi32(mm, shift), code[i]);
      const __m512i one = _mm512_set1_epi32(1);
      const __mmask16 below = _mm512_cmp_ps_mask(ax[i], sv[i], _CMP_NGE_UQ);  // !h
      const __mmask16 end = _mm512_cmpge_epu32_mask(_mm512_sub_epi32(mm, one), top1);
      res[i] = _mm512_mask_add_epi32(d, end, d, _mm512_mask_add_epi32(d, below, d, one));
      const __mmask16 neg = _mm512_cmp_ps_mask(xf[i], _mm512_setzero_ps(), _CMP_LT_OQ);
      m[i] = _mm512_mask_xor_epi32(mm, neg, mm, _mm512_set1_epi32(-1));
    }
  }
  template <int N>
  inline void code(const __m512* xf, int8_t* a, int8_t* r) const {
    __m512i m[N], res[N];
    codes<N>(xf, m, res);
    for (int i = 0; i < N; ++i) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 16 * i), _mm512_cvtepi32_epi8(m[i]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r + 16 * i), _mm512_cvtepi32_epi8(res[i]));
    }
  }
  inline void code4_packed44(const __m512* xf, uint8_t* a, uint8_t* r) const {
    __m512i m[4], res[4], b[4];
    codes<4>(xf, m, res);
    const __m512i lo4 = _mm512_set1_epi32(0x0f);
    for (int i = 0; i < 4; ++i) {  // byte = anchor nibble | residual nibble << 4
      const __m512i r4 = _mm512_srli_epi32(_mm512_slli_epi32(res[i], 28), 24);
      b[i] = _mm512_ternarylogic_epi32(lo4, m[i], r4, 0xca);
    }
    // 64 bytes in order: the packs interleave per 128-bit block, vpermd restores the order
    const __m512i w = _mm512_packus_epi16(_mm512_packus_epi32(b[0], b[1]),
                                          _mm512_packus_epi32(b[2], b[3]));
    const __m512i bytes = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w);
    // 16-bit pair q = b0 | b1 << 8 -> anchor byte (q & 0xf) | (q >> 4 & 0xf0), residual byte
    // (q >> 4 & 0xf) | (q >> 8 & 0xf0)
    const __m512i sel = _mm512_set1_epi16(0x000f);
    const __m512i q4 = _mm512_srli_epi16(bytes, 4);
    const __m512i an = _mm512_ternarylogic_epi32(sel, bytes, q4, 0xca);
    const __m512i rn = _mm512_ternarylogic_epi32(sel, q4, _mm512_srli_epi16(bytes, 8), 0xca);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(a), _mm512_cvtepi16_epi8(an));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(r), _mm512_cvtepi16_epi8(rn));
  }
  inline void operator()(__m512 x, int8_t* a, int8_t* r) const { code<1>(&x, a, r); }
};
using Coder512 = Coder512T<Search512>;

// ---- reductions ----------------------------------------------------------------------------
// Four vectors -> one whose 128-bit block q holds op-reduce(v[q]) in every lane.
template <typename Op>
inline __m512 reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, Op op) {
  const __m512 s01 = op(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xee));
  const __m512 s23 = op(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xee));
  const __m512 e = op(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
  const __m512 f = op(e, _mm512_permute_ps(e, 0x4e));
  return op(f, _mm512_permute_ps(f, 0xb1));
}

// The reference's adjacent-pairs tree sum of the 16 lanes, in every lane (a + b == b + a, so
// each lane of each level holds its pair's sum).
inline __m512 tree16(__m512 v) {
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0xb1));
  v = _mm512_add_ps(v, _mm512_permute_ps(v, 0x4e));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));
  return _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
}

// Tree sum of z[0..n) (n zmm of one chunk, zero-padded to nb = next_pow2(n) zmm), every lane.
inline __m512 tree_chunk(const float* z, int64_t n, int64_t nb) {
  __m512 part[16];  // nb <= 16: chunks of up to 256 values (fast path only)
  for (int64_t b = 0; b < nb; ++b)
    part[b] = b < n ? tree16(_mm512_loadu_ps(z + 16 * b)) : _mm512_setzero_ps();
  for (int64_t len = nb / 2; len >= 1; len /= 2)
    for (int64_t b = 0; b < len; ++b) part[b] = _mm512_add_ps(part[2 * b], part[2 * b + 1]);
  return part[0];
}

const auto vmin = [](__m512 a, __m512 b) { return _mm512_min_ps(a, b); };
const auto vmax = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };

// ---- compress ------------------------------------------------------------------------------
// Per K / V (each has its own chunk): the token axis needs chunks of whole registers that tile
// head_dim (16 .. 256 values); other chunk sizes take the plain C++.
inline bool compress_fast(const Params& p, const Table& tb, int64_t sd) {
  const int64_t D = p.head_dim, C = tb.chunk;
  if (sd != 1 || D % 16 || D > 256) return false;
  if (tb.token_axis) return D % C == 0 && C % 16 == 0 && C <= 256;
  return true;
}

// RN(1 / s) per lane, 0 where that is not finite (recip_or_zero).
inline __m512 recip_or_zero16(__m512 s) {
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), s);
  const __mmask16 fin = _mm512_cmp_ps_mask(_mm512_abs_ps(r), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(fin, r);
}

// The centring of one block: per parameter set k (a 16-channel strip, channel axis; a chunk,
// token axis) mu and recip_or_zero(sigma) (16 lanes each). Register z of the block's tile uses
// set (z / every) % wrap.
struct Centres {
  std::vector<float> mu, inv_sig;
  std::vector<float> grid_mu, grid_need;  // token axis, byte grid: per chunk, for the search
  int64_t every = 1, wrap = 1;
  void resize(int64_t n) {
    mu.resize(16 * n);
    inv_sig.resize(16 * n);
  }
  void set(int64_t k, __m512 m, __m512 s) {
    _mm512_storeu_ps(mu.data() + 16 * k, m);
    _mm512_storeu_ps(inv_sig.data() + 16 * k, recip_or_zero16(s));
  }
};

// The cache lines of rows [0, rows) (nbytes each, stride bytes apart) fetched towards L2 a few at
// a time, between other work (a burst of prefetches would stall on the line fill buffers).
struct Prefetcher {
  const char* base = nullptr;
  int64_t stride = 0, nbytes = 0, rows = 0, row = 0, off = 0;
  template <typename raw>
  void start(const raw* x, int64_t st, int64_t num_rows, int64_t D) {
    base = reinterpret_cast<const char*>(x);
    stride = st * (int64_t)sizeof(raw);
    nbytes = D * (int64_t)sizeof(raw);
    rows = x ? num_rows : 0;
    row = off = 0;
  }
  inline void step(int n) {
    for (; n > 0 && row < rows; --n) {
      _mm_prefetch(base + row * stride + off, _MM_HINT_T1);
      off += 64;
      if (off >= nbytes) {
        if (off - 64 < nbytes - 1) _mm_prefetch(base + row * stride + nbytes - 1, _MM_HINT_T1);
        off = 0;
        ++row;
      }
    }
  }
};

// Codes of the block's nz registers xf = (tile - mu) * recip_or_zero(sigma), four at a
// time; written packed (4 + 4 split: straight to the streams) or as bytes for pack(). Each four
// registers also advance the prefetch by pf_per_batch lines.
template <typename Coder>
__attribute__((noinline)) void code_block(const Coder& coder, const Centres& c, const float* tile, int64_t nz,
                       bool packed44, uint8_t* a44, uint8_t* r44, int8_t* ca, int8_t* cr,
                       Prefetcher& pf, int pf_per_batch) {
  int64_t k = 0, sub = 0;
  auto next = [&](int64_t z) {
    const int64_t set = k;
    if (++sub == c.every) {
      sub = 0;
      if (++k == c.wrap) k = 0;
    }
    const __m512 xc = _mm512_sub_ps(_mm512_loadu_ps(tile + 16 * z), _mm512_loadu_ps(&c.mu[16 * set]));
    return _mm512_mul_ps(xc, _mm512_loadu_ps(&c.inv_sig[16 * set]));
  };
  int64_t z = 0;
  for (; z + 4 <= nz; z += 4) {
    pf.step(pf_per_batch);
    __m512 xf[4];
    for (int i = 0; i < 4; ++i) xf[i] = next(z + i);
    if (packed44)
      coder.code4_packed44(xf, a44 + 8 * z, r44 + 8 * z);
    else
      coder.template code<4>(xf, ca + 16 * z, cr + 16 * z);
  }
  if (z < nz) {  // the rest, through bytes
    alignas(64) int8_t ta[64], tr[64];
    const int64_t n = nz - z;
    for (int64_t i = 0; i < n; ++i) coder(next(z + i), ta + 16 * i, tr + 16 * i);
    if (packed44) {
      pack(ta, 16 * n, 4, a44 + 8 * z, 0);
      pack(tr, 16 * n, 4, r44 + 8 * z, 0);
    } else {
      std::memcpy(ca + 16 * z, ta, 16 * n);
      std::memcpy(cr + 16 * z, tr, 16 * n);
    }
  }
}

// Normalise rows [r0, r0 + rows) of one head into tile (rows x D): (x - gmin) * inv_scale. If
// lo / hi: their per-strip min / max over the rows.
template <typename Conv>
inline void normalise_rows(const typename Conv::raw* xh, int64_t st, int64_t r0, int64_t rows,
                           int64_t D, const float* gmin, const float* inv_scale, float* tile,
                           __m512* lo, __m512* hi) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < D / 16; ++j) {
      const __m512 x = load16<Conv>(xh + (r0 + i) * st + 16 * j);
      const __m512 xn = _mm512_mul_ps(_mm512_sub_ps(x, _mm512_loadu_ps(gmin + 16 * j)),
                                      _mm512_loadu_ps(inv_scale + 16 * j));
      _mm512_storeu_ps(tile + i * D + 16 * j, xn);
      if (lo) {
        lo[j] = i ? _mm512_min_ps(lo[j], xn) : xn;
        hi[j] = i ? _mm512_max_ps(hi[j], xn) : xn;
      }
    }
}

// ---- the byte grid of chunk scalars (mu_on_grid, sigma_on_grid in lynx_cpu.cpp) ------------
inline __m512 mu_on_grid16(__m512 c) {  // two roundings (no FMA), then floor and clamp
  const __m512 t = _mm512_add_ps(_mm512_mul_ps(c, _mm512_set1_ps(256.0f)), _mm512_set1_ps(0.5f));
  const __m512 u = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 uc = _mm512_min_ps(_mm512_max_ps(u, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
  return _mm512_mul_ps(uc, _mm512_set1_ps(1.0f / 256.0f));
}

// r[k] of 16 * N floats held in N registers, for each lane's k (< 16 * N): permutes, no gathers.
template <int N>
inline __m512 lookup16(const __m512* r, __m512i k) {
  if constexpr (N == 1) {
    return _mm512_permutexvar_ps(k, r[0]);
  } else if constexpr (N == 2) {
    return _mm512_permutex2var_ps(r[0], k, r[1]);
  } else {
    const __mmask16 upper = _mm512_test_epi32_mask(k, _mm512_set1_epi32(8 * N));
    return _mm512_mask_blend_ps(upper, lookup16<N / 2>(r, k), lookup16<N / 2>(r + N / 2, k));
  }
}

// The byte grid's sigma of 16 chunks from their need = max |xn - mu| (sigma_on_grid): the same
// branch-free binary search (step s compares levels[idx + s - 1] < need), each step's
// candidates levels[2 s k + s - 1] held in registers, then the level itself. Built only for
// the byte grid (levels nullptr: left empty).
struct SigmaGrid512 {
  __m512 c128, c64, c32, c16, c8, c4[2], c2[4], c1[8];  // candidates of steps 128 .. 1
  __m512 all[16];                                        // the 256 levels
  explicit SigmaGrid512(const float* lv) {
    if (!lv) return;
    alignas(64) float buf[8][16];
    auto cand = [&](int s, __m512* out) {  // step s: 128 / s candidates, in ceil(.. / 16) zmm
      const int n = 128 / s;
      for (int k = 0; k < 16 * ((n + 15) / 16); ++k)
        buf[k / 16][k % 16] = lv[std::min(2 * s * k + s - 1, 255)];  // (past n: unused)
      for (int q = 0; q < (n + 15) / 16; ++q) out[q] = _mm512_load_ps(buf[q]);
    };
    cand(128, &c128);
    cand(64, &c64);
    cand(32, &c32);
    cand(16, &c16);
    cand(8, &c8);
    cand(4, c4);
    cand(2, c2);
    cand(1, c1);
    for (int q = 0; q < 16; ++q) all[q] = _mm512_loadu_ps(lv + 16 * q);
  }
  // one step of size S = 2^(SH - 1): idx (a multiple of 2 S) += S where levels[idx + S - 1] < need
  template <int SH, int N>
  static inline __m512i step(__m512i idx, const __m512* cand, __m512 need) {
    const __m512 c = lookup16<N>(cand, _mm512_srli_epi32(idx, SH));
    const __mmask16 m = _mm512_cmp_ps_mask(c, need, _CMP_LT_OQ);
    return _mm512_mask_add_epi32(idx, m, idx, _mm512_set1_epi32(1 << (SH - 1)));
  }
  // need[0..n) (n <= 16 registers) -> their sigmas, in place; step by step over the n
  // registers, so that their chains of dependent steps overlap.
  inline void sigma(__m512* need, int64_t n) const {
    __m512i idx[16];
    for (int64_t i = 0; i < n; ++i) idx[i] = step<8, 1>(_mm512_setzero_si512(), &c128, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<7, 1>(idx[i], &c64, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<6, 1>(idx[i], &c32, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<5, 1>(idx[i], &c16, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<4, 1>(idx[i], &c8, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<3, 2>(idx[i], c4, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<2, 4>(idx[i], c2, need[i]);
    for (int64_t i = 0; i < n; ++i) idx[i] = step<1, 8>(idx[i], c1, need[i]);
    for (int64_t i = 0; i < n; ++i)  // idx <= 255: the reference's clamp is a no-op
      need[i] = lookup16<16>(all, idx[i]);
  }
};

// max |x - mu| over values whose min and max are lo, hi: RN is monotone and symmetric, so the
// largest |RN(x - mu)| is RN(hi - mu) or RN(mu - lo) (and at least one of them is >= +0).
inline __m512 spread(__m512 lo, __m512 hi, __m512 mu) {
  return _mm512_max_ps(_mm512_sub_ps(hi, mu), _mm512_sub_ps(mu, lo));
}

// Chunks of C tokens of each channel (one chunk of rows): tile holds the normalised rows, lo /
// hi their per-strip min / max. (Not inlined: one copy for every KV dtype.)
__attribute__((noinline)) void channel_stats(const Params& p, int64_t C, const float* tile,
                                             int64_t rows, const __m512* lo, const __m512* hi,
                                             uint16_t* mu16, uint16_t* sg16, float* fold,
                                             const SigmaGrid512& grid, Centres& c) {
  const int64_t D = p.head_dim, ns = D / 16, cp = next_pow2(C);
  const int rc = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m512 mu[16], am[16];
  c.resize(ns);
  c.every = 1;
  c.wrap = ns;
  for (int64_t j = 0; j < ns; ++j) {
    if (p.midrange) {
      mu[j] = _mm512_mul_ps(_mm512_add_ps(hi[j], lo[j]), _mm512_set1_ps(0.5f));  // == / 2
    } else {  // rows 2i and 2i+1 first, then adjacent pairs (zero rows up to next_pow2(C))
      const float* col = tile + 16 * j;
      if (cp == 1) std::memcpy(fold, col, 16 * sizeof(float));
      for (int64_t i = 0; i < cp / 2; ++i) {
        __m512 f = _mm512_setzero_ps();
        if (2 * i + 1 < rows)
          f = _mm512_add_ps(_mm512_loadu_ps(col + 2 * i * D), _mm512_loadu_ps(col + (2 * i + 1) * D));
        else if (2 * i < rows)
          f = _mm512_loadu_ps(col + 2 * i * D);
        _mm512_storeu_ps(fold + 16 * i, f);
      }
      for (int64_t len = cp / 4; len >= 1; len /= 2)
        for (int64_t i = 0; i < len; ++i)
          _mm512_storeu_ps(fold + 16 * i, _mm512_add_ps(_mm512_loadu_ps(fold + 32 * i),
                                                        _mm512_loadu_ps(fold + 32 * i + 16)));
      mu[j] = _mm512_div_ps(_mm512_loadu_ps(fold), _mm512_set1_ps((float)rows));
    }
    if (p.byte_grid) mu[j] = mu_on_grid16(mu[j]);
    const __m256i mh = _mm512_cvtps_ph(mu[j], rc);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mu16 + 16 * j), mh);
    mu[j] = _mm512_cvtph_ps(mh);
    am[j] = spread(lo[j], hi[j], mu[j]);
  }
  if (p.byte_grid) grid.sigma(am, ns);
  for (int64_t j = 0; j < ns; ++j) {
    const __m256i sh = _mm512_cvtps_ph(am[j], rc);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sg16 + 16 * j), sh);
    c.set(j, mu[j], _mm512_cvtph_ps(sh));
  }
}

// Chunks of C head_dim values of each token (D % C == 0, C % 16 == 0) of the normalised rows in
// tile, reduced four at a time. ZC = C / 16 registers per chunk when it is known at compile time
// (0: from chunk). On the byte grid the sigmas follow, 16 chunks a search (a group's four
// chunks would fill a quarter of its lanes, and its chain of steps would hold up the group's).
template <int ZC>
__attribute__((noinline)) void token_stats(const Params& p, int64_t chunk, const float* tile,
                                           int64_t rows, uint16_t* mu16, uint16_t* sg16,
                                           const SigmaGrid512& grid, Centres& c) {
  const int64_t D = p.head_dim, C = ZC ? 16 * ZC : chunk, zc = C / 16, nb = next_pow2(zc);
  const int rc = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const int64_t nch = rows * (D / C);
  c.resize(nch + 4);
  c.every = zc;
  c.wrap = nch + 4;
  if (p.byte_grid) {
    c.grid_mu.resize(nch);
    c.grid_need.resize(nch);
  }
  for (int64_t k0 = 0; k0 < nch; k0 += 4) {  // groups are independent of each other
    const int64_t nq = std::min<int64_t>(4, nch - k0);
    const float* z[4];
    for (int q = 0; q < 4; ++q) z[q] = tile + (k0 + std::min<int64_t>(q, nq - 1)) * C;
    __m512 lo[4], hi[4];
    for (int q = 0; q < 4; ++q) {
      lo[q] = hi[q] = _mm512_loadu_ps(z[q]);
      for (int64_t b = 1; b < zc; ++b) {
        const __m512 v = _mm512_loadu_ps(z[q] + 16 * b);
        lo[q] = _mm512_min_ps(lo[q], v);
        hi[q] = _mm512_max_ps(hi[q], v);
      }
    }
    // block q of lo4 / hi4 / mu4 / sig4: chunk k0 + q
    const __m512 lo4 = reduce4(lo[0], lo[1], lo[2], lo[3], vmin);
    const __m512 hi4 = reduce4(hi[0], hi[1], hi[2], hi[3], vmax);
    __m512 mu4;
    if (p.midrange) {
      mu4 = _mm512_mul_ps(_mm512_add_ps(hi4, lo4), _mm512_set1_ps(0.5f));  // == / 2
    } else {
      mu4 = tree_chunk(z[0], zc, nb);
      mu4 = _mm512_mask_blend_ps(0x00f0, mu4, tree_chunk(z[1], zc, nb));
      mu4 = _mm512_mask_blend_ps(0x0f00, mu4, tree_chunk(z[2], zc, nb));
      mu4 = _mm512_mask_blend_ps(0xf000, mu4, tree_chunk(z[3], zc, nb));
      mu4 = _mm512_div_ps(mu4, _mm512_set1_ps((float)C));
    }
    if (p.byte_grid) mu4 = mu_on_grid16(mu4);
    const __mmask8 keep = (__mmask8)((1u << nq) - 1u);
    const __m256i mh = _mm512_cvtps_ph(mu4, rc);
    _mm_mask_storeu_epi16(mu16 + k0, keep, _mm256_cvtepi64_epi16(mh));  // words 0, 4, 8, 12
    mu4 = _mm512_cvtph_ps(mh);
    const __m512 need4 = spread(lo4, hi4, mu4);
    if (p.byte_grid) {  // lanes 0, 4, 8, 12: the group's chunks
      const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
      _mm_mask_storeu_ps(c.grid_mu.data() + k0, keep,
                         _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, mu4)));
      _mm_mask_storeu_ps(c.grid_need.data() + k0, keep,
                         _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, need4)));
      continue;
    }
    const __m256i sh = _mm512_cvtps_ph(need4, rc);
    _mm_mask_storeu_epi16(sg16 + k0, keep, _mm256_cvtepi64_epi16(sh));
    const __m512 sig4 = _mm512_cvtph_ps(sh);
    for (int q = 0; q < 4; ++q) {
      const __m512i bq = _mm512_set1_epi32(4 * q);
      c.set(k0 + q, _mm512_permutexvar_ps(bq, mu4), _mm512_permutexvar_ps(bq, sig4));
    }
  }
  if (!p.byte_grid) return;
  for (int64_t k0 = 0; k0 < nch; k0 += 256) {  // up to 16 searches of 16 chunks, overlapped
    const int64_t nr = std::min<int64_t>(16, (nch - k0 + 15) / 16);
    __m512 sig[16];
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t n = std::min<int64_t>(16, nch - k0 - 16 * r);
      sig[r] = _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), c.grid_need.data() + k0 + 16 * r);
    }
    grid.sigma(sig, nr);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t k = k0 + 16 * r, n = std::min<int64_t>(16, nch - k);
      _mm256_mask_storeu_epi16(sg16 + k, (__mmask16)((1u << n) - 1u),
                               _mm512_cvtps_ph(sig[r], rc));  // exact
      alignas(64) float inv[16];
      _mm512_store_ps(inv, recip_or_zero16(sig[r]));
      for (int64_t q = 0; q < n; ++q) {  // Centres::set's broadcasts
        _mm512_storeu_ps(c.mu.data() + 16 * (k + q), _mm512_set1_ps(c.grid_mu[k + q]));
        _mm512_storeu_ps(c.inv_sig.data() + 16 * (k + q), _mm512_set1_ps(inv[q]));
      }
    }
  }
}

// Per-channel min / max over tp rows of NS * 16 channels (registers; rows in memory order).
// -> whether a NaN was seen (min / max drop it, as std::min / std::max in the scalar code).
template <typename Conv, int NS>
inline bool page_minmax(const typename Conv::raw* x, int64_t st, int64_t tp, float* lo_out,
                        float* hi_out) {
  __m512 lo[NS], hi[NS];
  __mmask16 nan = 0;
  for (int j = 0; j < NS; ++j) {
    lo[j] = _mm512_set1_ps(INFINITY);
    hi[j] = _mm512_set1_ps(-INFINITY);
  }
  for (int64_t t = 0; t < tp; ++t)
    for (int j = 0; j < NS; ++j) {
      const __m512 v = load16<Conv>(x + t * st + 16 * j);
      lo[j] = _mm512_min_ps(v, lo[j]);  // (v < lo) ? v : lo: the first value kept on ties,
      hi[j] = _mm512_max_ps(v, hi[j]);  // as std::min / std::max in the scalar code
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
  for (int j = 0; j < NS; ++j) {
    _mm512_storeu_ps(lo_out + 16 * j, lo[j]);
    _mm512_storeu_ps(hi_out + 16 * j, hi[j]);
  }
  return nan != 0;
}

// The quantized body of one (page, K|V) item: gamma, stats, codes (compress_item's pass 1 and 2).
// While a head's rows are coded, the next head's rows (or the next page's first head's: next_row)
// are prefetched, so that pass 1 does not wait on memory.
// -> false where the input is not finite (finite_ranges).
template <typename Conv>
bool compress_body_avx512(const Params& p, int which, const typename Conv::raw* x,
                          const int64_t* strides, int64_t body0, int64_t tp,
                          typename Conv::raw* gamma, uint16_t* stats, uint8_t* codes,
                          uint8_t* res, Scratch& s, const int64_t* next_row) {
  const Table& tb = p.t[which];
  const int64_t H = p.num_heads, D = p.head_dim, C = tb.chunk, ns = D / 16;
  const bool token_axis = tb.token_axis != 0;
  const bool packed44 = tb.anchor_bits == 4 && tb.residual_bits == 4;  // this tensor's split
  const int64_t sh = strides[0], st = strides[1];
  const int64_t nct = (tp + C - 1) / C, ncd = D / C;
  const int64_t total_chunks = token_axis ? H * tp * ncd : H * nct * D;
  // Rows per block: one chunk of tokens (channel axis), or ~8 KB of floats (token axis).
  const int64_t block = token_axis ? std::max<int64_t>(4, (2048 / D) & ~int64_t(3)) : C;
  s.buf.resize(block * D + 16);
  s.fold.resize(std::max<int64_t>(next_pow2(C) / 2, 1) * 16);
  s.gmin.resize(D);
  s.gmax.resize(D);
  s.a.resize(block * D);
  s.r.resize(block * D);
  float* gmin = s.gmin.data();
  float* scale = s.gmax.data();  // gmax, then recip_or_zero(gmax - gmin)
  const SegSearch512 seg(tb.thresholds, tb.y_max);
  const Coder512T<SegSearch512> seg_coder(seg, tb);
  const Coder512 bin_coder(Search512(tb.thresholds), tb);
  const SigmaGrid512 grid(p.byte_grid ? p.sigma_levels : nullptr);
  Centres centres;
  Prefetcher pf;
  bool finite = true;
  // lines per batch of 64 codes (the next tile has as many rows as this one, or fewer), + 1
  const int64_t row_lines = (D * (int64_t)sizeof(typename Conv::raw) + 63) / 64;
  const int pf_per_batch = (int)((64 * row_lines + D - 1) / D) + 1;
  for (int64_t h = 0; h < H; ++h) {
    const typename Conv::raw* xh = x + h * sh + body0 * st;
    // Pass 1: page min / max per channel, rows in memory order.
    bool nan_seen = false;
    switch (ns) {
      case 2: nan_seen = page_minmax<Conv, 2>(xh, st, tp, gmin, scale); break;
      case 4: nan_seen = page_minmax<Conv, 4>(xh, st, tp, gmin, scale); break;
      case 8: nan_seen = page_minmax<Conv, 8>(xh, st, tp, gmin, scale); break;
      default:
        for (int64_t j = 0; j < ns; ++j)
          nan_seen |= page_minmax<Conv, 1>(xh + 16 * j, st, tp, gmin + 16 * j, scale + 16 * j);
    }
    finite &= finite_ranges(gmin, scale, D, nan_seen);
    for (int64_t d = 0; d < D; ++d) {
      gamma[h * D + d] = Conv::store(gmin[d]);  // exact: an input value
      gamma[H * D + h * D + d] = Conv::store(scale[d]);
      scale[d] = recip_or_zero(scale[d] - gmin[d]);
    }
    if (h + 1 < H)
      pf.start(xh + sh, st, tp, D);
    else if (next_row)
      pf.start(x + next_row[F_BODY0] * st, st, next_row[F_NUM_BODY], D);
    else
      pf.start<typename Conv::raw>(nullptr, st, 0, D);
    // Pass 2: per block of rows: normalise into the tile, statistics, codes.
    for (int64_t r0 = 0; r0 < tp; r0 += block) {
      const int64_t rows = std::min(block, tp - r0);
      __m512 lo[16], hi[16];  // channel axis: per-strip min / max of the block
      normalise_rows<Conv>(xh, st, r0, rows, D, gmin, scale, s.buf.data(),
                           token_axis ? nullptr : lo, hi);
      if (token_axis) {
        uint16_t* mu16 = stats + (h * tp + r0) * ncd;
        uint16_t* sg16 = mu16 + total_chunks;
        switch (C) {
          case 16: token_stats<1>(p, C, s.buf.data(), rows, mu16, sg16, grid, centres); break;
          case 32: token_stats<2>(p, C, s.buf.data(), rows, mu16, sg16, grid, centres); break;
          case 64: token_stats<4>(p, C, s.buf.data(), rows, mu16, sg16, grid, centres); break;
          default: token_stats<0>(p, C, s.buf.data(), rows, mu16, sg16, grid, centres);
        }
      } else {
        uint16_t* mu16 = stats + (h * nct + r0 / C) * D;
        channel_stats(p, C, s.buf.data(), rows, lo, hi, mu16, mu16 + total_chunks, s.fold.data(),
                      grid, centres);
      }
      const int64_t n = rows * D, e0 = (h * tp + r0) * D;  // e0 * 4 bits: byte e0 / 2
      if (seg.ok)
        code_block(seg_coder, centres, s.buf.data(), n / 16, packed44, codes + e0 / 2,
                   res + e0 / 2, s.a.data(), s.r.data(), pf, pf_per_batch);
      else
        code_block(bin_coder, centres, s.buf.data(), n / 16, packed44, codes + e0 / 2,
                   res + e0 / 2, s.a.data(), s.r.data(), pf, pf_per_batch);
      if (!packed44) {
        pack(s.a.data(), n, (int)tb.anchor_bits, codes, e0 * tb.anchor_bits);
        pack(s.r.data(), n, (int)tb.residual_bits, res, e0 * tb.residual_bits);
      }
    }
  }
  return finite;
}

// ---- decompress ----------------------------------------------------------------------------
// Rows512: the row decoder of decompress_body (lynx_cpu_avx2.h), 4 + 4 split: 16 bytes of each
// stream per 32 values, the even and the odd values of the group in two registers (|x| =
// magnitudes[(m << 4) | residual nibble], 4 permutes).
struct Rows512 {
  static constexpr int64_t kGroup = 32;
  Levels512 lv;
  __m512 t16;  // the anchor stage's 16 signed values
  explicit Rows512(const DecodeTables& dt) : lv(dt.full), t16(_mm512_load_ps(dt.anchor)) {}

  // Values 0, 2, .. and 1, 3, .. of the float32 row v[0..32) (-> 16 + 16 floats at e, o).
  static inline void deinterleave(const float* v, float* e, float* o) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    _mm512_storeu_ps(e, _mm512_permutex2var_ps(a, ie, b));
    _mm512_storeu_ps(o, _mm512_permutex2var_ps(a, io, b));
  }

  // One token's D values from its packed 4-bit anchor (and residual) bytes; per 32-value group
  // g the parameters are at [32 g, 32 g + 16) (even values) and [32 g + 16, 32 g + 32) (odd).
  template <typename Conv>
  inline void decode(const uint8_t* arow, const uint8_t* rrow, const float* sig, const float* mu,
                     const float* scale, const float* gmin, bool bcast,
                     typename Conv::raw* out, int64_t D) const {
    const __m512i sel = _mm512_set1_epi32(0x70), b3 = _mm512_set1_epi32(8),
                  b7 = _mm512_set1_epi32(0x80), sign = _mm512_set1_epi32((int)0x80000000u);
    for (int64_t g = 0; g < D / 32; ++g) {
      const __m512i A = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(arow + 16 * g)));
      __m512 xe, xo;
      if (rrow) {
        const __m512i R = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rrow + 16 * g)));
        // bits 4..6: anchor magnitude bits, 0..3: residual nibble (0xca: sel ? a : b)
        const __m512i ie = _mm512_ternarylogic_epi32(sel, _mm512_slli_epi32(A, 4), R, 0xca);
        const __m512i io = _mm512_ternarylogic_epi32(sel, A, _mm512_srli_epi32(R, 4), 0xca);
        const __mmask16 ne = _mm512_test_epi32_mask(A, b3), no = _mm512_test_epi32_mask(A, b7);
        const __m512i le = _mm512_castps_si512(lv.get(_mm512_mask_xor_epi32(ie, ne, ie, sel)));
        const __m512i lo = _mm512_castps_si512(lv.get(_mm512_mask_xor_epi32(io, no, io, sel)));
        xe = _mm512_castsi512_ps(_mm512_mask_xor_epi32(le, ne, le, sign));
        xo = _mm512_castsi512_ps(_mm512_mask_xor_epi32(lo, no, lo, sign));
      } else {
        xe = _mm512_permutexvar_ps(A, t16);
        xo = _mm512_permutexvar_ps(_mm512_srli_epi32(A, 4), t16);
      }
      __m512 se, so, me, mo;
      if (bcast) {
        se = so = _mm512_set1_ps(sig[g]);
        me = mo = _mm512_set1_ps(mu[g]);
      } else {
        se = _mm512_loadu_ps(sig + 32 * g), so = _mm512_loadu_ps(sig + 32 * g + 16);
        me = _mm512_loadu_ps(mu + 32 * g), mo = _mm512_loadu_ps(mu + 32 * g + 16);
      }
      const __m512 ye = _mm512_add_ps(_mm512_mul_ps(xe, se), me);  // no FMA: two roundings
      const __m512 yo = _mm512_add_ps(_mm512_mul_ps(xo, so), mo);
      const __m512 ve = _mm512_add_ps(_mm512_mul_ps(ye, _mm512_loadu_ps(scale + 32 * g)),
                                      _mm512_loadu_ps(gmin + 32 * g));
      const __m512 vo = _mm512_add_ps(_mm512_mul_ps(yo, _mm512_loadu_ps(scale + 32 * g + 16)),
                                      _mm512_loadu_ps(gmin + 32 * g + 16));
      store_even_odd<Conv>(out + 32 * g, ve, vo);
    }
  }
};
