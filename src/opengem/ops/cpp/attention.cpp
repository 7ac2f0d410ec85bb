// Multi-head attention over short, masked key sets on the CPU: the C++ twin of
// opengem.ops.pytorch.pt_attention.masked_attention (SDPA with a key-padding mask).
//
// Why: GEM's attentions are many small problems (head width 8-16, 2-64 keys, hundreds of rows), where
// SDPA's CPU flash kernel spends its time on per-block GEMM calls and its backward was the largest item
// of GEM-small's training step. Here one (row, head) is one task: its keys and values are copied once
// into lane-padded blocks, every query's scores, softmax and weighted sum stay in vector registers
// (GCC/Clang vector extensions, lowered to whatever the ISA has), and nothing is allocated per query.
// Inputs are read through their strides (the model's q/k/v are head-major views of token-major
// projections), and outputs are written token-major [B, L, H, D] and returned as head-major views, so
// the model's head merge is free.
//
// Semantics are the reference's: a key mask [B, Lk] (true = real); a row with no real key attends to
// its first slot; softmax(q k^T / sqrt(D)) v. Forward saves the log-sum-exp per query, and backward
// recomputes the probabilities from it (as flash attention does). At most 64 keys (8 blocks of 8).
// The op schemas, autograd and fake tensors are declared in cpp_attention.py; this file only
// implements them for CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace {

// A [B, H, L, D] float tensor of any strides.
struct View4 {
  const float* p;
  int64_t sb, sh, sl, sd;
  explicit View4(const at::Tensor& t)
      : p(t.data_ptr<float>()), sb(t.stride(0)), sh(t.stride(1)), sl(t.stride(2)), sd(t.stride(3)) {}
  inline const float* at(int64_t b, int64_t h, int64_t l) const { return p + b * sb + h * sh + l * sl; }
};

constexpr int64_t W = 8;  // lanes of one vector: 8 floats (one AVX register; measured faster than 16 here)
constexpr int64_t MAX_BLOCKS = 8;  // keys per (row, head): at most MAX_BLOCKS * W

