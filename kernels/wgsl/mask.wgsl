// Reading an attention mask, shared by the templates that take one (prepended to them by
// the generator): the template declares `MASK_KIND` (0 none, 1 boolean, 2 additive),
// `MASK_T` and the storage array `mask` (booleans one byte per element, packed four to a
// u32 word; additive values in MASK_T).

// Whether element `index` of a boolean mask hides its key (false hides).
fn mask_hides(index: u32) -> bool {
    if (MASK_KIND == 1u) { return ((u32(mask[index / 4u]) >> (8u * (index % 4u))) & 0xffu) == 0u; }
    return false;
}

// Element `index` of an additive mask (0 for the other kinds).
fn mask_bias(index: u32) -> f32 {
    if (MASK_KIND == 2u) { return f32(mask[index]); }
    return 0.0;
}
