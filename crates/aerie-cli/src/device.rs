//! `--device cpu|cuda:N|wgpu:N`: the burn backend is a type parameter, so the choice made at run
//! time dispatches into generic code once, here.
//!
//! `wgpu:N` is burn's CubeCL backend on wgpu (Vulkan, Metal or DX12): the same kernels, fusion,
//! autotune and device-resident tensors as burn-cuda, so CI exercises the GPU code path on Mesa's
//! software Vulkan driver (lavapipe) where no GPU is lent. It has no bf16 arithmetic.

use std::str::FromStr;

/// A compute device named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// burn-flex on the host CPU (the default).
    Cpu,
    /// burn-cuda on GPU `N` (needs the `cuda` feature).
    Cuda(usize),
    /// burn-wgpu (CubeCL) on wgpu adapter `N` (0: the default one; needs the `wgpu` feature, on
    /// by default); see [`wgpu_device`].
    Wgpu(usize),
}

impl DeviceArg {
    /// The backend's name, to say which devices a list mixes.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda(_) => "cuda",
            Self::Wgpu(_) => "wgpu",
        }
    }
}

impl std::fmt::Display for DeviceArg {
    /// The spelling `--device` accepts.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Wgpu(n) => write!(f, "wgpu:{n}"),
        }
    }
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            "wgpu" => Ok(Self::Wgpu(0)),
            _ => match (s.strip_prefix("cuda:").map(str::parse), s.strip_prefix("wgpu:").map(str::parse)) {
                (Some(Ok(i)), _) => Ok(Self::Cuda(i)),
                (_, Some(Ok(i))) => Ok(Self::Wgpu(i)),
                _ => Err(format!("`{s}` is not a device: use `cpu`, `cuda:N` or `wgpu:N`")),
            },
        }
    }
}

/// Run `$body` with `B` bound to the backend of `$device` and `$dev` to its burn device.
macro_rules! with_backend {
    ($device:expr, |$b:ident, $dev:ident| $body:expr) => {{
        match $device {
            $crate::device::DeviceArg::Cpu => {
                type $b = burn::backend::Flex;
                let $dev = burn::backend::flex::FlexDevice;
                $body
            }
            #[cfg(feature = "cuda")]
            $crate::device::DeviceArg::Cuda(i) => {
                type $b = burn::backend::Cuda;
                let $dev = burn::backend::cuda::CudaDevice::new(i);
                $body
            }
            #[cfg(not(feature = "cuda"))]
            $crate::device::DeviceArg::Cuda(_) => {
                anyhow::bail!("this aerie was built without CUDA: rebuild with `cargo build --release --features cuda`")
            }
            #[cfg(feature = "wgpu")]
            $crate::device::DeviceArg::Wgpu(i) => {
                type $b = burn::backend::Wgpu;
                let $dev = $crate::device::wgpu_device(i)?;
                $body
            }
            #[cfg(not(feature = "wgpu"))]
            $crate::device::DeviceArg::Wgpu(_) => {
                anyhow::bail!("this aerie was built without wgpu: rebuild with the default features")
            }
        }
    }};
}
pub(crate) use with_backend;

/// wgpu has no bf16 element type: burn-wgpu panics ("bf16 is not a valid WgpuElement") at the
/// first cast. Refuse `precision = "bf16"` on a wgpu device up front, naming the way out.
pub fn refuse_bf16_on_wgpu(precision: aerie_train::config::Precision, device: DeviceArg) -> anyhow::Result<()> {
    if matches!(device, DeviceArg::Wgpu(_)) && precision == aerie_train::config::Precision::Bf16 {
        anyhow::bail!(
            "{device}: wgpu has no bf16 arithmetic (burn-wgpu supports f32 and f16): use precision = \"f32\" on wgpu, \
             or bf16 on `cuda:N` or `cpu`"
        );
    }
    Ok(())
}

/// The adapter `wgpu:N` names, for `n` ≥ 1, among the adapters of this machine given as cubecl's
/// device type ids (0 discrete GPU, 1 integrated, 2 virtual, 3 CPU, 4 other): the `n`-th adapter
/// of the best kind present (discrete before integrated before virtual before CPU), as
/// `(type id, index among that kind)`, which is what `WgpuDevice::DiscreteGpu(n)` etc. open. A
/// machine with fewer adapters of that kind is an error naming what it has.
pub fn wgpu_adapter(n: usize, type_ids: &[u16]) -> Result<(u16, usize), String> {
    const KINDS: [(u16, &str); 4] = [(0, "discrete GPU"), (1, "integrated GPU"), (2, "virtual GPU"), (3, "CPU")];
    let name = |t: u16| KINDS.iter().find(|k| k.0 == t).map_or("other", |k| k.1);
    let found: Vec<&str> = type_ids.iter().map(|&t| name(t)).collect();
    let best = KINDS.iter().find(|k| type_ids.contains(&k.0));
    // wgpu opens only the first CPU adapter (`WgpuDevice::Cpu`).
    let count = best.map_or(0, |&(t, _)| if t == 3 { 1 } else { type_ids.iter().filter(|&&x| x == t).count() });
    match best {
        Some(&(t, _)) if n < count => Ok((t, n)),
        _ => Err(format!(
            "wgpu:{n}: this machine has {count} wgpu adapter(s) of its best kind{} (all adapters: {}), so only \
             wgpu:0{}; wgpu:N opens the N-th adapter, never a second device on one adapter",
            best.map_or(String::new(), |k| format!(" ({})", k.1)),
            if found.is_empty() { "none".to_owned() } else { found.join(", ") },
            if count > 1 { format!("..wgpu:{}", count - 1) } else { String::new() },
        )),
    }
}

