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
    /// burn-wgpu (CubeCL) on wgpu's default adapter, as logical device `N` (needs the `wgpu`
    /// feature, on by default); see [`wgpu_device`].
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

/// The burn device of `wgpu:N`: logical device `N` on wgpu's default adapter (the one wgpu rates
/// highest; `CUBECL_WGPU_DEFAULT_DEVICE`, e.g. `DiscreteGpu(1)`, picks another). `wgpu:0` is
/// burn's `WgpuDevice::DefaultDevice`; each further `N` opens a device and queue of its own on
/// the same adapter (`WgpuDevice::Existing`), with memory burn keeps apart: two replicas on
/// `wgpu:0,wgpu:1` exchange data as two GPUs do, without a second GPU. Fails, rather than
/// panics, when no adapter is found (e.g. no Vulkan driver: Debian's `mesa-vulkan-drivers`).
#[cfg(feature = "wgpu")]
pub fn wgpu_device(n: usize) -> anyhow::Result<burn::backend::wgpu::WgpuDevice> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::AutoGraphicsApi, init_device, init_setup};
    static OPENED: OnceLock<Mutex<HashMap<usize, WgpuDevice>>> = OnceLock::new();
    let mut opened = OPENED.get_or_init(Default::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(d) = opened.get(&n) {
        return Ok(d.clone());
    }
    // cubecl panics when no adapter is found; say what is missing instead. The setup (adapter,
    // device, queue) is made once: it registers `DefaultDevice` (wgpu:0), and a second setup of it
    // panics ("already registered"), so wgpu:N (N ≥ 1) gets another server on that same setup.
    static SETUP: OnceLock<burn::backend::wgpu::WgpuSetup> = OnceLock::new();
    let setup = match SETUP.get() {
        Some(s) => s.clone(),
        None => {
            let s = std::panic::catch_unwind(|| init_setup::<AutoGraphicsApi>(&WgpuDevice::DefaultDevice, RuntimeOptions::default()))
                .map_err(|_| anyhow::anyhow!("wgpu:{n}: no wgpu adapter found (a GPU driver, or a software one: on Debian `apt-get install mesa-vulkan-drivers libvulkan1`)"))?;
            SETUP.get_or_init(|| s).clone()
        }
    };
    let device = if n == 0 { WgpuDevice::DefaultDevice } else { init_device(setup, RuntimeOptions::default()) };
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
}
