//! The one seam where data-parallel replicas sum their gradients: an all-reduce.
//!
//! Every replica keeps its own weights and its own AdamW state (as PyTorch DDP does), and after
//! the all-reduce every replica holds the same summed gradient, bit for bit, so the replicas clip
//! and step in lockstep and no weights move between devices after a step. The alternative, the
//! main device stepping and broadcasting the weights, needs a broadcast collective burn 0.21 does
//! not expose (only `all_reduce`), and moves the weights through one device's link every step.
//!
//! Two implementations of [`AllReduce`]:
//! - [`HostExchange`], for backends without a collective (flex, wgpu): every rank's tensors are
//!   read into host memory (`into_data`), summed in f32 in rank order, and written back to each
//!   rank's device (`from_data`). Exact: the sum is the one `acc + g` on a device would give in the
//!   same order. cubecl 0.10 cannot copy between two wgpu devices (its device-to-device copy is
//!   `unimplemented`), so host memory is the only road there.
//! - [`Nccl`] (feature `cuda`): burn's `DistributedBackend::all_reduce`, which burn-cubecl's
//!   `distributed` feature implements on CUDA with NCCL (a ring or tree all-reduce: each GPU sends
//!   and receives about 2(N−1)/N of the gradient, whatever N).
//!
//! Replicas other than the main one start from a copy made through host memory
//! ([`copy_model`], [`copy_record`] for a resumed optimizer state), for the same wgpu reason.
//!
//! The gradients cross the seam flat (one rank-1 tensor per parameter, in the module's parameter
//! order), so an implementation needs no knowledge of the drafter; [`all_reduce_grads`] turns
//! burn's [`GradientsParams`] into that form and back.

use std::fmt::Debug;

use aerie_model::Drafter;
use aerie_model::checkpoint::{Dtype, HostTensor};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::record::{FullPrecisionSettings, Record};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

#[cfg(feature = "cuda")]
pub use nccl::Nccl;

/// How the ranks of one step sum their gradients.
pub trait AllReduce<B: Backend>: Send + Sync + Debug {
    /// A short name for logs and the run's notes (`host`, `nccl`).
    fn name(&self) -> &'static str;

    /// `per_rank[r]` holds rank r's tensors, on `devices[r]`; every rank lists tensors of the same
    /// shapes in the same order. Returns for every rank the element-wise sum over ranks, on its own
    /// device; every rank receives the same bits.
    fn sum(&self, devices: &[B::Device], per_rank: Vec<Vec<Tensor<B, 1>>>) -> Result<Vec<Vec<Tensor<B, 1>>>, String>;
}

/// The all-reduce through host memory (see the module doc): works on every backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostExchange;

impl<B: Backend> AllReduce<B> for HostExchange {
    fn name(&self) -> &'static str {
        "host"
    }

    fn sum(&self, devices: &[B::Device], per_rank: Vec<Vec<Tensor<B, 1>>>) -> Result<Vec<Vec<Tensor<B, 1>>>, String> {
        if per_rank.len() <= 1 {
            return Ok(per_rank);
        }
        if devices.len() != per_rank.len() {
            return Err(format!("{} ranks but {} devices", per_rank.len(), devices.len()));
        }
        let count = per_rank[0].len();
        if per_rank.iter().any(|r| r.len() != count) {
            return Err(format!(
                "ranks hold different numbers of tensors: {:?}",
                per_rank.iter().map(Vec::len).collect::<Vec<_>>()
            ));
        }
        let mut out: Vec<Vec<Tensor<B, 1>>> = per_rank.iter().map(|_| Vec::with_capacity(count)).collect();
        let mut ranks: Vec<_> = per_rank.into_iter().map(Vec::into_iter).collect();
        for i in 0..count {
            let mut total: Vec<f32> = Vec::new();
            for (r, tensors) in ranks.iter_mut().enumerate() {
                let t = tensors.next().expect("counted above");
                let v: Vec<f32> =
                    t.into_data().into_vec().map_err(|e| format!("tensor {i} of rank {r} is not float32: {e:?}"))?;
                if r == 0 {
                    total = v;
                } else if v.len() != total.len() {
                    return Err(format!("tensor {i}: rank 0 has {} elements, rank {r} {}", total.len(), v.len()));
                } else {
                    total.iter_mut().zip(&v).for_each(|(a, b)| *a += b);
                }
            }
            let n = total.len();
            let data = TensorData::new(total, [n]);
            for (o, device) in out.iter_mut().zip(devices) {
                o.push(Tensor::from_data(data.clone(), device));
            }
        }
        Ok(out)
    }
}