/// The burn device of `wgpu:N`. `wgpu:0` is wgpu's default adapter (burn's
/// `WgpuDevice::DefaultDevice`: the one wgpu rates highest, typically the first discrete GPU;
/// `CUBECL_WGPU_DEFAULT_DEVICE`, e.g. `DiscreteGpu(1)`, picks another). `wgpu:N` for N ≥ 1 opens
/// the N-th adapter of the machine's best kind ([`wgpu_adapter`]: `DiscreteGpu(N)` on a machine
/// with discrete GPUs), and is refused where there is no such adapter (a machine with one GPU,
/// or lavapipe alone). Fails, rather than panics, when no adapter is found (e.g. no Vulkan
/// driver: Debian's `mesa-vulkan-drivers`).
#[cfg(feature = "wgpu")]
pub fn wgpu_device(n: usize) -> anyhow::Result<burn::backend::wgpu::WgpuDevice> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use burn::backend::wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, WgpuRuntime, init_setup};
    static OPENED: OnceLock<Mutex<HashMap<usize, WgpuDevice>>> = OnceLock::new();
    let mut opened = OPENED.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(d) = opened.get(&n) {
        return Ok(d.clone());
    }
    let no_adapter = || {
        anyhow::anyhow!(
            "wgpu:{n}: no wgpu adapter found (a GPU driver, or a software one: on Debian `apt-get install \
             mesa-vulkan-drivers libvulkan1`)"
        )
    };
    let device = if n == 0 {
        WgpuDevice::DefaultDevice
    } else {
        let backend = <AutoGraphicsApi as GraphicsApi>::backend();
        let ids = std::panic::catch_unwind(|| {
            <WgpuRuntime as cubecl_runtime::runtime::Runtime>::enumerate_all_devices(&backend)
        })
        .map_err(|_| no_adapter())?;
        let types: Vec<u16> = ids.iter().map(|d| d.type_id).collect();
        match wgpu_adapter(n, &types).map_err(anyhow::Error::msg)? {
            (0, i) => WgpuDevice::DiscreteGpu(i),
            (1, i) => WgpuDevice::IntegratedGpu(i),
            (2, i) => WgpuDevice::VirtualGpu(i),
            _ => WgpuDevice::Cpu,
        }
    };
    // cubecl panics when no adapter is found; say what is missing instead. Each device is set up
    // once (a second setup of one device panics: "already registered").
    std::panic::catch_unwind(|| init_setup::<AutoGraphicsApi>(&device, RuntimeOptions::default()))
        .map_err(|_| no_adapter())?;
    opened.insert(n, device.clone());
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<DeviceArg>(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert_eq!("wgpu:1".parse::<DeviceArg>(), Ok(DeviceArg::Wgpu(1)));
        assert_eq!("wgpu".parse::<DeviceArg>(), Ok(DeviceArg::Wgpu(0)));
        assert_eq!(DeviceArg::Wgpu(2).to_string(), "wgpu:2");
        let bf16 = aerie_train::config::Precision::Bf16;
        assert!(refuse_bf16_on_wgpu(bf16, DeviceArg::Wgpu(0)).unwrap_err().to_string().contains("no bf16"));
        assert!(refuse_bf16_on_wgpu(bf16, DeviceArg::Cpu).is_ok());
        assert!("gpu".parse::<DeviceArg>().unwrap_err().contains("`cuda:N` or `wgpu:N`"));
    }

    /// `wgpu:N` (N ≥ 1) is the N-th adapter of the machine's best kind, refused where there is
    /// none: lavapipe alone (one CPU adapter) has only wgpu:0, two discrete GPUs have wgpu:0..1.
    #[test]
    fn wgpu_n_is_the_n_th_adapter_or_refused() {
        let e = wgpu_adapter(1, &[3]).unwrap_err();
        assert!(e.contains("wgpu:1") && e.contains("1 wgpu adapter") && e.contains("(CPU)"), "{e}");
        assert!(e.contains("only wgpu:0;"), "{e}");
        assert_eq!(wgpu_adapter(1, &[0, 3, 0]), Ok((0, 1)));
        let e = wgpu_adapter(2, &[0, 3, 0]).unwrap_err();
        assert!(e.contains("2 wgpu adapter(s) of its best kind (discrete GPU)") && e.contains("wgpu:0..wgpu:1"), "{e}");
        assert!(e.contains("discrete GPU, CPU, discrete GPU"), "{e}");
        assert_eq!(wgpu_adapter(1, &[1, 1]), Ok((1, 1)));
        assert!(wgpu_adapter(1, &[]).unwrap_err().contains("none"));
        // Two CPU adapters: wgpu opens only the first.
        assert!(wgpu_adapter(1, &[3, 3]).is_err());
    }
}
