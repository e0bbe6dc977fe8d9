//! # backends-macros
//!
//! `#[sdpa_kernel(...)]`: a compile-time checked choice of scaled-dot-product-attention
//! backends for a function, re-exported as `backends::sdpa_kernel`.
//!
//! The checks read `backends_spec::rules`, the description of what each backend
//! accepts that the run-time selection reads too, and the kernel declarations that the
//! dispatch table is generated from.

use backends_spec::keys::{Elem, MaskKind};
use backends_spec::rules::{self, Backend, DeviceKind, Target};
use backends_spec::variants;
use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ItemFn, Lit, Meta, Token};

/// Restricts every scaled-dot-product-attention call in a function to the listed
/// backends, checked against the backend rules when the crate compiles.
///
/// ```
/// use backends::{Result, SdpaOptions, Tensor, sdpa};
///
/// #[backends::sdpa_kernel(flash, math, set_priority, causal, device = cpu)]
/// fn attend(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
///     // `is_causal` defaults to true here; only flash, then math, may serve.
///     Ok(sdpa(q, k, v, &SdpaOptions::default())?.output)
/// }
/// # let t = Tensor::from_vec(vec![0.5f32; 2 * 3 * 8], &[1, 2, 3, 8], backends::Device::Cpu).unwrap();
/// # assert_eq!(attend(&t, &t, &t).unwrap().shape(), &[1, 2, 3, 8]);
/// ```
///
/// Arguments, in any order:
/// - backends, one or more: `flash`, `mem_efficient` (alias `efficient`), `math`,
///   `cudnn`. Only these are enabled in the body, as with the
///   `backends::attention::sdpa_kernel_scoped` guard: for the thread that runs the body
///   only (other threads keep their settings), until the function returns, by `?` or by a
///   panic. On an `async fn` the settings follow the future: they are in force during each
///   poll of it, on whichever thread polls it, and not between polls. Annotated functions
///   nest: the innermost decides.
/// - `set_priority`: the listed order is the priority order.
/// - what the calls in the body look like: `causal`, or `causal = upper_left|lower_right`
///   (PyTorch's `causal_upper_left` / `causal_lower_right`; also makes `is_causal` and that
///   alignment the default of `SdpaOptions::default()` in the body), `dtype = bf16|f16|f32|f64`,
///   `head_dim = N`, `mask = none|bool|float`, `dropout`.
/// - `device = cuda|wgpu|cpu`: the kind of device the calls run on; `cuda` (PyTorch's
///   GPU rules) when absent.
///
/// Each listed backend must be able to serve such calls on the most capable device of that
/// kind, by the rules `backends::attention::check` applies at run time
/// (`backends_spec::rules`); otherwise compilation fails at the offending token, naming
/// the rule: e.g. `flash, dtype = f32` (flash on CUDA takes f16/bf16), `flash, mask =
/// float`, `flash, head_dim = 512`, `cudnn, device = cpu`, an unknown or repeated name.
///
/// With one backend, a `dtype` and a `head_dim`, the attribute pins that variant: a call
/// that matches it (device kind, dtype, head dim, causal alignment, mask kind) checks only
/// that backend, skipping the priority walk, and on a GPU uses the dispatch-table entry
/// chosen at compile time. Other calls select as usual among the listed backends.
///
/// Attributes on closures are not stable Rust; wrap the closure's body in an annotated
/// function instead.
#[proc_macro_attribute]
pub fn sdpa_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    match expand(attr.into(), item.clone()) {
        Ok(out) => out.into(),
        Err(error) => {
            // The function stays as written, so that the error is the only one.
            let mut out = error.to_compile_error();
            out.extend(item);
            out.into()
        }
    }
}

/// A value with the span of the token that gave it.
type At<T> = (T, Span);

/// What the attribute says.
struct Spec {
    backends: Vec<At<Backend>>,
    set_priority: bool,
    /// `causal` (upper-left) or `causal = upper_left | lower_right`: lower-right or not.
    causal: Option<At<bool>>,
    dtype: Option<At<Elem>>,
    head_dim: Option<At<usize>>,
    mask: Option<At<MaskKind>>,
    dropout: Option<Span>,
    device: At<DeviceKind>,
}

const BACKENDS: &str = "flash, mem_efficient (or efficient), math, cudnn";
const OPTIONS: &str = "set_priority, causal (or causal = upper_left|lower_right), dropout, \
                       dtype = bf16|f16|f32|f64, head_dim = N, mask = none|bool|float, \
                       device = cuda|wgpu|cpu";