/// Sum the replicas' gradients through `via`. `grads[r]` is rank r's sum over its micro-batches
/// (`None`: it ran none this step, so it adds zeros; NCCL needs every rank in every call). A
/// parameter with a gradient on any rank gets the sum on every rank; one with none anywhere keeps
/// none, and the optimizer skips it, as on one device.
pub fn all_reduce_grads<B: AutodiffBackend>(
    via: &dyn AllReduce<B::InnerBackend>,
    model: &Drafter<B>,
    devices: &[B::Device],
    grads: Vec<Option<GradientsParams>>,
) -> Result<Vec<GradientsParams>, String> {
    let mut grads: Vec<GradientsParams> = grads.into_iter().map(Option::unwrap_or_default).collect();
    let mut gather = Gather::<B> {
        grads: &mut grads,
        devices,
        ids: Vec::new(),
        shapes: Vec::new(),
        flat: devices.iter().map(|_| Vec::new()).collect(),
    };
    model.visit(&mut gather);
    let (ids, shapes, flat) = (gather.ids, gather.shapes, gather.flat);
    let summed = via.sum(devices, flat)?;
    if summed.len() != devices.len() || summed.iter().any(|r| r.len() != ids.len()) {
        return Err(format!(
            "gave back {:?} tensors per rank for {} ranks of {} tensors",
            summed.iter().map(Vec::len).collect::<Vec<_>>(),
            devices.len(),
            ids.len()
        ));
    }
    let mut out: Vec<GradientsParams> = devices.iter().map(|_| GradientsParams::new()).collect();
    let mut scatter = Scatter {
        ids: &ids,
        shapes: &shapes,
        flat: summed.into_iter().map(Vec::into_iter).collect(),
        out: &mut out,
        next: 0,
    };
    model.visit(&mut scatter);
    Ok(out)
}

/// Takes each parameter's gradient out of every rank's [`GradientsParams`], flat, zeros where a
/// rank has none.
struct Gather<'a, B: AutodiffBackend> {
    grads: &'a mut [GradientsParams],
    devices: &'a [B::Device],
    ids: Vec<ParamId>,
    shapes: Vec<Vec<usize>>,
    flat: Vec<Vec<Tensor<B::InnerBackend, 1>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let parts: Vec<Option<Tensor<B::InnerBackend, D>>> =
            self.grads.iter_mut().map(|g| g.remove::<B::InnerBackend, D>(param.id)).collect();
        let Some(dims) = parts.iter().flatten().next().map(Tensor::dims) else { return };
        let n = dims.iter().product::<usize>();
        for ((part, device), flat) in parts.into_iter().zip(self.devices).zip(&mut self.flat) {
            let t = part.unwrap_or_else(|| Tensor::zeros(dims, device));
            flat.push(t.reshape([n]));
        }
        self.ids.push(param.id);
        self.shapes.push(dims.to_vec());
    }
}

/// Registers the summed tensors back, in their shapes, in the order [`Gather`] took them.
struct Scatter<'a, B: Backend> {
    ids: &'a [ParamId],
    shapes: &'a [Vec<usize>],
    flat: Vec<std::vec::IntoIter<Tensor<B, 1>>>,
    out: &'a mut [GradientsParams],
    next: usize,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B::InnerBackend> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.ids.get(self.next) != Some(&param.id) {
            return;
        }
        let dims: [usize; D] = self.shapes[self.next].clone().try_into().expect("gathered with this rank");
        self.next += 1;
        for (flat, out) in self.flat.iter_mut().zip(self.out.iter_mut()) {
            let t = flat.next().expect("the all-reduce returns every tensor it was given");
            out.register(param.id, t.reshape(dims));
        }
    }
}

/// `model` rebuilt on `device` through host memory, with the same (stable) parameter ids: the
/// replicas' starting copies. `Module::fork` is a device-to-device copy, which panics between two
/// wgpu devices (cubecl 0.10); the round trip is exact in f32 and works on every backend.
pub fn copy_model<B: AutodiffBackend>(model: &Drafter<B>, device: &B::Device) -> crate::Result<Drafter<B>> {
    let valid = model.valid();
    let mut tensors = valid.to_tensors(Dtype::F32);
    // `to_tensors` leaves out the embedding (serving engines take it from the target).
    let embed = valid.embed_tokens.clone();
    let dims = embed.dims();
    let values: Vec<f32> = embed.into_data().convert::<f32>().into_vec().expect("converted to f32");
    tensors.insert("embed_tokens.weight".into(), HostTensor::from_f32(dims.to_vec(), &values, Dtype::F32));
    crate::grads::with_stable_ids(Drafter::<B>::from_tensors(model.config(), &tensors, device)?)
}

