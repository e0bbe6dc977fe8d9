#[backends::sdpa_kernel(math)]
const fn attend() {}

fn main() {
    attend();
}
