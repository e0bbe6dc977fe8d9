//! Dropout's generator: the default one advances with each call (so calls drop different
//! weights), `manual_seed` replays the same sequence, a caller's generator makes a call
//! reproducible, and `dropout_p = 1` gives zeros, as in PyTorch.
//!
//! The tests in this file draw from the CPU's process-wide default generator, so each takes
//! one lock; no other test binary shares the process.

mod common;

use std::sync::Mutex;

use backends::generator::{DEFAULT_SEED, default_generator};
use backends::{Device, Generator, SdpaOptions, Tensor, manual_seed, sdpa};
use common::random;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// q, k `[1, 2, 8, 16]` of fresh values and v of ones (each output is the row's kept
/// weights, rescaled).
fn inputs() -> [Tensor; 3] {
    let shape = [1, 2, 8, 16];
    let t = |v: Vec<f64>| Tensor::from_f64(&v, &shape, backends::DType::F32, Device::Cpu).unwrap();
    [t(random(256)), t(random(256)), t(vec![1.0; 256])]
}

fn dropped(t: &[Tensor; 3], p: f64, generator: Option<&Generator>) -> Vec<f32> {
    let options = SdpaOptions {
        dropout_p: p,
        generator,
        ..SdpaOptions::default()
    };
    let out = sdpa(&t[0], &t[1], &t[2], &options).unwrap();
    out.output.to_vec::<f32>().unwrap()
}

#[test]
fn the_default_generator_advances_and_manual_seed_replays() {
    let _s = serial();
    let t = inputs();
    let cpu = default_generator(Device::Cpu);
    manual_seed(3);
    assert_eq!((cpu.initial_seed(), cpu.get_offset()), (3, 0));
    let first = dropped(&t, 0.4, None);
    // B x H x Lq x Lk = 128 values drawn.
    assert_eq!(cpu.get_offset(), 128);
    let second = dropped(&t, 0.4, None);
    assert_ne!(first, second, "two calls must not drop the same weights");
    manual_seed(3);
    assert_eq!(dropped(&t, 0.4, None), first);
    assert_eq!(dropped(&t, 0.4, None), second);
    // Without dropout nothing is drawn.
    let offset = cpu.get_offset();
    dropped(&t, 0.0, None);
    assert_eq!(cpu.get_offset(), offset);
    // A generator made after manual_seed starts from its seed too.
    assert_eq!(default_generator(Device::Wgpu(7)).initial_seed(), 3);
    manual_seed(DEFAULT_SEED);
    assert_eq!(backends::initial_seed(), DEFAULT_SEED);
}

#[test]
fn a_generator_of_ones_own_makes_a_call_reproducible() {
    let _s = serial();
    let t = inputs();
    let fresh = |seed| dropped(&t, 0.5, Some(&Generator::new(seed)));
    assert_eq!(fresh(11), fresh(11));
    assert_ne!(fresh(11), fresh(12));
    // One generator used twice advances like the default one.
    let g = Generator::new(11);
    let (a, b) = (dropped(&t, 0.5, Some(&g)), dropped(&t, 0.5, Some(&g)));
    assert_eq!(a, fresh(11));
    assert_ne!(a, b);
    g.set_offset(128);
    assert_eq!(
        dropped(&t, 0.5, Some(&g)),
        b,
        "the same (seed, offset) draws the same"
    );
    // The default generator was not touched.
    let before = default_generator(Device::Cpu).get_offset();
    fresh(5);
    assert_eq!(default_generator(Device::Cpu).get_offset(), before);
}

#[test]
fn dropout_of_one_gives_zeros_as_pytorch() {
    let _s = serial();
    let t = inputs();
    let out = dropped(&t, 1.0, None);
    assert!(out.iter().all(|&x| x == 0.0), "{out:?}");
    for p in [1.0 + 1e-9, -0.1, f64::NAN] {
        let options = SdpaOptions {
            dropout_p: p,
            ..SdpaOptions::default()
        };
        assert!(matches!(
            sdpa(&t[0], &t[1], &t[2], &options),
            Err(backends::Error::InvalidArgument {
                what: "dropout_p",
                ..
            })
        ));
    }
}