typedef float vf __attribute__((vector_size(W * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(W * 4), aligned(4)));

// expf of W lanes (Cephes' range reduction and polynomial, as the SSE/AVX "mathfun" exps): within 2 ulp,
// no calls and no branches, so it stays on vector registers.
inline vf vexp(vf v) {
  const vf lo = vf{} - 87.33654f, hi = vf{} + 88.3762626647949f;
  v = v < lo ? lo : v;
  v = v > hi ? hi : v;
  vf t = v * 1.44269504088896341f + 0.5f;
  vi n = __builtin_convertvector(t, vi);
  vf fx = __builtin_convertvector(n, vf);
  fx = fx > t ? fx - 1.f : fx;  // floor
  v = v - fx * 0.693359375f + fx * 2.12194440e-4f;
  vf y = vf{} + 1.9875691500E-4f;
  y = y * v + 1.3981999507E-3f;
  y = y * v + 8.3334519073E-3f;
  y = y * v + 4.1665795894E-2f;
  y = y * v + 1.6666665459E-1f;
  y = y * v + 5.0000001201E-1f;
  y = y * v * v + v + 1.0f;
  vi e = (__builtin_convertvector(fx, vi) + 127) << 23;
  vf p2;
  __builtin_memcpy(&p2, &e, sizeof(p2));
  return y * p2;
}

inline vf vload(const float* p) { vf v; __builtin_memcpy(&v, p, sizeof(v)); return v; }
inline void vstore(float* p, vf v) { __builtin_memcpy(p, &v, sizeof(v)); }
inline float hsum(vf v) { float s = 0.f; for (int l = 0; l < W; ++l) s += v[l]; return s; }
inline float hmax(vf v) { float m = v[0]; for (int l = 1; l < W; ++l) m = m > v[l] ? m : v[l]; return m; }

// One (b, h): its keys and values transposed into NB blocks of W lanes (zero padded), row-major copies
// (width padded to lanes) for the D-wide accumulations, and the key mask as an additive bias and a 0/1 factor.
template <int DC>
struct Blocks { static constexpr int value = DC > 0 ? (DC + W - 1) / W : 256 / W; };

template <int NB>
struct Keys {
  int64_t Lk, D, Dp;
  std::vector<float> kt, vt, kr, vr;  // kt, vt: [D][NB*W]; kr, vr: [NB*W][Dp], the width padded to lanes
  vf bias[NB], valid[NB];
  Keys(int64_t Lk_, int64_t D_) : Lk(Lk_), D(D_), Dp((D_ + W - 1) / W * W), kt(D_ * NB * W), vt(D_ * NB * W),
      kr(NB * W * Dp, 0.f), vr(NB * W * Dp, 0.f) {}  // vectors value-initialise: zeros
  void load(const View4& K, const View4& V, const uint8_t* mask, int64_t msb, int64_t msl, int64_t b, int64_t h,
            float kscale, bool want_vt, bool want_kr) {
    float vf_[NB * W];
    bool any = false;
    for (int64_t j = 0; j < NB * W; ++j) {
      const bool ok = j < Lk && (mask ? mask[b * msb + j * msl] != 0 : true);
      vf_[j] = ok ? 1.f : 0.f;
      any |= ok;
    }
    if (!any && Lk > 0) vf_[0] = 1.f;  // a row with no real key attends to its first slot
    for (int nb = 0; nb < NB; ++nb) {
      valid[nb] = vload(vf_ + nb * W);
      bias[nb] = valid[nb] > 0.f ? vf{} : vf{} - 1e30f;
    }
    // padded keys (j >= Lk) stay zero from the constructor
    const int64_t ks = K.sd, vs = V.sd;
    for (int64_t j = 0; j < Lk; ++j) {
      const float* krow = K.at(b, h, j);
      const float* vrow = V.at(b, h, j);
      for (int64_t d = 0; d < D; ++d) {
        const float kv = krow[d * ks], vv = vrow[d * vs];
        kt[d * NB * W + j] = kv * kscale;
        if (want_vt) vt[d * NB * W + j] = vv;
        if (want_kr) kr[j * Dp + d] = kv;
        vr[j * Dp + d] = vv;
      }
    }
  }
};

// out[0..D) = scale * sum_j w[j] * rows[j][0..D) over Lk rows of Dp floats (db vector blocks): the
// attention output (values weighted by probabilities) and dq (keys weighted by score gradients), with one
// broadcast and D/W vector FMAs per row, no horizontal sums
template <int DC>
inline void weighted_rows(const float* w, const float* rows, int64_t Lk, int64_t Dp, int64_t db, float scale,
                          float* out, int64_t D) {
  vf acc[Blocks<DC>::value];
  for (int64_t c = 0; c < db; ++c) acc[c] = vf{};
  for (int64_t j = 0; j < Lk; ++j) {
    const float wj = w[j];
    const float* row = rows + j * Dp;
    for (int64_t c = 0; c < db; ++c) acc[c] += wj * vload(row + c * W);
  }
  float buf[Blocks<DC>::value * W];
  for (int64_t c = 0; c < db; ++c) vstore(buf + c * W, acc[c] * scale);
  for (int64_t d = 0; d < D; ++d) out[d] = buf[d];
}

template <int DC, int NB>
void forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const uint8_t* mask,
                  int64_t msb, int64_t msl, at::Tensor& out, at::Tensor& lse, int64_t Drt) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2);
  const int64_t D = DC > 0 ? DC : Drt;
  const int64_t db = DC > 0 ? Blocks<DC>::value : (D + W - 1) / W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  View4 Q(q), K(k), V(v);
  float* O = out.data_ptr<float>();  // [B, Lq, H, D] contiguous
  float* LSE = lse.data_ptr<float>();  // [B, H, Lq]
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Keys<NB> r(Lk, D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      r.load(K, V, mask, msb, msl, b, h, scale, false, false);
      for (int64_t i = 0; i < Lq; ++i) {
        const float* qr = Q.at(b, h, i);
        vf s[NB];
        for (int nb = 0; nb < NB; ++nb) s[nb] = r.bias[nb];
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qr[d * Q.sd];
          const float* kd = &r.kt[d * NB * W];
          for (int nb = 0; nb < NB; ++nb) s[nb] += qd * vload(kd + nb * W);
        }
        vf mx = s[0];
        for (int nb = 1; nb < NB; ++nb) mx = mx > s[nb] ? mx : s[nb];
        const float m = hmax(mx);
        vf sum = vf{};
        float p[NB * W];
        for (int nb = 0; nb < NB; ++nb) {
          s[nb] = vexp(s[nb] - m) * r.valid[nb];
          sum += s[nb];
          vstore(p + nb * W, s[nb]);
        }
        const float l = hsum(sum);
        weighted_rows<DC>(p, r.vr.data(), Lk, r.Dp, db, 1.f / l, O + ((b * Lq + i) * H + h) * D, D);
        LSE[(b * H + h) * Lq + i] = m + std::log(l);
      }
    }
  });
}

