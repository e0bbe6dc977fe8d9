//! Compile-time checks of `#[sdpa_kernel]`: each file under `ui/fail` must fail with the
//! message in its `.stderr`; each file under `ui/pass` must build and run.

#[test]
fn sdpa_kernel_attribute() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
