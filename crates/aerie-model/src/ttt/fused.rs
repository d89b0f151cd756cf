//! The per-step loss of the TTT objective fused into one pass per row on the host, for CPU
//! backends (burn-flex, burn-ndarray), where every burn tensor op is a separate, mostly
//! single-threaded sweep over `[B, L, Vd]` with its own allocation and its own backward.
//!
//! For each position the row of logits z is read once into cache and everything the step needs
//! comes out of that visit: log-sum-exp, the soft cross-entropy against the teacher p, α = Σ
//! min(pf, q), the argmax, and the two gradients
//!
//! ```text
//! ∂CE/∂z = q·Σp − p                      (CE = lse·Σp − Σ p·z)
//! ∂α/∂z  = [q < pf]·q − q·Σ_v [q_v < pf_v]·q_v
//! ```
//!
//! scaled by the position's weight pm. The values enter the graph as constants and the gradients
//! through the linear surrogate `s − detach(s)`, `s = Σ_v z·G` (exactly zero in value, gradient
//! `G` times whatever flows into the token's entry), so TV and LK objectives built on the
//! per-token tensors get exact gradients too. Rows are independent and each is computed in a
//! fixed order, so the result does not depend on the number of threads.

use burn::tensor::{Element, Tensor, TensorData, backend::Backend};
use rayon::prelude::*;

use crate::kernels::host::HostFloat;

/// The unshifted teacher on the host: row `b·L + t` describes token `t + 1`.
pub(super) struct HostTeacher<T> {
    p: Vec<T>,
    pf: Vec<T>,
    argmax_p: Vec<u32>,
    vd: usize,
}

impl<T: HostFloat> HostTeacher<T> {
    pub(super) fn new<B: Backend>(p: &Tensor<B, 3>, pf: &Tensor<B, 3>) -> Self {
        let vd = p.dims()[2];
        let host = |t: &Tensor<B, 3>| -> Vec<T> {
            t.clone().detach().into_data().convert::<T>().into_vec::<T>().expect("teacher data")
        };
        let p = host(p);
        let pf = host(pf);
        let argmax_p = p.par_chunks(vd).map(|row| argmax(row).0 as u32).collect();
        Self { p, pf, argmax_p, vd }
    }
}

/// First index of the maximum (NaN entries never win, as in a `>` scan from `row[0]`). Scanned
/// in [`LANES`] interleaved lanes so it vectorises; the lanes' winners are merged by value, then
/// by lowest index, which is the sequential scan's answer.
#[inline]
fn argmax<T: HostFloat>(row: &[T]) -> (usize, T) {
    #[allow(clippy::eq_op)]
    if row[0] != row[0] {
        return (0, row[0]);
    }
    let mut best = [row[0]; LANES];
    let mut arg = [0usize; LANES];
    let body = row.len() / LANES * LANES;
    for (c, chunk) in row[..body].chunks_exact(LANES).enumerate() {
        let chunk: &[T; LANES] = chunk.try_into().expect("LANES values");
        for j in 0..LANES {
            if chunk[j] > best[j] {
                best[j] = chunk[j];
                arg[j] = c * LANES + j;
            }
        }
    }
    for (i, &v) in row.iter().enumerate().skip(body) {
        let j = i - body;
        if v > best[j] {
            best[j] = v;
            arg[j] = i;
        }
    }
    let mut win = 0;
    for j in 1..LANES {
        if best[j] > best[win] || (best[j] == best[win] && arg[j] < arg[win]) {
            win = j;
        }
    }
    (arg[win], best[win])
}

/// One step's host results.
pub(super) struct StepStats<T> {
    /// pm·CE per position `[B·L]`.
    pub ce: Vec<T>,
    /// pm·α per position `[B·L]`.
    pub alpha: Vec<T>,
    /// pm·[argmax z = argmax p_k] per position `[B·L]`.
    pub hit: Vec<T>,
    /// Σ_t pm·[argmax z = argmax p_k] per sequence `[B]` (the row sums of `hit`).
    pub correct: Vec<f64>,
    /// pm·∂CE/∂z `[B·L·Vd]`, when asked for.
    pub g_ce: Option<Vec<T>>,
    /// pm·∂α/∂z `[B·L·Vd]`, when asked for.
    pub g_alpha: Option<Vec<T>>,
}