template <int DC, int NB>
void backward_impl(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& out, const at::Tensor& lse, const uint8_t* mask, int64_t msb, int64_t msl,
                   at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, int64_t Drt) {
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), Lk = k.size(2);
  const int64_t D = DC > 0 ? DC : Drt;
  const int64_t db = DC > 0 ? Blocks<DC>::value : (D + W - 1) / W;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  View4 Q(q), dO(dout), O(out), K(k), V(v);
  const float* LSE = lse.data_ptr<float>();
  float* DQ = dq.data_ptr<float>();  // [B, Lq, H, D]
  float* DK = dk.data_ptr<float>();  // [B, Lk, H, D]
  float* DV = dv.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    Keys<NB> r(Lk, D);
    std::vector<float> dkt(D * NB * W), dvt(D * NB * W);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      r.load(K, V, mask, msb, msl, b, h, 1.f, true, true);
      std::fill(dkt.begin(), dkt.end(), 0.f);
      std::fill(dvt.begin(), dvt.end(), 0.f);
      for (int64_t i = 0; i < Lq; ++i) {
        const float* qr = Q.at(b, h, i);
        const float* dor = dO.at(b, h, i);
        const float* orr = O.at(b, h, i);
        float qrow[DC > 0 ? DC : 256], dorow[DC > 0 ? DC : 256];
        float Di = 0.f;
        for (int64_t d = 0; d < D; ++d) {
          qrow[d] = qr[d * Q.sd];
          dorow[d] = dor[d * dO.sd];
          Di += dorow[d] * orr[d * O.sd];
        }
        const float li = LSE[(b * H + h) * Lq + i];
        vf p[NB], ds[NB];
        for (int nb = 0; nb < NB; ++nb) { p[nb] = r.bias[nb] - li; ds[nb] = vf{} - Di; }
        for (int64_t d = 0; d < D; ++d) {
          const float qd = qrow[d] * scale, gd = dorow[d];
          const float* kd = &r.kt[d * NB * W];
          const float* vd = &r.vt[d * NB * W];
          for (int nb = 0; nb < NB; ++nb) { p[nb] += qd * vload(kd + nb * W); ds[nb] += gd * vload(vd + nb * W); }
        }
        float dsa[NB * W];
        for (int nb = 0; nb < NB; ++nb) {
          p[nb] = vexp(p[nb]) * r.valid[nb];
          ds[nb] *= p[nb] * scale;
          vstore(dsa + nb * W, ds[nb]);
        }
        for (int64_t d = 0; d < D; ++d) {
          const float gd = dorow[d], qd = qrow[d];
          float* dvd = &dvt[d * NB * W];
          float* dkd = &dkt[d * NB * W];
          for (int nb = 0; nb < NB; ++nb) {
            vstore(dvd + nb * W, vload(dvd + nb * W) + p[nb] * gd);
            vstore(dkd + nb * W, vload(dkd + nb * W) + ds[nb] * qd);
          }
        }
        weighted_rows<DC>(dsa, r.kr.data(), Lk, r.Dp, db, 1.f, DQ + ((b * Lq + i) * H + h) * D, D);
      }
      for (int64_t j = 0; j < Lk; ++j) {
        float* dko = DK + ((b * Lk + j) * H + h) * D;
        float* dvo = DV + ((b * Lk + j) * H + h) * D;
        for (int64_t d = 0; d < D; ++d) { dko[d] = dkt[d * NB * W + j]; dvo[d] = dvt[d * NB * W + j]; }
      }
    }
  });
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const c10::optional<at::Tensor>& key_mask) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "attention: q [B, H, Lq, D], k and v [B, H, Lk, D]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              "attention: float32 tensors");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), "attention: q and k differ in B, H or D");
  TORCH_CHECK(k.size(2) >= 1 && k.size(2) <= MAX_BLOCKS * W, "attention: 1 to ", MAX_BLOCKS * W, " keys, got ", k.size(2));
  TORCH_CHECK(q.size(3) >= 1 && q.size(3) <= 256, "attention: head width 1 to 256, got ", q.size(3));
  if (key_mask.has_value())
    TORCH_CHECK(key_mask->scalar_type() == at::kBool && key_mask->dim() == 2 && key_mask->size(0) == q.size(0) &&
                key_mask->size(1) == k.size(2), "attention: key_mask must be bool [B, Lk]");
}

