//! SDPA backend selection: a table of parameter combinations with the selected backend
//! and the exact reasons of every backend; guards, priority, and the aborting error.

use backends::attention::{
    DeviceCaps, HeadDims, Reason, SdpBackend, sdpa_kernel_scoped, select_with,
};
use backends::cuda::{SDPAParams, TensorMeta};
use backends::{CausalVariant, DType, Device, Error, Window};

use SdpBackend::{Cudnn, Flash, Math, MemEfficient};

fn meta(shape: &[usize], dtype: DType, device: Device) -> TensorMeta {
    TensorMeta::contiguous(shape, dtype, device)
}

/// q `[2, hq, lq, d]`, k and v `[2, hk, lk, d]`.
fn params(
    hq: usize,
    hk: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dtype: DType,
    device: Device,
) -> SDPAParams {
    SDPAParams {
        query: meta(&[2, hq, lq, d], dtype, device),
        key: meta(&[2, hk, lk, d], dtype, device),
        value: meta(&[2, hk, lk, d], dtype, device),
        attn_mask: None,
        dropout: 0.0,
        is_causal: false,
        causal_variant: CausalVariant::UpperLeft,
        window: Window::UNBOUNDED,
        enable_gqa: false,
    }
}

fn cuda(sm: (u32, u32), cudnn: Option<u32>) -> DeviceCaps {
    DeviceCaps {
        device: Device::Cuda(0),
        present: true,
        sm: Some(sm),
        shader_f16: false,
        cudnn_version: cudnn,
    }
}

fn wgpu(shader_f16: bool) -> DeviceCaps {
    DeviceCaps {
        device: Device::Wgpu(0),
        present: true,
        sm: None,
        shader_f16,
        cudnn_version: None,
    }
}

const CPU: DeviceCaps = DeviceCaps {
    device: Device::Cpu,
    present: true,
    sm: None,
    shader_f16: false,
    cudnn_version: None,
};

struct Case {
    name: &'static str,
    params: SDPAParams,
    caps: DeviceCaps,
    selected: SdpBackend,
    flash: Vec<Reason>,
    mem_efficient: Vec<Reason>,
    cudnn: Vec<Reason>,
}

fn head_dim(d: usize, max: usize, multiple_of: usize) -> Reason {
    Reason::HeadDim {
        query: d,
        key: d,
        value: d,
        rule: HeadDims { max, multiple_of },
    }
}

