// Per-row attention statistics without materialising the pattern.
//
// For every (batch, head, query) row of softmax(q k^T + mask) this computes, in one pass over
// key tiles (flash-attention style: a running max and rescaled running sums):
//   ent[r]     = -sum_k A[r,k] ln A[r,k]          (as ln z - sum_k e_k d_k / z, d = s - max)
//   mass[r,f]  = sum_k A[r,k] flags[f,k]           (one column per flag channel)
//   lse[r]     = ln sum_k exp(s_k)                  (so any single A[r,k] = exp(s_k - lse))
//   out[r]     = sum_k A[r,k] v_k                   (optional: the attention output itself)
// Scores s = q . k are computed tile by tile with one GEMM call each into a buffer small enough to
// stay in cache; the pattern itself never exists in memory. Masked keys (causal, or a boolean mask) are
// left out; a row that sees no key gets 0 entropy, 0 mass and lse = -inf.
//
// q: [B, H, Nq, D] float32, contiguous, already multiplied by the softmax scale.
// k: [B, KVH, Nk, D] float32, contiguous; query head h uses key head h / (H / KVH).
// mask: bool [B, Nq, Nk] (any strides, e.g. broadcast), true = may attend; or an empty tensor.
// flags: float32 [B, F, Nk], contiguous (F may be 0).
// causal: key j is visible to query i only if j <= i + (Nk - Nq).
// v: [B, KVH, Nk, Dv] float32, contiguous, or an empty tensor (no output).
// reach: with a mask, the layer's sliding window |i - j| <= reach (-1: none); key tiles wholly
//        outside every row's window are skipped (the mask still decides each key).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <dlfcn.h>
#include <cmath>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HS_AVX2 1
#endif

namespace {

// The BLAS torch links (MKL on x86 wheels) exports the Fortran sgemm_; calling it directly skips
// the per-call tensor overhead of at::mm_out on thousands of small tiles. at::mm_out otherwise.
using sgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*,
                          const float*, const int*, const float*, const int*, const float*, float*,
                          const int*);
sgemm_fn find_sgemm() {
  static const sgemm_fn f = reinterpret_cast<sgemm_fn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  return f;
}

// S[R x kn] (row-major) = Q[R x D] K[kn x D]^T.
void scores(const float* Q, const float* K, float* S, int64_t R, int64_t kn, int64_t D,
            const at::TensorOptions& opt, bool direct_blas) {
  if (sgemm_fn gemm = direct_blas ? find_sgemm() : nullptr) {
    // Column-major view: S^T[kn x R] = K^T' [kn x D] * Q^T [D x R], i.e. gemm("T", "N").
    const int m = static_cast<int>(kn), n = static_cast<int>(R), k = static_cast<int>(D);
    const float one = 1.f, zero = 0.f;
    gemm("T", "N", &m, &n, &k, &one, K, &k, Q, &k, &zero, S, &m);
    return;
  }
  at::Tensor St = at::from_blob(S, {R, kn}, opt);
  at::mm_out(St, at::from_blob(const_cast<float*>(Q), {R, D}, opt),
             at::from_blob(const_cast<float*>(K), {kn, D}, opt).t());
}

constexpr float MASKED = -1e30f;  // a masked score: exp underflows to 0 and 0 * MASKED stays 0
constexpr int64_t QT = 64;        // query rows per tile
constexpr int64_t KT = 512;       // keys per tile (a 64 x 512 score tile is 128 KiB)

#ifdef HS_AVX2
// exp(x) for 8 floats (Cephes expf: ~1 ulp on the range used here, x <= 0).
inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f);
  const __m256 lo = _mm256_set1_ps(-87.0f);
  x = _mm256_min_ps(x, hi);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
  y = _mm256_fmadd_ps(y, z, x);
  y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
  __m256i e = _mm256_cvttps_epi32(fx);
  e = _mm256_add_epi32(e, _mm256_set1_epi32(0x7f));
  e = _mm256_slli_epi32(e, 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(under, y);  // exp(x) = 0 below -87 (masked keys, negligible weights)
}

inline double hsum(__m256 v) {
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  double s = 0;
  for (int i = 0; i < 8; ++i) s += t[i];
  return s;
}
#endif