fn err<T>(span: Span, message: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, message))
}

fn parse_spec(attr: TokenStream2) -> syn::Result<Spec> {
    let args = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr)?;
    let mut spec = Spec {
        backends: Vec::new(),
        set_priority: false,
        causal: None,
        dtype: None,
        head_dim: None,
        mask: None,
        dropout: None,
        device: (DeviceKind::Cuda, Span::call_site()),
    };
    let mut seen_options: Vec<String> = Vec::new();
    for arg in args {
        let name = arg
            .path()
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let span = arg.span();
        let is_option = matches!(
            name.as_str(),
            "set_priority" | "causal" | "dropout" | "dtype" | "head_dim" | "mask" | "device"
        );
        if is_option {
            if seen_options.contains(&name) {
                return err(span, format!("`{name}` is given twice"));
            }
            seen_options.push(name.clone());
        }
        match (&arg, name.as_str()) {
            (Meta::Path(_), "flash" | "mem_efficient" | "efficient" | "math" | "cudnn") => {
                let backend = match name.as_str() {
                    "flash" => Backend::Flash,
                    "math" => Backend::Math,
                    "cudnn" => Backend::Cudnn,
                    _ => Backend::MemEfficient,
                };
                if spec.backends.iter().any(|(b, _)| *b == backend) {
                    return err(
                        span,
                        format!(
                            "{} is listed twice: list each backend once (its position is its priority with set_priority)",
                            backend.title()
                        ),
                    );
                }
                spec.backends.push((backend, span));
            }
            (Meta::Path(_), "set_priority") => spec.set_priority = true,
            (Meta::Path(_), "causal") => spec.causal = Some((false, span)),
            (Meta::Path(_), "dropout") => spec.dropout = Some(span),
            (Meta::NameValue(nv), "dtype" | "mask" | "device" | "head_dim" | "causal") => {
                let value = &nv.value;
                let vspan = value.span();
                let word = match value {
                    Expr::Path(p) => p.path.get_ident().map(ToString::to_string),
                    _ => None,
                };
                match name.as_str() {
                    "head_dim" => {
                        let Expr::Lit(ExprLit {
                            lit: Lit::Int(n), ..
                        }) = value
                        else {
                            return err(vspan, "head_dim takes an integer, e.g. `head_dim = 128`");
                        };
                        let d: usize = n.base10_parse()?;
                        if d == 0 {
                            return err(vspan, "head_dim must be at least 1");
                        }
                        spec.head_dim = Some((d, vspan));
                    }
                    "dtype" => {
                        let elem = match word.as_deref() {
                            Some("bf16" | "bfloat16") => Elem::Bf16,
                            Some("f16" | "float16" | "half") => Elem::F16,
                            Some("f32" | "float32") => Elem::F32,
                            Some("f64" | "float64") => Elem::F64,
                            _ => return err(vspan, "dtype takes bf16, f16, f32 or f64"),
                        };
                        spec.dtype = Some((elem, vspan));
                    }
                    "causal" => {
                        let lower_right = match word.as_deref() {
                            Some("upper_left") => false,
                            Some("lower_right") => true,
                            _ => return err(vspan, "causal takes upper_left or lower_right"),
                        };
                        spec.causal = Some((lower_right, vspan));
                    }
                    "mask" => {
                        let mask = match word.as_deref() {
                            Some("none") => MaskKind::None,
                            Some("bool") => MaskKind::Bool,
                            Some("float") => MaskKind::Additive,
                            _ => return err(vspan, "mask takes none, bool or float"),
                        };
                        spec.mask = Some((mask, vspan));
                    }
                    _ => {
                        let kind = match word.as_deref() {
                            Some("cuda") => DeviceKind::Cuda,
                            Some("wgpu") => DeviceKind::Wgpu,
                            Some("cpu") => DeviceKind::Cpu,
                            _ => return err(vspan, "device takes cuda, wgpu or cpu"),
                        };
                        spec.device = (kind, vspan);
                    }
                }
            }
            (Meta::Path(_), "dtype" | "mask" | "device" | "head_dim") => {
                return err(span, format!("`{name}` takes a value, e.g. `{name} = ...`"));
            }
            _ if is_option => {
                return err(span, format!("`{name}` takes no value"));
            }
            _ => {
                return err(
                    span,
                    format!(
                        "unknown SDPA backend or option `{}`: backends are {BACKENDS}; options are {OPTIONS}",
                        quote!(#arg)
                    ),
                );
            }
        }
    }
    if spec.backends.is_empty() {
        return err(
            Span::call_site(),
            format!("list at least one backend: {BACKENDS}"),
        );
    }
    if let (Some(_), Some((mask, span))) = (spec.causal, spec.mask)
        && mask != MaskKind::None
    {
        return err(
            span,
            "an explicit attn_mask does not go with is_causal (as in PyTorch): fold the causal \
             mask into the mask and drop `causal`",
        );
    }
    Ok(spec)
}