fn cases() -> Vec<Case> {
    let cu = Device::Cuda(0);
    let sm80 = cuda((8, 0), Some(90100));
    let fp32_on_16bit = |got| Reason::Dtype {
        got,
        accepted: vec![DType::F16, DType::Bf16],
    };
    let mut masked = params(8, 8, 128, 128, 64, DType::F16, cu);
    masked.attn_mask = Some(meta(&[128, 128], DType::F16, cu));
    let mut causal_rect = params(8, 8, 100, 300, 64, DType::F16, cu);
    causal_rect.is_causal = true;
    let lower_right_rect = SDPAParams {
        causal_variant: CausalVariant::LowerRight,
        ..causal_rect.clone()
    };
    let lower_right_square = SDPAParams {
        causal_variant: CausalVariant::LowerRight,
        ..params(8, 8, 128, 128, 64, DType::F16, cu)
    };
    let mut gqa = params(8, 2, 128, 128, 64, DType::Bf16, cu);
    gqa.enable_gqa = true;
    let mut strided = params(8, 8, 64, 64, 64, DType::F16, cu);
    strided.key.strides[3] = 2;
    let mut cpu_dropout = params(4, 4, 64, 64, 32, DType::F32, Device::Cpu);
    cpu_dropout.dropout = 0.1;
    let mut cpu_masked = params(4, 4, 64, 96, 32, DType::Bf16, Device::Cpu);
    cpu_masked.attn_mask = Some(meta(&[2, 1, 64, 96], DType::Bool, Device::Cpu));
    let mut cpu_causal_rect = params(4, 4, 64, 96, 32, DType::Bf16, Device::Cpu);
    cpu_causal_rect.is_causal = true;
    vec![
        Case {
            name: "bf16 on sm80: every fused backend can",
            params: params(8, 8, 128, 128, 64, DType::Bf16, cu),
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![],
        },
        Case {
            name: "fp32 on sm80 goes to memory-efficient",
            params: params(8, 8, 128, 128, 64, DType::F32, cu),
            caps: sm80,
            selected: MemEfficient,
            flash: vec![fp32_on_16bit(DType::F32)],
            mem_efficient: vec![],
            cudnn: vec![fp32_on_16bit(DType::F32)],
        },
        Case {
            name: "bf16 on sm75: too old for flash, cuDNN, and bf16 memory-efficient",
            params: params(8, 8, 128, 128, 64, DType::Bf16, cu),
            caps: cuda((7, 5), Some(90100)),
            selected: Math,
            flash: vec![Reason::Arch {
                have: (7, 5),
                min: (8, 0),
            }],
            mem_efficient: vec![Reason::Dtype {
                got: DType::Bf16,
                accepted: vec![DType::F32, DType::F16],
            }],
            cudnn: vec![Reason::Arch {
                have: (7, 5),
                min: (8, 0),
            }],
        },
        Case {
            name: "head dim 512",
            params: params(8, 8, 128, 128, 512, DType::F16, cu),
            caps: sm80,
            selected: Math,
            flash: vec![head_dim(512, 256, 1)],
            mem_efficient: vec![head_dim(512, 256, 8)],
            cudnn: vec![head_dim(512, 128, 8)],
        },
        Case {
            name: "head dim 36 in fp16: not a multiple of 8",
            params: params(8, 8, 128, 128, 36, DType::F16, cu),
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![head_dim(36, 256, 8)],
            cudnn: vec![head_dim(36, 128, 8)],
        },
        Case {
            name: "a float mask rules out flash and cuDNN",
            params: masked,
            caps: sm80,
            selected: MemEfficient,
            flash: vec![Reason::AttnMask],
            mem_efficient: vec![],
            cudnn: vec![Reason::AttnMask],
        },
        Case {
            name: "causal with Lq != Lk",
            params: causal_rect,
            caps: sm80,
            selected: MemEfficient,
            flash: vec![Reason::CausalNonSquare {
                lq: 100,
                lk: 300,
                variant: CausalVariant::UpperLeft,
            }],
            mem_efficient: vec![],
            cudnn: vec![],
        },
        Case {
            name: "causal_lower_right with Lq != Lk: flash takes it, cuDNN does not",
            params: lower_right_rect,
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![Reason::CausalNonSquare {
                lq: 100,
                lk: 300,
                variant: CausalVariant::LowerRight,
            }],
        },
        Case {
            name: "causal_lower_right with Lq = Lk is the top-left mask: every backend",
            params: SDPAParams {
                is_causal: true,
                ..lower_right_square
            },
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![],
        },
        Case {
            name: "a sliding window: the fused kernels take it, cuDNN's graph does not",
            params: SDPAParams {
                window: Window::new(Some(64), Some(0)),
                ..params(8, 8, 128, 128, 64, DType::F16, cu)
            },
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![Reason::Window(Window::new(Some(64), Some(0)))],
        },
        Case {
            name: "grouped-query attention",
            params: gqa,
            caps: sm80,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![Reason::Gqa],
            cudnn: vec![Reason::Gqa],
        },
        Case {
            name: "zero-length keys",
            params: params(8, 8, 16, 0, 64, DType::F16, cu),
            caps: sm80,
            selected: Math,
            flash: vec![Reason::ZeroLength { lq: 16, lk: 0 }],
            mem_efficient: vec![Reason::ZeroLength { lq: 16, lk: 0 }],
            cudnn: vec![Reason::ZeroLength { lq: 16, lk: 0 }],
        },
        Case {
            name: "a non-contiguous last dimension",
            params: strided,
            caps: sm80,
            selected: Math,
            flash: vec![Reason::LastDimStride { strides: [1, 2, 1] }],
            mem_efficient: vec![Reason::LastDimStride { strides: [1, 2, 1] }],
            cudnn: vec![Reason::LastDimStride { strides: [1, 2, 1] }],
        },
        Case {
            name: "cuDNN missing",
            params: params(8, 8, 128, 128, 64, DType::F16, cu),
            caps: cuda((9, 0), None),
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![Reason::Library(
                "cuDNN (libcudnn.so.9) is not loadable here".into(),
            )],
        },
        Case {
            name: "head dim 256: cuDNN 9.5 on sm90 takes it",
            params: params(8, 8, 128, 128, 256, DType::Bf16, cu),
            caps: cuda((9, 0), Some(90500)),
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![],
        },
        Case {
            name: "head dim 256: cuDNN on sm80 does not",
            params: params(8, 8, 128, 128, 256, DType::Bf16, cu),
            caps: cuda((8, 0), Some(90500)),
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![head_dim(256, 128, 8)],
        },
        Case {
            name: "CPU fp32: the fused path",
            params: params(4, 4, 64, 64, 32, DType::F32, Device::Cpu),
            caps: CPU,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![Reason::UnsupportedDevice(Device::Cpu)],
            cudnn: vec![Reason::UnsupportedDevice(Device::Cpu)],
        },
        Case {
            name: "CPU fused path takes masks",
            params: cpu_masked,
            caps: CPU,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![Reason::UnsupportedDevice(Device::Cpu)],
            cudnn: vec![Reason::UnsupportedDevice(Device::Cpu)],
        },
        Case {
            name: "CPU fused path takes rectangular causal",
            params: cpu_causal_rect,
            caps: CPU,
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![Reason::UnsupportedDevice(Device::Cpu)],
            cudnn: vec![Reason::UnsupportedDevice(Device::Cpu)],
        },
        Case {
            name: "CPU dropout takes math",
            params: cpu_dropout,
            caps: CPU,
            selected: Math,
            flash: vec![Reason::Dropout(0.1)],
            mem_efficient: vec![Reason::UnsupportedDevice(Device::Cpu)],
            cudnn: vec![Reason::UnsupportedDevice(Device::Cpu)],
        },
        Case {
            name: "wgpu f16 with shader-f16",
            params: params(4, 4, 64, 64, 64, DType::F16, Device::Wgpu(0)),
            caps: wgpu(true),
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![Reason::UnsupportedDevice(Device::Wgpu(0))],
        },
        Case {
            name: "wgpu bf16, computed in f32",
            params: params(4, 4, 64, 64, 64, DType::Bf16, Device::Wgpu(0)),
            caps: wgpu(false),
            selected: Flash,
            flash: vec![],
            mem_efficient: vec![],
            cudnn: vec![Reason::UnsupportedDevice(Device::Wgpu(0))],
        },
        Case {
            name: "wgpu f16 without shader-f16",
            params: params(4, 4, 64, 64, 64, DType::F16, Device::Wgpu(0)),
            caps: wgpu(false),
            selected: Math,
            // bf16 is accepted everywhere on wgpu: computed in f32 on widened copies.
            flash: vec![Reason::Dtype {
                got: DType::F16,
                accepted: vec![DType::F32, DType::Bf16],
            }],
            mem_efficient: vec![Reason::Dtype {
                got: DType::F16,
                accepted: vec![DType::F32, DType::Bf16],
            }],
            cudnn: vec![Reason::UnsupportedDevice(Device::Wgpu(0))],
        },
    ]
}

