#[backends::sdpa_kernel(math, dtype = int8)]
fn a() {}

#[backends::sdpa_kernel(math, head_dim = "64")]
fn b() {}

#[backends::sdpa_kernel(math, head_dim = 0)]
fn c() {}

#[backends::sdpa_kernel(math, mask = additive)]
fn d() {}

#[backends::sdpa_kernel(math, device = tpu)]
fn e() {}

#[backends::sdpa_kernel(math, dtype)]
fn f() {}

#[backends::sdpa_kernel(math = 1)]
fn g() {}

#[backends::sdpa_kernel(math, causal = diagonal)]
fn h() {}

fn main() {
    a();
    b();
    c();
    d();
    e();
    f();
    g();
    h();
}
