//! Flags that PyTorch initialises from the environment: each test runs its body in a
//! fresh child process (this test binary, re-run on one test) with the variables set.

mod common;

use backends::cuda::{self, BlasBackend, LinalgBackend, RocmFaBackend, matmul};
use backends::{FlagSource, Fp32Precision, mkl, mkldnn};
use common::in_child;

#[test]
fn every_env_var_sets_its_flag() {
    let vars = [
        ("TORCH_BLAS_PREFER_CUBLASLT", "1"),
        ("TORCH_LINALG_PREFER_CUSOLVER", "1"),
        ("TORCH_ROCM_FA_PREFER_CK", "1"),
        ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1"),
        ("MKL_VERBOSE", "1"),
        ("DNNL_VERBOSE", "2"),
        ("OMP_NUM_THREADS", "3"),
    ];
    if !in_child("every_env_var_sets_its_flag", &vars) {
        return;
    }
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Cublaslt);
    assert_eq!(
        cuda::PREFERRED_BLAS.source(),
        FlagSource::Env("TORCH_BLAS_PREFER_CUBLASLT")
    );
    assert_eq!(
        cuda::preferred_linalg_library(None),
        LinalgBackend::Cusolver
    );
    assert_eq!(cuda::preferred_rocm_fa_library(None), RocmFaBackend::Ck);
    assert_eq!(matmul::fp32_precision(), Fp32Precision::Tf32);
    assert!(matmul::allow_tf32());
    assert_eq!(mkl::VERBOSE.get(), mkl::VERBOSE_ON);
    assert_eq!(mkldnn::VERBOSE.get(), mkldnn::VERBOSE_ON_CREATION);
    assert_eq!(mkldnn::VERBOSE.source(), FlagSource::Env("DNNL_VERBOSE"));
    assert_eq!(backends::verbose::level(), 2);
    assert_eq!(backends::get_num_threads(), 3);
}

#[test]
fn values_that_do_not_apply_keep_the_default() {
    let vars = [
        ("TORCH_BLAS_PREFER_CUBLASLT", "0"),
        ("MKL_VERBOSE", "7"),
        ("DNNL_VERBOSE", "verbose please"),
        ("OMP_NUM_THREADS", "0"),
    ];
    if !in_child("values_that_do_not_apply_keep_the_default", &vars) {
        return;
    }
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Default);
    assert_eq!(cuda::PREFERRED_BLAS.source(), FlagSource::Default);
    assert_eq!(
        mkl::VERBOSE.get(),
        mkl::VERBOSE_ON,
        "levels above the maximum are capped"
    );
    assert_eq!(mkldnn::VERBOSE.get(), mkldnn::VERBOSE_OFF);
    assert_eq!(backends::NUM_THREADS.source(), FlagSource::Default);
}

#[test]
fn the_environment_is_read_once_at_first_use() {
    if !in_child(
        "the_environment_is_read_once_at_first_use",
        &[("TORCH_BLAS_PREFER_CUBLASLT", "1")],
    ) {
        return;
    }
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Cublaslt);
    // SAFETY: the child runs this one test on one thread; nothing else reads the environment.
    unsafe { std::env::set_var("TORCH_BLAS_PREFER_CUBLASLT", "0") };
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Cublaslt);
    // A setter wins over the environment and says so.
    cuda::preferred_blas_library(Some(BlasBackend::Cublas));
    assert_eq!(cuda::PREFERRED_BLAS.source(), FlagSource::Set);
}

#[test]
fn aten_cpu_capability_caps_the_level() {
    if !in_child(
        "aten_cpu_capability_caps_the_level",
        &[("ATEN_CPU_CAPABILITY", "default")],
    ) {
        return;
    }
    use backends::cpu::{self, CpuCapability};
    let expected = match cpu::detected_cpu_capability() {
        CpuCapability::NoAvx => CpuCapability::NoAvx,
        _ => CpuCapability::Default,
    };
    assert_eq!(cpu::get_cpu_capability(), expected);
}