#[test]
fn selection_table() {
    let _all = sdpa_kernel_scoped(&[Flash, MemEfficient, Math, Cudnn], false);
    for case in cases() {
        let verdicts = backends::attention::explain_with(&case.params, &case.caps);
        let reasons = |b: SdpBackend| {
            verdicts
                .iter()
                .find(|(x, _)| *x == b)
                .map(|(_, r)| r.clone())
                .unwrap()
        };
        assert_eq!(reasons(Flash), case.flash, "{}: flash", case.name);
        assert_eq!(
            reasons(MemEfficient),
            case.mem_efficient,
            "{}: mem-efficient",
            case.name
        );
        assert_eq!(reasons(Cudnn), case.cudnn, "{}: cuDNN", case.name);
        assert_eq!(reasons(Math), vec![], "{}: math", case.name);
        assert_eq!(
            select_with(&case.params, &case.caps).unwrap(),
            case.selected,
            "{}",
            case.name
        );
    }
}

#[test]
fn guards_and_priority_steer_the_selection() {
    let p = params(8, 8, 128, 128, 64, DType::Bf16, Device::Cuda(0));
    let caps = cuda((9, 0), Some(90100));
    {
        let _g = sdpa_kernel_scoped(&[Cudnn, Flash], true);
        assert_eq!(
            select_with(&p, &caps).unwrap(),
            Cudnn,
            "set_priority puts cuDNN first"
        );
    }
    {
        let _g = sdpa_kernel_scoped(&[Cudnn, Flash], false);
        assert_eq!(
            select_with(&p, &caps).unwrap(),
            Flash,
            "without set_priority the order stays"
        );
    }
    {
        let _g = sdpa_kernel_scoped(&[MemEfficient], false);
        assert_eq!(select_with(&p, &caps).unwrap(), MemEfficient);
        let verdicts = backends::attention::explain_with(&p, &caps);
        assert_eq!(
            verdicts.iter().find(|(b, _)| *b == Flash).unwrap().1,
            vec![Reason::Disabled]
        );
    }
    let _all = sdpa_kernel_scoped(&[Flash, MemEfficient, Math, Cudnn], false);
    assert_eq!(select_with(&p, &caps).unwrap(), Flash, "guards restored");
}

