//! `--device cpu|cuda:N`: the burn backend is a type parameter, so the choice made at run time
//! dispatches into generic code once, here.

use std::str::FromStr;

/// A compute device named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// burn-flex on the host CPU (the default).
    Cpu,
    /// burn-cuda on GPU `N` (needs the `cuda` feature).
    Cuda(usize),
}

impl std::fmt::Display for DeviceArg {
    /// The spelling `--device` accepts.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse) {
                Some(Ok(i)) => Ok(Self::Cuda(i)),
                _ => Err(format!("`{s}` is not a device: use `cpu` or `cuda:N`")),
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
        }
    }};
}
pub(crate) use with_backend;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<DeviceArg>(), Ok(DeviceArg::Cpu));
        assert_eq!("cuda:3".parse::<DeviceArg>(), Ok(DeviceArg::Cuda(3)));
        assert!("gpu".parse::<DeviceArg>().unwrap_err().contains("cpu` or `cuda:N"));
    }
}
