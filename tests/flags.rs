//! Every control's default, setter, guard (process-wide and thread-scoped) and spelling.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::str::FromStr;
use std::sync::{Barrier, Mutex, MutexGuard};

use backends::attention::{SdpBackend, sdpa_kernel, sdpa_kernel_scoped};
use backends::cuda::{self, BlasBackend, LinalgBackend, RocmFaBackend, matmul};
use backends::{
    DType, Device, Flag, FlagSource, Float32MatmulPrecision, Fp32Precision, cpu::CpuCapability,
    cudnn, mha, mkl, mkldnn, nnpack, opt_einsum,
};

/// Tests that touch process-wide values take this lock, so they never see each other's
/// settings; every one of them restores what it changed.
fn process_wide() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn bool_flags() -> Vec<(&'static Flag<bool>, bool)> {
    vec![
        (&matmul::ALLOW_FP16_REDUCED_PRECISION_REDUCTION, true),
        (&matmul::ALLOW_BF16_REDUCED_PRECISION_REDUCTION, true),
        (&matmul::ALLOW_FP16_ACCUMULATION, false),
        (&cuda::sdp::FLASH_SDP, true),
        (&cuda::sdp::MEM_EFFICIENT_SDP, true),
        (&cuda::sdp::MATH_SDP, true),
        (&cuda::sdp::CUDNN_SDP, true),
        (&cuda::sdp::MATH_SDP_REDUCTION, false),
        (&cudnn::ENABLED, true),
        (&cudnn::ALLOW_TF32, true),
        (&cudnn::DETERMINISTIC, false),
        (&cudnn::BENCHMARK, false),
        (&mha::FASTPATH, true),
        (&nnpack::ENABLED, true),
        (&mkldnn::ENABLED, true),
        (&opt_einsum::ENABLED, true),
        (&backends::DETERMINISTIC_ALGORITHMS, false),
        (&backends::DETERMINISTIC_WARN_ONLY, false),
    ]
}

#[test]
fn defaults_match_pytorch() {
    let _lock = process_wide();
    for (flag, default) in bool_flags() {
        assert_eq!(flag.get(), default, "{}", flag.name());
        assert_eq!(flag.default_value(), default, "{}", flag.name());
    }
    assert_eq!(cudnn::benchmark_limit(), 10);
    assert_eq!(backends::fp32_precision(), Fp32Precision::Ieee);
    assert_eq!(matmul::fp32_precision(), Fp32Precision::None);
    assert_eq!(matmul::fp32_precision_effective(), Fp32Precision::Ieee);
    assert!(!matmul::allow_tf32());
    assert_eq!(
        backends::get_float32_matmul_precision(),
        Float32MatmulPrecision::Highest
    );
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Default);
    assert_eq!(cuda::preferred_linalg_library(None), LinalgBackend::Default);
    assert_eq!(
        cuda::preferred_rocm_fa_library(None),
        RocmFaBackend::Default
    );
    assert_eq!(opt_einsum::strategy(), opt_einsum::Strategy::Auto);
    assert_eq!(mkl::VERBOSE.get(), mkl::VERBOSE_OFF);
    assert_eq!(mkldnn::VERBOSE.get(), mkldnn::VERBOSE_OFF);
    assert_eq!(
        cuda::sdp_priority_order().as_slice(),
        [
            SdpBackend::Flash,
            SdpBackend::MemEfficient,
            SdpBackend::Math,
            SdpBackend::Cudnn
        ]
    );
}

#[test]
fn every_bool_flag_sets_and_guards_restore() {
    let _lock = process_wide();
    for (flag, default) in bool_flags() {
        assert_eq!(flag.source(), FlagSource::Default, "{}", flag.name());
        {
            let _g = flag.guard(!default);
            assert_eq!(flag.get(), !default, "{}", flag.name());
            assert_eq!(flag.source(), FlagSource::Set);
        }
        assert_eq!(flag.get(), default, "{} restored", flag.name());
        assert_eq!(
            flag.source(),
            FlagSource::Default,
            "{} source restored",
            flag.name()
        );
        flag.set(!default);
        assert_eq!(flag.get(), !default, "{}", flag.name());
        flag.set(default);
    }
}

