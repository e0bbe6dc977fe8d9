//! Probing for vendor shared libraries at run time, without linking against them.

use libloading::Library;

/// A vendor library that was found and loaded, kept open for the life of the process.
pub(crate) struct Loaded {
    /// The file name it was loaded by.
    pub file: String,
    /// The open library.
    pub lib: Library,
}

/// The platform's file names for library `stem` at the given major versions, newest first,
/// then the unversioned name.
fn candidates(stem: &str, versions: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = versions
        .iter()
        .map(|v| {
            if cfg!(windows) {
                format!("{stem}64_{v}.dll")
            } else if cfg!(target_os = "macos") {
                format!("lib{stem}.{v}.dylib")
            } else {
                format!("lib{stem}.so.{v}")
            }
        })
        .collect();
    names.push(if cfg!(windows) {
        format!("{stem}.dll")
    } else if cfg!(target_os = "macos") {
        format!("lib{stem}.dylib")
    } else {
        format!("lib{stem}.so")
    });
    names
}

/// Loads the first of library `stem`'s names (at `versions`) that the loader finds on its
/// normal search path (`LD_LIBRARY_PATH`, the system folders).
pub(crate) fn load(stem: &str, versions: &[&str]) -> Option<Loaded> {
    candidates(stem, versions).into_iter().find_map(|file| {
        // SAFETY: loading runs the library's initialisers; these are vendor libraries
        // meant to be loaded into any process, and no symbol is used here.
        let lib = unsafe { Library::new(&file) }.ok()?;
        Some(Loaded { file, lib })
    })
}

/// The JSON entry for a vendor library: where it was found, or `null`.
pub(crate) fn report(loaded: Option<&Loaded>) -> serde_json::Value {
    loaded.map(|l| l.file.clone()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_names_newest_first() {
        let names = candidates("cudnn", &["9", "8"]);
        assert_eq!(names.len(), 3);
        if cfg!(target_os = "linux") {
            assert_eq!(names, ["libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"]);
        }
    }

    #[test]
    fn a_missing_library_is_none() {
        assert!(load("backends-no-such-library", &["1"]).is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_present_library_loads() {
        // The C math library is on every Linux machine.
        let loaded = load("m", &["6"]).expect("libm.so.6 loads");
        assert_eq!(loaded.file, "libm.so.6");
    }
}