/// An optimizer record (any burn record) recreated on `device` through host memory, exactly
/// (float32 kept): for the same reason as [`copy_model`].
pub fn copy_record<B: Backend, R: Record<B>>(record: R, device: &B::Device) -> R {
    R::from_item(record.into_item::<FullPrecisionSettings>(), device)
}

#[cfg(feature = "cuda")]
mod nccl {
    use burn::tensor::backend::distributed::{DistributedBackend, ReduceOperation};
    use burn::tensor::backend::{DeviceId, DeviceOps};
    use burn::tensor::{Tensor, TensorPrimitive};

    use super::{AllReduce, HostExchange};
    use crate::fan_out::per_replica;

    /// burn's all-reduce on CUDA (`DistributedBackend::all_reduce`, NCCL underneath), one thread
    /// per rank: an NCCL collective (and the communicator's set-up) waits until every rank has
    /// joined, so the ranks cannot be driven one after the other from one thread. Ranks that share
    /// a GPU (`cuda:0,cuda:0`) go through [`HostExchange`]: a communicator takes each GPU once.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Nccl;

    impl<B: DistributedBackend> AllReduce<B> for Nccl {
        fn name(&self) -> &'static str {
            "nccl"
        }

        fn sum(
            &self,
            devices: &[B::Device],
            per_rank: Vec<Vec<Tensor<B, 1>>>,
        ) -> Result<Vec<Vec<Tensor<B, 1>>>, String> {
            if per_rank.len() <= 1 {
                return Ok(per_rank);
            }
            let ids: Vec<DeviceId> = devices.iter().map(DeviceOps::id).collect();
            let mut distinct = ids.clone();
            distinct.sort();
            distinct.dedup();
            if distinct.len() != ids.len() {
                return HostExchange.sum(devices, per_rank);
            }
            // One thread per rank, each on the caller's burn stream (crate::fan_out says why).
            let ranks: Vec<_> = per_rank.into_iter().enumerate().collect();
            per_replica(true, ranks, |(r, tensors)| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    // Enqueue every tensor's all-reduce, then wait for them.
                    let pending: Vec<_> = tensors
                        .into_iter()
                        .map(|t| B::all_reduce(t.into_primitive().tensor(), ReduceOperation::Sum, ids.clone()))
                        .collect();
                    pending
                        .into_iter()
                        .map(|c| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(c.resolve())))
                        .collect::<Vec<_>>()
                }))
                .map_err(|_| format!("rank {r}: the NCCL all-reduce thread panicked"))
            })
            .into_iter()
            .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    fn t(v: &[f32]) -> Tensor<Flex, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    /// Three ranks: every rank gets ((a + b) + c) in f32, the order a device's `acc + g` takes.
    #[test]
    fn host_exchange_sums_in_rank_order_on_every_rank() {
        let (a, b, c) = ([1e8f32, 1.0, -0.0], [-1e8f32, 2.5, 0.0], [1.0f32, 3.0, -0.0]);
        let want: Vec<f32> = (0..3).map(|i| (a[i] + b[i]) + c[i]).collect();
        assert_eq!(want[0], 1.0, "the order matters here: (1e8 - 1e8) + 1");
        let devices = vec![Default::default(); 3];
        let out = HostExchange
            .sum(&devices, vec![vec![t(&a), t(&[1.0])], vec![t(&b), t(&[2.0])], vec![t(&c), t(&[4.0])]])
            .unwrap();
        for rank in out {
            let got: Vec<Vec<f32>> = rank.into_iter().map(|x| x.into_data().into_vec().unwrap()).collect();
            assert_eq!(
                got[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
            assert_eq!(got[1], vec![7.0]);
        }
        let e = HostExchange.sum(&devices[..2], vec![vec![t(&a)], vec![t(&[1.0])]]).unwrap_err();
        assert!(e.contains("rank 0 has 3 elements, rank 1 1"), "{e}");
    }
}