#[test]
fn named_setters_reach_their_flags() {
    let _lock = process_wide();
    type SetterGetter = (fn(bool), fn() -> bool);
    let pairs: [SetterGetter; 11] = [
        (
            matmul::set_allow_fp16_reduced_precision_reduction,
            matmul::allow_fp16_reduced_precision_reduction,
        ),
        (
            matmul::set_allow_bf16_reduced_precision_reduction,
            matmul::allow_bf16_reduced_precision_reduction,
        ),
        (
            matmul::set_allow_fp16_accumulation,
            matmul::allow_fp16_accumulation,
        ),
        (matmul::set_allow_tf32, matmul::allow_tf32),
        (cuda::enable_flash_sdp, cuda::flash_sdp_enabled),
        (
            cuda::enable_mem_efficient_sdp,
            cuda::mem_efficient_sdp_enabled,
        ),
        (cuda::enable_math_sdp, cuda::math_sdp_enabled),
        (cuda::enable_cudnn_sdp, cuda::cudnn_sdp_enabled),
        (
            cuda::allow_fp16_bf16_reduction_math_sdp,
            cuda::fp16_bf16_reduction_math_sdp_allowed,
        ),
        (mha::set_fastpath_enabled, mha::get_fastpath_enabled),
        (opt_einsum::set_enabled, opt_einsum::enabled),
    ];
    for (set, get) in pairs {
        let before = get();
        set(!before);
        assert_eq!(get(), !before);
        set(before);
        assert_eq!(get(), before);
    }
    matmul::set_fp32_precision(Fp32Precision::None);
}

#[test]
fn fp32_precision_hierarchy_and_its_views() {
    let _lock = process_wide();
    let _restore = backends::float32_matmul_precision(Float32MatmulPrecision::Highest);
    let _root = backends::FP32_PRECISION.guard(Fp32Precision::Ieee);

    // A leaf of `none` inherits the root.
    matmul::set_fp32_precision(Fp32Precision::None);
    backends::set_fp32_precision(Fp32Precision::Tf32);
    assert_eq!(matmul::fp32_precision_effective(), Fp32Precision::Tf32);
    assert!(matmul::allow_tf32());
    backends::set_fp32_precision(Fp32Precision::Ieee);
    assert!(!matmul::allow_tf32());

    // set_float32_matmul_precision writes the leaf; allow_tf32 is a view of it.
    for (level, precision, tf32) in [
        (Float32MatmulPrecision::Highest, Fp32Precision::Ieee, false),
        (Float32MatmulPrecision::High, Fp32Precision::Tf32, true),
        (Float32MatmulPrecision::Medium, Fp32Precision::Bf16, true),
    ] {
        backends::set_float32_matmul_precision(level);
        assert_eq!(matmul::fp32_precision(), precision);
        assert_eq!(backends::get_float32_matmul_precision(), level);
        assert_eq!(matmul::allow_tf32(), tf32, "{level}");
    }
    matmul::set_allow_tf32(true);
    assert_eq!(
        backends::get_float32_matmul_precision(),
        Float32MatmulPrecision::High
    );
    matmul::set_allow_tf32(false);
    assert_eq!(matmul::fp32_precision(), Fp32Precision::Ieee);
}

#[test]
fn preferred_libraries_set_and_return() {
    let _lock = process_wide();
    assert_eq!(
        cuda::preferred_blas_library(Some(BlasBackend::Cublaslt)),
        BlasBackend::Cublaslt
    );
    assert_eq!(cuda::preferred_blas_library(None), BlasBackend::Cublaslt);
    assert_eq!(
        cuda::preferred_blas_library(Some(BlasBackend::Default)),
        BlasBackend::Default
    );
    assert_eq!(
        cuda::preferred_linalg_library(Some(LinalgBackend::Magma)),
        LinalgBackend::Magma
    );
    assert_eq!(
        cuda::preferred_linalg_library(Some(LinalgBackend::Default)),
        LinalgBackend::Default
    );
    assert_eq!(
        cuda::preferred_rocm_fa_library(Some(RocmFaBackend::Aotriton)),
        RocmFaBackend::Aotriton
    );
    assert_eq!(
        cuda::preferred_rocm_fa_library(Some(RocmFaBackend::Default)),
        RocmFaBackend::Default
    );
}

