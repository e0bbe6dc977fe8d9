#[backends::sdpa_kernel(flash, math, mask = float)]
fn attend() {}

fn main() {
    attend();
}