/// `a`, `a and b`, `a, b and c`.
fn names(elems: &[Elem]) -> String {
    let words: Vec<&str> = elems.iter().map(|e| e.name()).collect();
    match words.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => words.join(""),
    }
}

/// Checks every listed backend against the shared rules on the most capable device of the
/// chosen kind: a backend that can never serve the calls the attribute describes is an
/// error at the token that rules it out.
fn check(spec: &Spec) -> syn::Result<()> {
    let (kind, _) = spec.device;
    let target = Target::most_capable(kind);
    let elsewhere = |wanted: &dyn Fn(DeviceKind) -> bool| {
        let others: Vec<String> = [DeviceKind::Cuda, DeviceKind::Wgpu, DeviceKind::Cpu]
            .into_iter()
            .filter(|&k| k != kind && wanted(k))
            .map(|k| format!("`device = {k}`"))
            .collect();
        if others.is_empty() {
            String::new()
        } else {
            format!("; it does with {}", others.join(" or "))
        }
    };
    for &(backend, bspan) in &spec.backends {
        let title = backend.title();
        if !rules::has_kernel(backend, kind) {
            return err(
                bspan,
                format!(
                    "{title} has no kernel for {kind} devices (rule: device){}",
                    elsewhere(&|k| rules::has_kernel(backend, k))
                ),
            );
        }
        let accepted = rules::dtypes(backend, &target);
        if let Some((elem, span)) = spec.dtype
            && !accepted.contains(&elem)
        {
            return err(
                span,
                format!(
                    "{title} on {kind} takes {} inputs, not {} (rule: dtype){}",
                    names(accepted),
                    elem.name(),
                    elsewhere(&|k| rules::dtypes(backend, &Target::most_capable(k)).contains(&elem))
                ),
            );
        }
        if let Some((d, span)) = spec.head_dim {
            let elems: Vec<Elem> = spec.dtype.map_or(accepted.to_vec(), |(e, _)| vec![e]);
            let rules_for: Vec<_> = elems
                .iter()
                .filter_map(|&e| rules::head_dims(backend, &target, e))
                .collect();
            if !rules_for.is_empty() && !rules_for.iter().any(|r| r.allows([d; 3])) {
                return err(
                    span,
                    format!(
                        "{title} on {kind} requires {} (rule: head dim); head_dim = {d} breaks it",
                        rules_for[0]
                    ),
                );
            }
        }
        if let Some((mask, span)) = spec.mask
            && mask != MaskKind::None
            && !rules::takes_mask(backend, kind)
        {
            return err(
                span,
                format!(
                    "{title} on {kind} takes no attn_mask, only is_causal (rule: attn_mask){}",
                    elsewhere(&|k| rules::takes_mask(backend, k))
                ),
            );
        }
        if let Some(span) = spec.dropout
            && !rules::takes_dropout(backend, kind)
        {
            return err(
                span,
                format!(
                    "{title} on {kind} applies no dropout (rule: dropout){}",
                    elsewhere(&|k| rules::takes_dropout(backend, k))
                ),
            );
        }
    }
    Ok(())
}

