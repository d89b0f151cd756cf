use burn::backend::Flex;
use burn::tensor::{Distribution, Tensor};
use std::time::Instant;
type B = Flex;
#[test]
#[ignore]
fn scratch() {
    let dev = Default::default();
    for &(m, n, k) in &[(1usize, 1536usize, 576usize), (1, 576, 1536), (1, 576, 576), (1, 49152, 576), (128, 1536, 576), (128, 49152, 576)] {
        let w = Tensor::<B, 2>::random([n, k], Distribution::Uniform(-1.0, 1.0), &dev);
        let x = Tensor::<B, 2>::random([m, k], Distribution::Uniform(-1.0, 1.0), &dev);
        let reps = if m == 1 { 200 } else { 10 };
        let _ = x.clone().matmul(w.clone().transpose()).into_data();
        let t0 = Instant::now();
        for _ in 0..reps { let y = x.clone().matmul(w.clone().transpose()); let _ = y.into_data(); }
        let dt = t0.elapsed().as_secs_f64() / reps as f64;
        let wc = w.clone().transpose().into_data();
        let wt = Tensor::<B, 2>::from_data(wc, &dev);
        let t0 = Instant::now();
        for _ in 0..reps { let y = x.clone().matmul(wt.clone()); let _ = y.into_data(); }
        let dt2 = t0.elapsed().as_secs_f64() / reps as f64;
        println!("m{m} n{n} k{k}: transposed view {:.3} ms ({:.1} GFLOPS, {:.1} GB/s)  contiguous [in,out] {:.3} ms", dt*1e3, 2.0*(m*n*k) as f64/dt/1e9, (n*k*4) as f64/dt/1e9, dt2*1e3);
    }
}
