mod target_reference;
use aerie_model::checkpoint::Dtype;
use aerie_model::target::{CaptureRequest, LogitsMode, TargetConfig, TargetModel};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use std::time::Instant;
use target_reference::{RefConfig, random_checkpoint};
type B = Flex;
#[test]
#[ignore]
fn scratch() {
    let dev = Default::default();
    let cfg = TargetConfig::smollm2_135m();
    let c = RefConfig { hidden: 576, inter: 1536, layers: 30, heads: 9, kv_heads: 3, head_dim: 64, vocab: 49152, tied: true, ..RefConfig::llama_gqa() };
    let w = random_checkpoint(&c, 23, Dtype::BF16);
    let model = TargetModel::<B>::from_tensors(&cfg, &w, &dev, burn::tensor::DType::F32).unwrap();
    let ids = |v: Vec<i64>| { let n = v.len(); Tensor::<B, 2, Int>::from_data(TensorData::new(v, [1, n]), &dev) };
    let mut cache = model.new_cache();
    model.forward(ids((0..128).collect()), &mut cache, &CaptureRequest::logits(LogitsMode::None)).unwrap();
    for mode in [LogitsMode::None, LogitsMode::Last, LogitsMode::None, LogitsMode::Last] {
        let t0 = Instant::now();
        for i in 0..16 { model.forward(ids(vec![i]), &mut cache, &CaptureRequest::logits(mode)).unwrap(); }
        println!("decode {mode:?}: {:.1} ms/token", t0.elapsed().as_secs_f64() / 16.0 * 1e3);
    }
    // Elementwise op overhead
    let x = Tensor::<B, 3>::ones([1, 1, 576], &dev);
    let t0 = Instant::now();
    let mut y = x.clone();
    for _ in 0..1000 { y = y + x.clone(); }
    let _ = y.into_data();
    println!("add [1,1,576]: {:.1} us/op", t0.elapsed().as_secs_f64() / 1000.0 * 1e6);
}