#[test]
fn no_backend_is_the_aborting_error_with_every_reason() {
    let p = params(8, 8, 128, 128, 512, DType::F16, Device::Cuda(0));
    let caps = cuda((8, 0), Some(90100));
    let _g = sdpa_kernel_scoped(&[Flash, MemEfficient, Cudnn], false);
    let err = select_with(&p, &caps).unwrap_err();
    let Error::NoAvailableKernel { reasons } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        reasons.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        [Flash, MemEfficient, Cudnn]
    );
    let text = err.to_string();
    assert!(
        text.ends_with("No available kernel. Aborting execution."),
        "{text}"
    );
    assert!(text.contains("Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256. Got Query.size(-1): 512"), "{text}");
    assert!(
        text.contains("Memory efficient attention requires q,k,v to have the same last dimension"),
        "{text}"
    );
    assert!(text.contains("cuDNN attention requires"), "{text}");

    // With every backend disabled, the error says so for each of them.
    let _none = sdpa_kernel_scoped(&[], false);
    let err = select_with(&params(1, 1, 4, 4, 8, DType::F32, Device::Cpu), &CPU).unwrap_err();
    let Error::NoAvailableKernel { reasons } = &err else {
        panic!("{err}")
    };
    assert_eq!(reasons.len(), 4, "{err}");
    assert!(reasons.iter().all(|(_, r)| r == &[Reason::Disabled]));
    let text = err.to_string();
    assert!(
        text.starts_with("Flash attention is disabled (by its enable_*_sdp flag"),
        "{text}"
    );
    assert!(text.ends_with("No available kernel. Aborting execution."));
}

#[test]
fn can_use_checks_the_enable_flags_first_as_pytorch_does() {
    let p = params(2, 2, 8, 8, 16, DType::F32, Device::Cpu);
    let _all = sdpa_kernel_scoped(&[Flash, MemEfficient, Math, Cudnn], false);
    assert!(backends::cuda::can_use_flash_attention(&p, false));
    let _math = sdpa_kernel_scoped(&[Math], false);
    assert!(!backends::cuda::can_use_flash_attention(&p, true));
    assert_eq!(
        backends::attention::runtime_disabled(Flash),
        [Reason::Disabled]
    );
}

#[test]
fn cudnn_attention_is_refused_when_cudnn_is_off_or_determinism_is_required() {
    let p = params(8, 8, 128, 128, 64, DType::Bf16, Device::Cuda(0));
    let caps = cuda((9, 0), Some(90100));
    let _cudnn_first = sdpa_kernel_scoped(&[Cudnn, Flash, Math], true);
    let cudnn_reasons = || {
        backends::attention::explain_with(&p, &caps)
            .into_iter()
            .find(|(b, _)| *b == Cudnn)
            .unwrap()
            .1
    };
    assert_eq!(select_with(&p, &caps).unwrap(), Cudnn);
    {
        let _deterministic = backends::DETERMINISTIC_ALGORITHMS.guard_scoped(true);
        assert_eq!(cudnn_reasons(), [Reason::Nondeterministic]);
        assert_eq!(select_with(&p, &caps).unwrap(), Flash);
        // warn_only: cuDNN runs, with a warning.
        let _warn = backends::DETERMINISTIC_WARN_ONLY.guard_scoped(true);
        assert_eq!(select_with(&p, &caps).unwrap(), Cudnn);
    }
    {
        let _deterministic = backends::cudnn::flags_scoped(backends::cudnn::Flags {
            deterministic: Some(true),
            ..Default::default()
        });
        assert_eq!(cudnn_reasons(), [Reason::Nondeterministic]);
    }
    {
        let _off = backends::cudnn::flags_scoped(backends::cudnn::Flags {
            enabled: Some(false),
            ..Default::default()
        });
        assert_eq!(cudnn_reasons(), [Reason::CudnnDisabled]);
        assert_eq!(select_with(&p, &caps).unwrap(), Flash);
    }
    assert_eq!(select_with(&p, &caps).unwrap(), Cudnn);
}

