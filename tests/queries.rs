//! Capability queries never panic; on a machine without the vendor software they answer
//! `false` / `None`, and every answer agrees with the others.

use backends::{cpu, cuda, cudnn, cusparselt, mkl, mkldnn, mps, nnpack, opt_einsum, xeon};

#[test]
fn cuda_queries_are_consistent() {
    use backends::kernels::{CudaCode, cuda_code};
    assert_eq!(cuda::is_built(), cuda_code() != CudaCode::None);
    if !cfg!(feature = "cuda") {
        assert!(!cuda::is_built());
    }
    let count = cuda::device_count();
    assert_eq!(cuda::is_available(), count > 0);
    assert_eq!(cuda::unavailable_reason().is_none(), count > 0);
    for i in 0..count {
        let (major, _) = cuda::get_device_capability(i).expect("a listed device has a capability");
        assert!(major >= 3);
        assert!(!cuda::get_device_name(i).unwrap().is_empty());
    }
    let flash_arch = (0..count).any(|i| cuda::get_device_capability(i).unwrap() >= (8, 0));
    assert_eq!(
        cuda::is_flash_attention_available(),
        cuda::is_built() && flash_arch
    );
    assert_eq!(cuda::get_device_capability(count), None);
    assert_eq!(cuda::get_device_name(count), None);
    assert!(cuda::get_device_properties(usize::MAX).is_none());
}

#[test]
fn without_a_driver_everything_is_false_or_none() {
    let Some(reason) = cuda::unavailable_reason() else {
        eprintln!("skipped: this machine has a CUDA device");
        return;
    };
    assert!(!reason.is_empty());
    assert!(!cuda::is_available());
    assert_eq!(cuda::device_count(), 0);
    assert_eq!(cuda::get_device_capability(0), None);
    assert!(!cudnn::is_available());
    assert!(!cusparselt::is_available());
    // CUDA tensors: a typed error that says why, not a panic.
    let err = backends::Tensor::from_vec(vec![1f32], &[1], backends::Device::Cuda(0)).unwrap_err();
    assert!(matches!(err, backends::Error::Unavailable { .. }), "{err}");
    assert!(cuda::synchronize(0).is_err());
    assert!(!cuda::is_flash_attention_available());
}

#[test]
fn a_build_without_a_device_feature_says_which_to_enable() {
    use backends::{Device, Tensor};
    let mut ran = false;
    if !cfg!(feature = "wgpu") {
        ran = true;
        assert!(backends::adapters::list().is_empty());
        let report = backends::info::report();
        let why = report["wgpu"]["why"].as_str().expect("the report says why");
        assert!(why.contains("`wgpu` feature"), "{why}");
        let err = Tensor::from_vec(vec![1f32], &[1], Device::Wgpu(0)).unwrap_err();
        assert!(matches!(err, backends::Error::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("wgpu:0"), "{err}");
        assert!(err.to_string().contains("`wgpu` feature"), "{err}");
        assert!(!matches!(Device::best(), Device::Wgpu(_)));
    }
    if !cfg!(feature = "cuda") {
        ran = true;
        assert!(!cuda::is_built() && !cuda::is_available());
        let err = Tensor::from_vec(vec![1f32], &[1], Device::Cuda(1)).unwrap_err();
        assert!(err.to_string().contains("cuda:1"), "{err}");
        assert!(err.to_string().contains("`cuda` feature"), "{err}");
    }
    if !ran {
        eprintln!("skipped: this build has the cuda and wgpu features (CI also tests without)");
    }
}

#[test]
fn vendor_library_queries_do_not_panic() {
    // Each answer is whatever this machine has; the calls must return and agree.
    assert_eq!(
        cudnn::is_available(),
        cudnn::version().is_some() && cuda::is_available()
    );
    assert_eq!(
        cusparselt::is_available(),
        cusparselt::version().is_some() && cuda::is_available()
    );
    if !mkldnn::is_available() {
        assert_eq!(mkldnn::version(), None);
    }
    if !mkl::is_available() {
        assert_eq!(mkl::version(), None);
    }
    let _ = nnpack::is_available();
    assert!(opt_einsum::is_available(), "the path optimizer is built in");
}

#[test]
fn mps_is_metal_only() {
    assert_eq!(
        mps::is_built(),
        cfg!(any(target_os = "macos", target_os = "ios"))
    );
    if !mps::is_built() {
        assert!(!mps::is_available());
    }
}

#[test]
fn cpu_capability_is_cached_and_capped() {
    let used = cpu::get_cpu_capability();
    assert_eq!(used, cpu::get_cpu_capability());
    if std::env::var_os(cpu::CAPABILITY_ENV).is_none() {
        assert_eq!(used, cpu::detected_cpu_capability());
    }
    if cfg!(target_arch = "x86_64") {
        assert_ne!(used, cpu::CpuCapability::Sve256);
    }
}

#[test]
fn adapters_and_topology_enumerate() {
    for adapter in backends::adapters::list() {
        assert!(!adapter.name.is_empty());
    }
    assert!(xeon::CpuTopology::discover().physical_cores() >= 1);
}