/// Step `k` over logits `z` `[B·L·Vd]`: position t of sequence b is scored against teacher row
/// `t + k` (already the shifted-once row t + k + 1 of the capture) with weight `pm[b·L + t + k]`.
/// `grads` says which of ∂CE/∂z and ∂α/∂z to write.
pub(super) fn step<T: HostFloat>(
    z: &[T],
    teacher: &HostTeacher<T>,
    pm: &[f32],
    shape: [usize; 2],
    k: usize,
    grads: [bool; 2],
) -> StepStats<T> {
    let [b, l] = shape;
    let vd = teacher.vd;
    let n = b * l;
    debug_assert_eq!(z.len(), n * vd);
    let buffer = |wanted: bool| if wanted { vec![T::ZERO; n * vd] } else { Vec::new() };
    let (mut g_ce, mut g_alpha) = (buffer(grads[0]), buffer(grads[1]));
    // Rows without a gradient buffer get a one-row scratch (q is staged in the α buffer).
    let rows: Vec<(f64, f64, f64)> = (0..n)
        .into_par_iter()
        .zip(chunks_or_none(&mut g_ce, vd, n).into_par_iter().zip(chunks_or_none(&mut g_alpha, vd, n)))
        .with_min_len(4)
        .map_init(
            || vec![T::ZERO; 2 * vd],
            |scratch, (r, (gc, ga))| {
                let (seq, t) = (r / l, r % l);
                let zr = &z[r * vd..(r + 1) * vd];
                let w = if t + k < l { pm[seq * l + t + k] as f64 } else { 0.0 };
                if w == 0.0 {
                    // A masked position contributes 0·CE; keep a non-finite row visible as the
                    // tensor formulation does (0·NaN = NaN), so a NaN still stops training.
                    return if zr.iter().all(|v| v.to_f64().is_finite()) {
                        (0.0, 0.0, 0.0)
                    } else {
                        (f64::NAN, f64::NAN, 0.0)
                    };
                }
                let tr = seq * l + t + k + 1;
                let (pr, pfr) = (&teacher.p[tr * vd..(tr + 1) * vd], &teacher.pf[tr * vd..(tr + 1) * vd]);
                let (s0, s1) = scratch.split_at_mut(vd);
                let (ce, alpha, arg) = row(zr, pr, pfr, w, gc.unwrap_or(s0), ga, s1);
                let hit = if arg == teacher.argmax_p[tr] as usize { w } else { 0.0 };
                (ce, alpha, hit)
            },
        )
        .collect();
    let mut correct = vec![0f64; b];
    for (r, &(_, _, hit)) in rows.iter().enumerate() {
        correct[r / l] += hit;
    }
    StepStats {
        ce: rows.iter().map(|r| T::from_f64(r.0)).collect(),
        alpha: rows.iter().map(|r| T::from_f64(r.1)).collect(),
        hit: rows.iter().map(|r| T::from_f64(r.2)).collect(),
        correct,
        g_ce: grads[0].then_some(g_ce),
        g_alpha: grads[1].then_some(g_alpha),
    }
}

/// `n` mutable rows of `vd` of `buf`, or `n` Nones when `buf` is empty.
fn chunks_or_none<T>(buf: &mut [T], vd: usize, n: usize) -> Vec<Option<&mut [T]>> {
    if buf.is_empty() { (0..n).map(|_| None).collect() } else { buf.chunks_mut(vd).map(Some).collect() }
}

/// Independent partial sums per row reduction (one AVX-512 register of f64).
const LANES: usize = 8;