// Max of n floats.
inline float row_max(const float* s, int64_t n) {
  float m = MASKED;
  int64_t j = 0;
#ifdef HS_AVX2
  __m256 vm = _mm256_set1_ps(MASKED);
  for (; j + 8 <= n; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
  alignas(32) float t[8];
  _mm256_store_ps(t, vm);
  for (int i = 0; i < 8; ++i) m = std::max(m, t[i]);
#endif
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

constexpr int MAXF = 4;

// Adds sum e, sum e*d and sum e*flag_f (e = exp(d), d = s - m) over n keys to the outputs.
// With ``keep``, each s[j] is replaced by its e (the weights the output needs).
inline void row_sums(float* s, int64_t n, float m, const float* const* flags, int nf,
                     double& z, double& zs, double* zf, bool keep) {
  int64_t j = 0;
#ifdef HS_AVX2
  const __m256 vm = _mm256_set1_ps(m);
  __m256 az = _mm256_setzero_ps(), as = _mm256_setzero_ps();
  __m256 af[MAXF];
  for (int f = 0; f < nf; ++f) af[f] = _mm256_setzero_ps();
  for (; j + 8 <= n; j += 8) {
    __m256 d = _mm256_sub_ps(_mm256_loadu_ps(s + j), vm);
    __m256 e = exp256(d);
    if (keep) _mm256_storeu_ps(s + j, e);
    az = _mm256_add_ps(az, e);
    as = _mm256_fmadd_ps(e, d, as);
    for (int f = 0; f < nf; ++f) af[f] = _mm256_fmadd_ps(e, _mm256_loadu_ps(flags[f] + j), af[f]);
  }
  z += hsum(az);
  zs += hsum(as);
  for (int f = 0; f < nf; ++f) zf[f] += hsum(af[f]);
#endif
  for (; j < n; ++j) {
    float d = s[j] - m;
    float e = d < -87.0f ? 0.0f : std::exp(d);
    if (keep) s[j] = e;
    z += e;
    zs += static_cast<double>(e) * d;
    for (int f = 0; f < nf; ++f) zf[f] += static_cast<double>(e) * flags[f][j];
  }
}

// O[R x Dv] += E[R x kn] V[kn x Dv] (all row-major).
void accumulate(const float* E, const float* V, float* O, int64_t R, int64_t kn, int64_t Dv,
                const at::TensorOptions& opt, bool direct_blas) {
  if (sgemm_fn gemm = direct_blas ? find_sgemm() : nullptr) {
    // Column-major view: O^T[Dv x R] += V^T[Dv x kn] * E^T[kn x R].
    const int m = static_cast<int>(Dv), n = static_cast<int>(R), k = static_cast<int>(kn);
    const float one = 1.f;
    gemm("N", "N", &m, &n, &k, &one, V, &m, E, &k, &one, O, &m);
    return;
  }
  at::Tensor Ot = at::from_blob(O, {R, Dv}, opt);
  Ot.addmm_(at::from_blob(const_cast<float*>(E), {R, kn}, opt),
            at::from_blob(const_cast<float*>(V), {kn, Dv}, opt));
}

}  // namespace

std::vector<at::Tensor> head_stats(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask,
                                   const at::Tensor& flags, bool causal, const at::Tensor& v,
                                   bool direct_blas, int64_t reach, int64_t band_sinks,
                                   int64_t band_window, const at::Tensor& restrict_heads, bool want_argmax) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "q and k must be [batch, head, pos, dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat, "q and k must be float32");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && flags.is_contiguous(), "inputs must be contiguous");
  const int64_t B = q.size(0), H = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t KVH = k.size(1), Nk = k.size(2);
  TORCH_CHECK(k.size(0) == B && k.size(3) == D && H % KVH == 0, "k does not match q");
  const int64_t G = H / KVH, offset = Nk - Nq;
  const int nf = flags.numel() ? static_cast<int>(flags.size(1)) : 0;
  TORCH_CHECK(nf <= MAXF, "at most 4 flag channels");
  TORCH_CHECK(nf == 0 || (flags.size(0) == B && flags.size(2) == Nk), "flags must be [batch, F, keys]");
  const bool has_v = v.numel() > 0;
  const int64_t Dv = has_v ? v.size(3) : 0;
  if (has_v) {
    TORCH_CHECK(v.scalar_type() == at::kFloat && v.is_contiguous() && v.dim() == 4 && v.size(0) == B &&
                v.size(1) == KVH && v.size(2) == Nk, "v must be float32 [batch, kv_head, keys, dim]");
  }
  const bool has_mask = mask.numel() > 0;
  if (has_mask) {
    TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 3 && mask.size(0) == B &&
                mask.size(1) == Nq && mask.size(2) == Nk, "mask must be bool [batch, q, k]");
  }
  // The band: keys k < band_sinks plus the window i - band_window < k <= i (a sink + window KV
  // cache). With band_window >= 0 the kernel returns each row's mass on it; heads flagged in
  // restrict_heads ([H] int32, or empty) see only the band, and their key tiles outside it are skipped.
  const bool want_band = band_window >= 0;
  const bool has_restrict = restrict_heads.numel() > 0;
  if (has_restrict) {
    TORCH_CHECK(want_band && restrict_heads.scalar_type() == at::kInt && restrict_heads.numel() == H &&
                restrict_heads.is_contiguous(), "restrict_heads must be int32 [head], with a band");
  }
  const int32_t* rp = has_restrict ? restrict_heads.data_ptr<int32_t>() : nullptr;
  auto f64 = q.options().dtype(at::kDouble);
  at::Tensor band = at::zeros({B, H, want_band ? Nq : 0}, f64);
  at::Tensor amax = at::full({B, H, want_argmax ? Nq : 0}, -1, q.options().dtype(at::kLong));
  double* bandp = band.data_ptr<double>();
  int64_t* amaxp = amax.data_ptr<int64_t>();
  at::Tensor ent = at::zeros({B, H, Nq}, f64);
  at::Tensor mass = at::zeros({B, H, Nq, std::max(nf, 1)}, f64);
  at::Tensor lse = at::full({B, H, Nq}, -std::numeric_limits<double>::infinity(), f64);
  at::Tensor out = at::zeros({B, H, has_v ? Nq : 0, std::max<int64_t>(Dv, 1)}, q.options());
  const float* vp = has_v ? v.data_ptr<float>() : nullptr;
  float* outp = out.data_ptr<float>();

  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* fp = nf ? flags.data_ptr<float>() : nullptr;
  const bool* mp = has_mask ? mask.data_ptr<bool>() : nullptr;
  const int64_t ms0 = has_mask ? mask.stride(0) : 0, ms1 = has_mask ? mask.stride(1) : 0,
                ms2 = has_mask ? mask.stride(2) : 0;
  double* entp = ent.data_ptr<double>();
  double* massp = mass.data_ptr<double>();
  double* lsep = lse.data_ptr<double>();
  const int64_t mcols = std::max(nf, 1);

  const int64_t ntiles = (Nq + QT - 1) / QT;
  const int64_t ntasks = B * H * ntiles;
  auto fopt = q.options();

  // Threads take tasks from a shared counter, largest first (the last query tiles of a causal
  // model see the most keys), so the work stays balanced.
  std::atomic<int64_t> next{0};
  const int64_t nthreads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), ntasks));
  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    at::Tensor sbuf = at::empty({QT * KT}, fopt);
    float* S = sbuf.data_ptr<float>();
    std::vector<double> z(QT), zs(QT), zf(QT * MAXF), zb(QT);
    std::vector<float> m(QT), best(QT), O(has_v ? QT * Dv : 0);
    std::vector<int64_t> arg(QT);
    for (int64_t t = next++; t < ntasks; t = next++) {
      const int64_t tile = ntiles - 1 - t / (B * H);
      const int64_t bh = t % (B * H), b = bh / H, h = bh % H;
      const int64_t q0 = tile * QT, R = std::min(QT, Nq - q0);
      int64_t kend = causal ? std::min(Nk, q0 + R + offset) : Nk;
      // A sliding-window layer (reach >= 0, with the mask that says so): key tiles wholly outside
      // every row's window |i - j| <= reach are skipped; the mask still decides each key.
      int64_t kbegin = 0;
      if (has_mask && reach >= 0) {
        kbegin = std::max<int64_t>(0, (q0 + offset - reach) / KT * KT);
        kend = std::min(kend, q0 + R - 1 + offset + reach + 1);
      }
      // A restricted head reads the sink tiles, then the tiles of the tile's windows.
      const bool restricted = has_restrict && rp[h] != 0;
      const int64_t sink_end = restricted ? std::min(band_sinks, kend) : 0;
      const int64_t win_begin = restricted ? std::max<int64_t>(0, (q0 + offset - band_window + 1) / KT * KT) : 0;
      std::fill(z.begin(), z.end(), 0.0);
      std::fill(zb.begin(), zb.end(), 0.0);
      std::fill(best.begin(), best.end(), MASKED);
      std::fill(arg.begin(), arg.end(), -1);
      std::fill(zs.begin(), zs.end(), 0.0);
      std::fill(zf.begin(), zf.end(), 0.0);
      std::fill(m.begin(), m.end(), MASKED);
      std::fill(O.begin(), O.end(), 0.f);
      const float* qrow = qp + ((b * H + h) * Nq + q0) * D;
      const float* kh = kp + ((b * KVH + h / G) * Nk) * D;
      for (int64_t kt = kbegin; kt < kend; kt += KT) {
        if (restricted && kt >= sink_end && kt + KT <= win_begin) continue;  // between sinks and windows
        const int64_t kn = std::min(KT, kend - kt);
        scores(qrow, kh + kt * D, S, R, kn, D, fopt, direct_blas);
        const float* frow[MAXF];
        for (int f = 0; f < nf; ++f) frow[f] = fp + (b * nf + f) * Nk + kt;
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = q0 + r;
          int64_t lim = kn;
          if (causal) lim = std::min(kn, i + offset + 1 - kt);
          float* s = S + r * kn;
          if (has_v) std::fill(s + std::max<int64_t>(lim, 0), s + kn, 0.f);  // future keys: weight 0
          if (lim <= 0) continue;
          if (has_mask) {
            const bool* mrow = mp + b * ms0 + i * ms1 + kt * ms2;
            for (int64_t j = 0; j < lim; ++j)
              if (!mrow[j * ms2]) s[j] = MASKED;
          }
          // band keys of this row in this tile: [kt, bs_end) and [bw_begin, kt + lim)
          const int64_t bs_end = want_band ? std::min(kt + lim, band_sinks) - kt : 0;
          const int64_t bw_begin = want_band ? std::max<int64_t>(std::max<int64_t>(kt, i + offset - band_window + 1),
                                                                  kt + std::max<int64_t>(bs_end, 0)) - kt : lim;
          if (restricted) {  // keys outside the band do not exist for this head
            for (int64_t j = std::max<int64_t>(bs_end, 0); j < std::min(bw_begin, lim); ++j) s[j] = MASKED;
          }
          const float mt = row_max(s, lim);
          if (want_argmax && mt > best[r]) {  // the first key holding the row's largest score
            for (int64_t j = 0; j < lim; ++j)
              if (s[j] == mt) { arg[r] = kt + j; break; }
            best[r] = mt;
          }
          if (mt <= MASKED) {  // nothing visible in this tile
            if (has_v) std::fill(s, s + lim, 0.f);
            continue;
          }
          if (mt > m[r]) {
            if (z[r] > 0) {
              const double c = std::exp(static_cast<double>(m[r]) - mt);
              zs[r] = (zs[r] + (static_cast<double>(m[r]) - mt) * z[r]) * c;
              z[r] *= c;
              for (int f = 0; f < nf; ++f) zf[r * MAXF + f] *= c;
              zb[r] *= c;
              const float cf = static_cast<float>(c);
              for (int64_t d = 0; d < Dv; ++d) O[r * Dv + d] *= cf;
            }
            m[r] = mt;
          }
          if (want_band) {
            double acc = 0.0;
            for (int64_t j = 0; j < std::max<int64_t>(bs_end, 0); ++j) {
              const float d = s[j] - m[r];
              acc += d < -87.0f ? 0.0 : std::exp(static_cast<double>(d));
            }
            for (int64_t j = std::max<int64_t>(bw_begin, 0); j < lim; ++j) {
              const float d = s[j] - m[r];
              acc += d < -87.0f ? 0.0 : std::exp(static_cast<double>(d));
            }
            zb[r] += acc;
          }
          row_sums(s, lim, m[r], frow, nf, z[r], zs[r], &zf[r * MAXF], has_v);
        }
        if (has_v) accumulate(S, vp + ((b * KVH + h / G) * Nk + kt) * Dv, O.data(), R, kn, Dv, fopt, direct_blas);
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t o = (b * H + h) * Nq + q0 + r;
        if (!(z[r] > 0)) continue;  // sees no key: attends nowhere
        const double lz = std::log(z[r]);
        entp[o] = lz - zs[r] / z[r];
        lsep[o] = m[r] + lz;
        for (int f = 0; f < nf; ++f) massp[o * mcols + f] = zf[r * MAXF + f] / z[r];
        if (want_band) bandp[o] = zb[r] / z[r];
        if (want_argmax) amaxp[o] = arg[r];
        if (has_v) {
          const float inv = static_cast<float>(1.0 / z[r]);
          for (int64_t d = 0; d < Dv; ++d) outp[o * Dv + d] = O[r * Dv + d] * inv;
        }
      }
    }
  });
  if (nf == 0) mass = mass.narrow(3, 0, 0);
  if (!has_v) out = out.narrow(3, 0, 0);
  return {ent, mass, lse, out, band, amax};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("head_stats", &head_stats, "per-row entropy, flag masses and logsumexp of softmax(q k^T)",
        py::arg("q"), py::arg("k"), py::arg("mask"), py::arg("flags"), py::arg("causal"), py::arg("v"), py::arg("direct_blas") = true, py::arg("reach") = -1,
        py::arg("band_sinks") = 0, py::arg("band_window") = -1, py::arg("restrict_heads") = at::empty({0}, at::kInt),
        py::arg("want_argmax") = false,
        py::call_guard<py::gil_scoped_release>());
}
