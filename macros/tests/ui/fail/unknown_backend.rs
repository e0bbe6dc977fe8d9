#[backends::sdpa_kernel(flash, turbo)]
fn attend() {}

fn main() {
    attend();
}