/// One position: returns (w·CE, w·α, argmax z) and writes w·∂CE/∂z into `gc` and, when `ga`
/// is given, w·∂α/∂z into it (`scratch` stands in for it otherwise).
#[inline]
fn row<T: HostFloat>(
    z: &[T],
    p: &[T],
    pf: &[T],
    w: f64,
    gc: &mut [T],
    ga: Option<&mut [T]>,
    scratch: &mut [T],
) -> (f64, f64, usize) {
    let (arg, max) = argmax(z);
    let alpha_grad = ga.is_some();
    let qs = match ga {
        Some(ga) => ga,
        None => scratch,
    };
    // e = exp(z − max) (staged in qs); then Σe, Σp, Σp·z in f64, in LANES independent partial
    // sums so the compiler vectorises the conversions and adds (a fixed order: the result does
    // not depend on the thread count).
    for (q, &z) in qs.iter_mut().zip(z) {
        *q = (z - max).exp();
    }
    let (mut s, mut sp, mut spz) = ([0f64; LANES], [0f64; LANES], [0f64; LANES]);
    let (e_blocks, p_blocks, z_blocks) = (qs.chunks_exact(LANES), p.chunks_exact(LANES), z.chunks_exact(LANES));
    let tail = (e_blocks.remainder(), p_blocks.remainder(), z_blocks.remainder());
    for ((e, p), z) in e_blocks.zip(p_blocks).zip(z_blocks) {
        let (e, p, z): (&[T; LANES], &[T; LANES], &[T; LANES]) =
            (e.try_into().expect("lanes"), p.try_into().expect("lanes"), z.try_into().expect("lanes"));
        for j in 0..LANES {
            s[j] += e[j].to_f64();
            sp[j] += p[j].to_f64();
            spz[j] += p[j].to_f64() * z[j].to_f64();
        }
    }
    for (j, ((e, p), z)) in tail.0.iter().zip(tail.1).zip(tail.2).enumerate() {
        s[j] += e.to_f64();
        sp[j] += p.to_f64();
        spz[j] += p.to_f64() * z.to_f64();
    }
    let [s, sp, spz] = [s, sp, spz].map(|x| x.iter().sum::<f64>());
    let lse = max.to_f64() + s.ln();
    let ce = lse * sp - spz;
    // q = e / Σe; α and the mass of q where q < pf.
    let inv_s = T::from_f64(1.0 / s);
    let (wt, spt) = (T::from_f64(w), T::from_f64(sp));
    // Lane i mod LANES as above; this loop gains nothing from vectorising (measured), so it stays
    // a plain loop.
    let (mut alpha, mut below) = ([0f64; LANES], [0f64; LANES]);
    for i in 0..z.len() {
        let j = i % LANES;
        let q = qs[i] * inv_s;
        qs[i] = q;
        let below_pf = q < pf[i];
        alpha[j] += if below_pf { q } else { pf[i] }.to_f64();
        below[j] += if below_pf { q } else { T::ZERO }.to_f64();
        gc[i] = wt * (q * spt - p[i]);
    }
    let [alpha, below] = [alpha, below].map(|x| x.iter().sum::<f64>());
    if !alpha_grad {
        return (w * ce, w * alpha, arg);
    }
    let belowt = T::from_f64(below);
    for i in 0..z.len() {
        let q = qs[i];
        let own = if q < pf[i] { q } else { T::ZERO };
        qs[i] = wt * (own - q * belowt);
    }
    (w * ce, w * alpha, arg)
}

/// `s − detach(s)` with `s = Σ_v z·g` over the last dim: zero in value, gradient `g`.
pub(super) fn surrogate<B: Backend>(z: &Tensor<B, 3>, g: Vec<impl Element>, shape: [usize; 3]) -> Tensor<B, 2> {
    let [b, l, vd] = shape;
    let g = Tensor::<B, 3>::from_data(TensorData::new(g, [b * l, vd, 1]), (&z.device(), z.dtype()));
    let s = z.clone().reshape([b * l, 1, vd]).matmul(g).reshape([b, l]);
    s.clone() - s.detach()
}