#[test]
fn guards_restore_on_panic() {
    let _lock = process_wide();
    let result = catch_unwind(AssertUnwindSafe(|| {
        let _g = sdpa_kernel(&[SdpBackend::Math], true);
        let _c = cudnn::flags(cudnn::Flags {
            benchmark_limit: Some(0),
            deterministic: Some(true),
            ..Default::default()
        });
        assert!(cudnn::deterministic() && backends::deterministic_required());
        panic!("inside the guards");
    }));
    assert!(result.is_err());
    assert!(
        cuda::flash_sdp_enabled() && cuda::mem_efficient_sdp_enabled() && cuda::cudnn_sdp_enabled()
    );
    assert_eq!(cuda::sdp_priority_order().as_slice()[0], SdpBackend::Flash);
    assert_eq!(
        (cudnn::benchmark_limit(), cudnn::deterministic()),
        (10, false)
    );
    assert!(!backends::deterministic_required());
}

#[test]
fn sdpa_kernel_enables_only_the_listed_backends_and_nests() {
    let _lock = process_wide();
    {
        let _outer = sdpa_kernel(&[SdpBackend::Math, SdpBackend::MemEfficient], false);
        assert!(cuda::math_sdp_enabled() && cuda::mem_efficient_sdp_enabled());
        assert!(!cuda::flash_sdp_enabled() && !cuda::cudnn_sdp_enabled());
        assert_eq!(
            cuda::sdp_priority_order().as_slice()[0],
            SdpBackend::Flash,
            "no set_priority"
        );
        {
            let _inner = sdpa_kernel(&[SdpBackend::Cudnn, SdpBackend::Flash], true);
            assert!(
                cuda::cudnn_sdp_enabled() && cuda::flash_sdp_enabled() && !cuda::math_sdp_enabled()
            );
            assert_eq!(
                cuda::sdp_priority_order().as_slice(),
                [
                    SdpBackend::Cudnn,
                    SdpBackend::Flash,
                    SdpBackend::MemEfficient,
                    SdpBackend::Math
                ]
            );
        }
        assert!(!cuda::flash_sdp_enabled() && cuda::math_sdp_enabled());
        assert_eq!(cuda::sdp_priority_order().as_slice()[0], SdpBackend::Flash);
    }
    assert!(cuda::flash_sdp_enabled() && cuda::cudnn_sdp_enabled());
}

#[test]
#[allow(deprecated)]
fn deprecated_sdp_kernel_sets_each_switch() {
    let _lock = process_wide();
    {
        let _g = cuda::sdp_kernel(false, true, false, true);
        assert!(!cuda::flash_sdp_enabled() && cuda::math_sdp_enabled());
        assert!(!cuda::mem_efficient_sdp_enabled() && cuda::cudnn_sdp_enabled());
    }
    assert!(cuda::flash_sdp_enabled() && cuda::mem_efficient_sdp_enabled());
}

#[test]
fn cudnn_flags_guard_sets_only_what_is_given() {
    let _lock = process_wide();
    {
        let _g = cudnn::flags(cudnn::Flags {
            enabled: Some(false),
            benchmark: Some(true),
            benchmark_limit: Some(3),
            deterministic: None,
            allow_tf32: Some(false),
        });
        assert!(!cudnn::enabled() && cudnn::benchmark() && !cudnn::allow_tf32());
        assert_eq!(cudnn::benchmark_limit(), 3);
        assert!(!cudnn::deterministic());
    }
    assert!(cudnn::enabled() && !cudnn::benchmark() && cudnn::allow_tf32());
    assert_eq!(cudnn::benchmark_limit(), 10);
}

#[test]
fn nnpack_mkldnn_opt_einsum_and_verbose_guards() {
    let _lock = process_wide();
    {
        let _n = nnpack::flags(false);
        assert!(!nnpack::enabled());
        let _k = mkldnn::flags(false);
        assert!(!mkldnn::enabled());
        let _o = opt_einsum::flags(Some(false), Some(opt_einsum::Strategy::Greedy));
        assert!(!opt_einsum::enabled());
        assert_eq!(opt_einsum::strategy(), opt_einsum::Strategy::Greedy);
        let _v = mkldnn::verbose(mkldnn::VERBOSE_ON_CREATION).unwrap();
        assert_eq!(backends::verbose::level(), 2);
        let _m = mkl::verbose(mkl::VERBOSE_ON).unwrap();
        assert_eq!(mkl::VERBOSE.get(), 1);
    }
    assert!(nnpack::enabled() && mkldnn::enabled() && opt_einsum::enabled());
    assert_eq!(opt_einsum::strategy(), opt_einsum::Strategy::Auto);
    assert_eq!(backends::verbose::level(), 0);

    assert!(nnpack::set_flags(false));
    assert!(!nnpack::set_flags(true));
    assert!(mkldnn::set_flags(false));
    assert!(!mkldnn::set_flags(true));
    opt_einsum::set_strategy(opt_einsum::Strategy::Optimal);
    assert_eq!(opt_einsum::strategy(), opt_einsum::Strategy::Optimal);
    opt_einsum::set_strategy(opt_einsum::Strategy::Auto);

    let err = mkl::verbose(2).unwrap_err().to_string();
    assert!(
        err.contains("mkl.verbose") && err.contains("0..=1"),
        "{err}"
    );
    assert!(mkldnn::verbose_scoped(3).is_err());
}

