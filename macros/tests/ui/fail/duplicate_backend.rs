#[backends::sdpa_kernel(flash, math, flash)]
fn attend() {}

fn main() {
    attend();
}