const uint8_t* mask_ptr(const c10::optional<at::Tensor>& m, int64_t& sb, int64_t& sl) {
  if (!m.has_value()) { sb = sl = 0; return nullptr; }
  sb = m->stride(0); sl = m->stride(1);
  return reinterpret_cast<const uint8_t*>(m->data_ptr<bool>());
}

std::tuple<at::Tensor, at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const c10::optional<at::Tensor>& key_mask) {
  check_inputs(q, k, v, key_mask);
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3);
  at::Tensor out = at::empty({B, Lq, H, D}, q.options());
  at::Tensor lse = at::empty({B, H, Lq}, q.options());
  int64_t sb, sl;
  const uint8_t* m = mask_ptr(key_mask, sb, sl);
  const int64_t nb = (k.size(2) + W - 1) / W;
#define FWD(DC, NB) forward_impl<DC, NB>(q, k, v, m, sb, sl, out, lse, D)
#define BY_NB(DC) if (nb <= 1) FWD(DC, 1); else if (nb == 2) FWD(DC, 2); else if (nb == 3) FWD(DC, 3); else if (nb == 4) FWD(DC, 4); else if (nb <= 6) FWD(DC, 6); else FWD(DC, 8)
  if (D == 8) { BY_NB(8); } else if (D == 16) { BY_NB(16); } else { BY_NB(0); }
#undef BY_NB
  return {out.permute({0, 2, 1, 3}), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const c10::optional<at::Tensor>& key_mask) {
  check_inputs(q, k, v, key_mask);
  TORCH_CHECK(dout.sizes() == q.sizes() && out.sizes() == q.sizes() && dout.scalar_type() == at::kFloat &&
              out.scalar_type() == at::kFloat, "attention_backward: dout and out must be float32 like q");
  TORCH_CHECK(lse.is_contiguous() && lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) &&
              lse.size(2) == q.size(2), "attention_backward: lse must be the forward's [B, H, Lq]");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3), Lk = k.size(2);
  at::Tensor dq = at::empty({B, Lq, H, D}, q.options());
  at::Tensor dk = at::empty({B, Lk, H, D}, q.options());
  at::Tensor dv = at::empty({B, Lk, H, D}, q.options());
  int64_t sb, sl;
  const uint8_t* m = mask_ptr(key_mask, sb, sl);
  const int64_t nb = (Lk + W - 1) / W;
#define BWD(DC, NB) backward_impl<DC, NB>(dout, q, k, v, out, lse, m, sb, sl, dq, dk, dv, D)
#define BY_NB(DC) if (nb <= 1) BWD(DC, 1); else if (nb == 2) BWD(DC, 2); else if (nb == 3) BWD(DC, 3); else if (nb == 4) BWD(DC, 4); else if (nb <= 6) BWD(DC, 6); else BWD(DC, 8)
  if (D == 8) { BY_NB(8); } else if (D == 16) { BY_NB(16); } else { BY_NB(0); }
#undef BY_NB
  return {dq.permute({0, 2, 1, 3}), dk.permute({0, 2, 1, 3}), dv.permute({0, 2, 1, 3})};
}

}  // namespace

TORCH_LIBRARY_IMPL(opengem, CPU, m) {
  m.impl("attention_forward", &attention_forward);
  m.impl("attention_backward", &attention_backward);
}
