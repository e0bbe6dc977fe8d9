//! Which library linear algebra on CUDA tensors prefers
//! (`torch.backends.cuda.preferred_linalg_library`), and the choice it leads to.

use std::sync::OnceLock;

use crate::core::flag::{EnvInit, Flag, option_enum};
use crate::runtime::dylib::{self, Loaded};

option_enum! {
    /// A linear-algebra library to prefer.
    pub enum LinalgBackend ("linalg backend") {
        /// The library's own choice.
        Default = "default",
        /// cuSOLVER.
        Cusolver = "cusolver",
        /// MAGMA.
        Magma = "magma",
    }
}

/// The preferred linear-algebra library. `TORCH_LINALG_PREFER_CUSOLVER=1` starts it at `cusolver`.
pub static PREFERRED_LINALG: Flag<LinalgBackend> = Flag::new(
    "cuda.preferred_linalg_library",
    LinalgBackend::Default,
    Some(EnvInit {
        var: "TORCH_LINALG_PREFER_CUSOLVER",
        parse: |s| (s == "1").then_some(LinalgBackend::Cusolver),
    }),
);

/// With `Some(backend)`, sets the preferred linear-algebra library; returns the one in force.
///
/// As in PyTorch it is a preference, not a requirement: CUDA tensors factor through cuSOLVER
/// under `default` and `cusolver`, and under `magma` too, since MAGMA's calls are not wired
/// in (the trace says whether a libmagma loads). CPU tensors always use faer.
pub fn preferred_linalg_library(backend: Option<LinalgBackend>) -> LinalgBackend {
    if let Some(backend) = backend {
        PREFERRED_LINALG.set(backend);
    }
    PREFERRED_LINALG.get()
}

/// MAGMA's shared library, if one loads.
pub(crate) fn magma() -> Option<&'static Loaded> {
    static LIB: OnceLock<Option<Loaded>> = OnceLock::new();
    LIB.get_or_init(|| dylib::load("magma", &[])).as_ref()
}

/// The library CUDA linear algebra runs under the preference in force, and why, for the
/// trace: always cuSOLVER, with the reason where MAGMA was preferred.
pub(crate) fn choice() -> String {
    match PREFERRED_LINALG.get() {
        LinalgBackend::Default => "cusolver (default preference)".into(),
        LinalgBackend::Cusolver => "cusolver (preferred)".into(),
        LinalgBackend::Magma if magma().is_some() => {
            "cusolver (magma preferred; libmagma loads but its calls are not wired in)".into()
        }
        LinalgBackend::Magma => "cusolver (magma preferred; libmagma not loadable)".into(),
    }
}