#[test]
fn num_threads_setter() {
    let _lock = process_wide();
    let before = backends::NUM_THREADS.global();
    backends::set_num_threads(3).unwrap();
    assert_eq!(backends::get_num_threads(), 3);
    assert!(backends::openmp::is_available());
    backends::set_num_threads(1).unwrap();
    assert!(
        !backends::openmp::is_available(),
        "one thread is not multi-threaded"
    );
    // 0 is an error; a count past the limit is capped, as OpenMP caps it.
    assert!(backends::set_num_threads(0).is_err());
    backends::set_num_threads(10_000).unwrap();
    assert_eq!(backends::get_num_threads(), backends::MAX_THREADS);
    backends::NUM_THREADS.set(before);
}

#[test]
fn use_deterministic_algorithms_switch() {
    let _lock = process_wide();
    backends::use_deterministic_algorithms(true, true);
    assert!(backends::are_deterministic_algorithms_enabled());
    assert!(backends::is_deterministic_algorithms_warn_only_enabled());
    assert!(backends::deterministic_required());
    backends::use_deterministic_algorithms(false, false);
    assert!(!backends::deterministic_required());
    backends::DETERMINISTIC_ALGORITHMS.set(false);
}

#[test]
fn scoped_guards_do_not_leak_to_other_threads() {
    // Two threads hold opposite thread-scoped settings at the same time; each sees its own,
    // and neither disturbs the process-wide value.
    let _lock = process_wide();
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        for allow in [true, false] {
            let barrier = &barrier;
            s.spawn(move || {
                let precision = if allow {
                    Fp32Precision::Tf32
                } else {
                    Fp32Precision::Ieee
                };
                let _p = matmul::FP32_PRECISION.guard_scoped(precision);
                let only = if allow {
                    SdpBackend::Flash
                } else {
                    SdpBackend::Math
                };
                let _k = sdpa_kernel_scoped(&[only], true);
                let _c = cudnn::flags_scoped(cudnn::Flags {
                    benchmark_limit: Some(allow as u32),
                    ..Default::default()
                });
                barrier.wait();
                assert_eq!(matmul::allow_tf32(), allow);
                assert_eq!(cuda::flash_sdp_enabled(), allow);
                assert_eq!(cuda::math_sdp_enabled(), !allow);
                assert_eq!(cuda::sdp_priority_order().as_slice()[0], only);
                assert_eq!(cudnn::benchmark_limit(), allow as u32);
                barrier.wait();
            });
        }
    });
    // This thread never had an override: it sees the process-wide values.
    assert!(cuda::flash_sdp_enabled() && cuda::math_sdp_enabled());
}

#[test]
fn scoped_guard_restores_on_panic() {
    let _lock = process_wide();
    let result = catch_unwind(|| {
        let _g = sdpa_kernel_scoped(&[], false);
        let _f = backends::float32_matmul_precision_scoped(Float32MatmulPrecision::Medium);
        assert!(!cuda::math_sdp_enabled());
        panic!("inside the scoped guard");
    });
    assert!(result.is_err());
    assert!(cuda::math_sdp_enabled() && cuda::flash_sdp_enabled());
    assert_eq!(
        backends::get_float32_matmul_precision(),
        Float32MatmulPrecision::Highest
    );
}