/// The pinned variant when the attribute names exactly one: a single backend, a dtype and
/// a head dim (causal and mask default to off and none).
fn pin(spec: &Spec) -> syn::Result<TokenStream2> {
    let (&[(backend, _)], Some((elem, _)), Some((d, dspan))) =
        (spec.backends.as_slice(), spec.dtype, spec.head_dim)
    else {
        return Ok(quote!(::core::option::Option::None));
    };
    let (kind, _) = spec.device;
    let causal_key = spec.causal.is_some();
    let causal = causal_expr(spec);
    let mask = spec.mask.map_or(MaskKind::None, |(m, _)| m);
    let kernel = match kind {
        DeviceKind::Wgpu | DeviceKind::Cuda => rules::kernel_key(
            backend,
            rules::compute_elem(kind, elem),
            d,
            causal_key,
            mask,
        ),
        DeviceKind::Cpu => None,
    };
    let kernel = match kernel {
        None => quote!(::core::option::Option::None),
        Some(key) => {
            let built = variants::all().iter().any(|v| {
                v.key == key
                    && match kind {
                        DeviceKind::Cuda => v.cuda.is_some(),
                        _ => v.wgsl.is_some(),
                    }
            });
            if !built {
                return err(
                    dspan,
                    format!("no generated {kind} kernel serves {key:?} (rule: kernel table)"),
                );
            }
            let expr: TokenStream2 = key
                .rust_expr()
                .parse()
                .expect("kernel keys print as Rust expressions");
            quote!(::core::option::Option::Some({
                use ::backends::kernels::*;
                #expr
            }))
        }
    };
    let backend = backend_path(backend);
    let device = match kind {
        DeviceKind::Cpu => quote!(Cpu),
        DeviceKind::Wgpu => quote!(Wgpu),
        DeviceKind::Cuda => quote!(Cuda),
    };
    let dtype = match elem {
        Elem::F32 => quote!(F32),
        Elem::F16 => quote!(F16),
        Elem::Bf16 => quote!(Bf16),
        Elem::F64 => quote!(F64),
    };
    let mask = match mask {
        MaskKind::None => quote!(None),
        MaskKind::Bool => quote!(Bool),
        MaskKind::Additive => quote!(Additive),
    };
    let head_dim = u32::try_from(d)
        .ok()
        .filter(|&d| d <= 4095)
        .map_or_else(|| err(dspan, "a pinned head_dim is at most 4095"), Ok)?;
    Ok(
        quote!(::core::option::Option::Some(::backends::attention::Pin {
            backend: #backend,
            device: ::backends::kernels::rules::DeviceKind::#device,
            dtype: ::backends::DType::#dtype,
            head_dim: #head_dim,
            causal: #causal,
            mask: ::backends::kernels::MaskKind::#mask,
            kernel: #kernel,
        })),
    )
}

/// The `Option<CausalVariant>` the attribute gives calls.
fn causal_expr(spec: &Spec) -> TokenStream2 {
    match spec.causal {
        None => quote!(::core::option::Option::None),
        Some((false, _)) => {
            quote!(::core::option::Option::Some(
                ::backends::CausalVariant::UpperLeft
            ))
        }
        Some((true, _)) => {
            quote!(::core::option::Option::Some(
                ::backends::CausalVariant::LowerRight
            ))
        }
    }
}

fn backend_path(backend: Backend) -> TokenStream2 {
    let variant = match backend {
        Backend::Flash => quote!(Flash),
        Backend::MemEfficient => quote!(MemEfficient),
        Backend::Math => quote!(Math),
        Backend::Cudnn => quote!(Cudnn),
    };
    quote!(::backends::attention::SdpBackend::#variant)
}

fn expand(attr: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let spec = parse_spec(attr)?;
    let function: ItemFn = syn::parse2(item).map_err(|e| {
        syn::Error::new(
            e.span(),
            "#[sdpa_kernel] goes on a function or method with a body",
        )
    })?;
    if let Some(constness) = &function.sig.constness {
        return err(
            constness.span(),
            "#[sdpa_kernel] sets the SDPA flags when the function runs; a const fn cannot",
        );
    }
    check(&spec)?;
    let pin = pin(&spec)?;
    let backends = spec.backends.iter().map(|&(b, _)| backend_path(b));
    let set_priority = spec.set_priority;
    let causal = causal_expr(&spec);
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let scope = quote! {
        ::backends::attention::SdpaKernelScope {
            backends: &[#(#backends),*],
            set_priority: #set_priority,
            causal: #causal,
            pin: #pin,
        }
    };
    // An async fn's settings follow its future from poll to poll (on any thread); a plain
    // function's hold on its thread until it returns or unwinds.
    let body = if sig.asyncness.is_some() {
        quote! { #scope.wrap(async move #block).await }
    } else {
        let guard = syn::Ident::new("sdpa_kernel_guard", Span::mixed_site());
        let enter = quote_spanned! {Span::mixed_site()=> let #guard = #scope.enter(); };
        quote! { #enter #block }
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #body
        }
    })
}