#[test]
fn a_missing_device_leaves_nothing() {
    let mut caps = cuda((8, 0), Some(90100));
    caps.present = false;
    let _all = sdpa_kernel_scoped(&[Flash, MemEfficient, Math, Cudnn], false);
    let err = select_with(&params(2, 2, 8, 8, 64, DType::F16, Device::Cuda(0)), &caps).unwrap_err();
    let Error::NoAvailableKernel { reasons } = err else {
        panic!()
    };
    assert!(
        reasons
            .iter()
            .all(|(_, r)| r.contains(&Reason::DeviceMissing(Device::Cuda(0))))
    );
    // On this machine's own CUDA query: without a GPU, cuda:0 is missing too.
    if backends::cuda::device_count() == 0 {
        let p = params(2, 2, 8, 8, 64, DType::F16, Device::Cuda(0));
        assert!(backends::attention::selected_backend(&p).is_err());
        assert!(!backends::cuda::can_use_flash_attention(&p, true));
    }
}

#[test]
fn invalid_inputs_are_errors_not_reasons() {
    let cpu = Device::Cpu;
    let heads = params(8, 3, 4, 4, 8, DType::F32, cpu);
    assert!(matches!(
        select_with(&heads, &CPU),
        Err(Error::ShapeMismatch { .. })
    ));
    let mut gqa = heads.clone();
    gqa.key = meta(&[2, 2, 4, 8], DType::F32, cpu);
    gqa.value = gqa.key.clone();
    gqa.enable_gqa = true;
    assert_eq!(
        select_with(&gqa, &CPU).unwrap(),
        Flash,
        "8 query heads share 2 key/value heads"
    );
    let mut mixed = params(2, 2, 4, 4, 8, DType::F32, cpu);
    mixed.value.dtype = DType::F16;
    assert!(matches!(
        select_with(&mixed, &CPU),
        Err(Error::DTypeMismatch { .. })
    ));
    let mut mask = params(2, 2, 4, 5, 8, DType::F32, cpu);
    mask.attn_mask = Some(meta(&[4, 4], DType::Bool, cpu));
    let err = select_with(&mask, &CPU).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not broadcast to [2, 2, 4, 5]"),
        "{err}"
    );
    for p in [1.5, f64::NAN] {
        let mut dropout = params(2, 2, 4, 4, 8, DType::F32, cpu);
        dropout.dropout = p;
        assert!(matches!(
            select_with(&dropout, &CPU),
            Err(Error::InvalidArgument { .. })
        ));
    }
    // As in PyTorch, an explicit mask and is_causal do not go together, on any device.
    for (device, caps) in [(cpu, CPU), (Device::Cuda(0), cuda((9, 0), Some(90100)))] {
        let mut both = params(2, 2, 4, 4, 8, DType::F16, device);
        both.attn_mask = Some(meta(&[4, 4], DType::Bool, device));
        both.is_causal = true;
        assert!(matches!(
            select_with(&both, &caps),
            Err(Error::InvalidArgument {
                what: "attn_mask",
                ..
            })
        ));
    }
    let mut rank = params(2, 2, 4, 4, 8, DType::F32, cpu);
    rank.query = meta(&[4, 8], DType::F32, cpu);
    assert!(matches!(
        select_with(&rank, &CPU),
        Err(Error::ShapeMismatch { .. })
    ));
}