/// Every accepted spelling parses, `Display` gives the canonical one back, and an unknown
/// spelling is an error that lists what is accepted.
fn check_spellings<T>(accepted: &[(&str, T)], canonical: &[(T, &str)])
where
    T: FromStr<Err = backends::Error> + std::fmt::Display + PartialEq + std::fmt::Debug + Copy,
{
    for (text, value) in accepted {
        assert_eq!(text.parse::<T>().unwrap(), *value, "{text}");
        assert_eq!(
            text.to_uppercase().parse::<T>().unwrap(),
            *value,
            "{text} upper-case"
        );
    }
    for (value, text) in canonical {
        assert_eq!(value.to_string(), *text);
    }
    let err = "no-such-spelling".parse::<T>().unwrap_err();
    let message = err.to_string();
    for (value, text) in canonical {
        assert!(message.contains(text), "{message} lists {value:?}");
    }
    assert!(matches!(err, backends::Error::UnknownOption { .. }));
}

#[test]
fn enum_spellings() {
    use Fp32Precision as P;
    check_spellings(
        &[
            ("none", P::None),
            ("ieee", P::Ieee),
            ("tf32", P::Tf32),
            ("bf16", P::Bf16),
        ],
        &[
            (P::None, "none"),
            (P::Ieee, "ieee"),
            (P::Tf32, "tf32"),
            (P::Bf16, "bf16"),
        ],
    );
    use Float32MatmulPrecision as F;
    check_spellings(
        &[
            ("highest", F::Highest),
            ("high", F::High),
            ("medium", F::Medium),
        ],
        &[
            (F::Highest, "highest"),
            (F::High, "high"),
            (F::Medium, "medium"),
        ],
    );
    use BlasBackend as B;
    check_spellings(
        &[
            ("cublas", B::Cublas),
            ("cublaslt", B::Cublaslt),
            ("hipblaslt", B::Cublaslt),
            ("ck", B::Ck),
            ("default", B::Default),
        ],
        &[
            (B::Cublas, "cublas"),
            (B::Cublaslt, "cublaslt"),
            (B::Ck, "ck"),
            (B::Default, "default"),
        ],
    );
    use LinalgBackend as L;
    check_spellings(
        &[
            ("cusolver", L::Cusolver),
            ("magma", L::Magma),
            ("default", L::Default),
        ],
        &[
            (L::Cusolver, "cusolver"),
            (L::Magma, "magma"),
            (L::Default, "default"),
        ],
    );
    use RocmFaBackend as R;
    check_spellings(
        &[
            ("aotriton", R::Aotriton),
            ("ck", R::Ck),
            ("default", R::Default),
        ],
        &[
            (R::Aotriton, "aotriton"),
            (R::Ck, "ck"),
            (R::Default, "default"),
        ],
    );
    use opt_einsum::Strategy as S;
    check_spellings(
        &[
            ("auto", S::Auto),
            ("greedy", S::Greedy),
            ("optimal", S::Optimal),
        ],
        &[
            (S::Auto, "auto"),
            (S::Greedy, "greedy"),
            (S::Optimal, "optimal"),
        ],
    );
    use SdpBackend as K;
    check_spellings(
        &[
            ("MATH", K::Math),
            ("flash_attention", K::Flash),
            ("efficient_attention", K::MemEfficient),
            ("cudnn_attention", K::Cudnn),
        ],
        &[
            (K::Math, "MATH"),
            (K::Flash, "FLASH_ATTENTION"),
            (K::MemEfficient, "EFFICIENT_ATTENTION"),
            (K::Cudnn, "CUDNN_ATTENTION"),
        ],
    );
    use CpuCapability as C;
    check_spellings(
        &[
            ("default", C::Default),
            ("vsx", C::Vsx),
            ("z vector", C::ZVector),
            ("zvector", C::ZVector),
            ("no avx", C::NoAvx),
            ("avx2", C::Avx2),
            ("avx512", C::Avx512),
            ("sve256", C::Sve256),
        ],
        &[
            (C::Default, "DEFAULT"),
            (C::Vsx, "VSX"),
            (C::ZVector, "Z VECTOR"),
            (C::NoAvx, "NO AVX"),
            (C::Avx2, "AVX2"),
            (C::Avx512, "AVX512"),
            (C::Sve256, "SVE256"),
        ],
    );
    check_spellings(
        &[
            ("float16", DType::F16),
            ("half", DType::F16),
            ("bfloat16", DType::Bf16),
            ("float32", DType::F32),
            ("f64", DType::F64),
        ],
        &[
            (DType::F16, "f16"),
            (DType::Bf16, "bf16"),
            (DType::F32, "f32"),
            (DType::F64, "f64"),
            (DType::Bool, "bool"),
        ],
    );
    assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
}
