//! PTX text into kernels: entry points with their parameters, shared-memory declarations
//! and instructions (guard, opcode with its modifiers, operands), labels resolved to
//! instruction indices. Debug sections, `.loc`/`.file` lines and comments are dropped;
//! register declarations are not needed (registers are created on first write).

use std::collections::HashMap;
use std::fmt;

/// Why a PTX text could not be read: the line and what was wrong there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line of the statement (0 where the text as a whole is at fault).
    pub line: usize,
    /// What was not understood.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PTX line {}: {}", self.line, self.what)
    }
}

impl std::error::Error for ParseError {}

/// A PTX module: its ISA version, target and entry points.
#[derive(Clone, Debug, PartialEq)]
pub struct Module {
    /// `.version major.minor`.
    pub version: (u32, u32),
    /// `.target` (e.g. `sm_80`).
    pub target: String,
    /// The `.entry` kernels, in order.
    pub kernels: Vec<Kernel>,
}

impl Module {
    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// One `.entry` kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Its name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// Its `.shared` variables.
    pub shared: Vec<Shared>,
    /// Its instructions, in order.
    pub body: Vec<Instruction>,
    /// Each label's instruction index (the instruction after it; `body.len()` at the end).
    pub labels: HashMap<String, usize>,
    /// Why it cannot run, where it calls a device function or reads module-scope memory
    /// (neither is run): the instruction's line and what it does. Launching it is an error.
    pub not_run: Option<(usize, String)>,
}

/// A kernel parameter: `.param .u64 name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Its name.
    pub name: String,
    /// Its type without the dot (`u64`, `f32`, ...).
    pub ty: String,
    /// Its size in bytes.
    pub bytes: usize,
}

/// A `.shared` variable: `.shared .align 4 .b8 name[bytes]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    /// Its name.
    pub name: String,
    /// Its alignment in bytes.
    pub align: usize,
    /// Its size in bytes.
    pub bytes: usize,
}

/// A predicate guard: `@%p1` or `@!%p1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    /// The predicate register.
    pub reg: String,
    /// Whether the instruction runs where the predicate is false.
    pub negated: bool,
}

/// One instruction.
#[derive(Clone, Debug, PartialEq)]
pub struct Instruction {
    /// Its guard, if any.
    pub guard: Option<Guard>,
    /// The opcode with its modifiers, as written (`ld.global.nc.f32`).
    pub opcode: String,
    /// Its operands, in order.
    pub operands: Vec<Operand>,
    /// Its 1-based line in the text.
    pub line: usize,
}

/// An instruction operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A register (`%r1`), special registers included (`%tid.x`).
    Reg(String),
    /// An integer literal.
    Int(i64),
    /// An f32 literal by its bits (`0f3F800000`).
    F32(u32),
    /// An f64 literal by its bits (`0d3FF0000000000000`).
    F64(u64),
    /// A memory address: `[base+offset]`.
    Address(Address),
    /// A vector of operands: `{%f1, %f2}`.
    Vector(Vec<Operand>),
    /// A name: a label, a parameter or a shared variable.
    Symbol(String),
    /// The sink `_`.
    Sink,
}

/// The base of an address.
#[derive(Clone, Debug, PartialEq)]
pub enum Address {
    /// A register plus a byte offset.
    Reg(String, i64),
    /// A named variable (parameter or shared) plus a byte offset.
    Symbol(String, i64),
    /// An absolute address.
    Absolute(i64),
}

/// Reads a PTX module.
pub fn parse(text: &str) -> Result<Module, ParseError> {
    let statements = statements(text)?;
    let mut module = Module {
        version: (0, 0),
        target: String::new(),
        kernels: Vec::new(),
    };
    let mut module_variables = Vec::new();
    let mut at = 0;
    while at < statements.len() {
        let (line, statement) = &statements[at];
        let line = *line;
        at += 1;
        match statement {
            Statement::Text(text) => {
                let mut words = text.split_whitespace();
                match words.next() {
                    Some(".version") => {
                        let v = words.next().unwrap_or_default();
                        let (major, minor) = v.split_once('.').ok_or_else(|| ParseError {
                            line,
                            what: format!("a .version of {v:?}"),
                        })?;
                        module.version = (number(major, line)?, number(minor, line)?);
                    }
                    Some(".target") => {
                        module.target = words
                            .next()
                            .unwrap_or_default()
                            .trim_end_matches(',')
                            .into();
                    }
                    Some(".address_size") => {
                        let size = words.next().unwrap_or_default();
                        if size != "64" {
                            return Err(ParseError {
                                line,
                                what: format!(
                                    ".address_size {size}: only 64-bit addresses are run"
                                ),
                            });
                        }
                    }
                    _ if text.contains(".entry") => {
                        let kernel;
                        (kernel, at) = entry(text, line, &statements, at)?;
                        module.kernels.push(kernel);
                    }
                    // Device functions are not run (none of ours has one; other compilers'
                    // modules do): their bodies are passed over, and a kernel that calls one
                    // fails when it runs (`call` is not run).
                    _ if text.contains(".func") => {
                        if matches!(statements.get(at), Some((_, Statement::Open))) {
                            at = past_block(&statements, at, line)?;
                        }
                    }
                    // Module-scope variables are not run; NVRTC 12.0 declares some that no
                    // kernel reads (`nv::target` constants): kept by name so that a kernel
                    // that does read one is refused below.
                    Some(".global" | ".const") => {
                        let name = text
                            .split(['=', ';', '['])
                            .next()
                            .and_then(|declaration| declaration.split_whitespace().last())
                            .unwrap_or_default();
                        module_variables.push(name.to_string());
                    }
                    _ => {}
                }
            }
            Statement::Open | Statement::Close | Statement::Label(_) => {}
        }
    }
    if module.target.is_empty() {
        return Err(ParseError {
            line: 0,
            what: "no .target: not a PTX module".into(),
        });
    }
    // A kernel that calls a device function or reads module-scope memory loads but does
    // not run (NVRTC 12.0 declares variables that no kernel reads; other compilers' tables
    // are read, and their kernels call functions).
    for kernel in &mut module.kernels {
        let call = kernel
            .body
            .iter()
            .find(|i| i.opcode.starts_with("call"))
            .map(|i| (i.line, i.opcode.clone()));
        let variable = || {
            kernel.body.iter().find_map(|i| {
                i.operands.iter().find_map(|operand| match operand {
                    Operand::Symbol(symbol) | Operand::Address(Address::Symbol(symbol, _))
                        if module_variables.contains(symbol) =>
                    {
                        Some((
                            i.line,
                            format!("{} of module-scope memory ({symbol})", i.opcode),
                        ))
                    }
                    _ => None,
                })
            })
        };
        kernel.not_run = call.or_else(variable);
    }
    Ok(module)
}

/// A statement of the text: one ending in `;` (or a directive line), a brace, or a label.
#[derive(Clone, Debug, PartialEq)]
enum Statement {
    Text(String),
    Open,
    Close,
    Label(String),
}

/// The index past the block that opens at `statements[open]` (a function's body), or an
/// error naming `line` where it never closes.
fn past_block(
    statements: &[(usize, Statement)],
    open: usize,
    line: usize,
) -> Result<usize, ParseError> {
    let mut depth = 0usize;
    for (i, (_, statement)) in statements.iter().enumerate().skip(open) {
        match statement {
            Statement::Open => depth += 1,
            Statement::Close => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i + 1);
                }
            }
            _ => {}
        }
    }
    Err(ParseError {
        line,
        what: "a function body that never closes".into(),
    })
}

/// The text as statements with their lines, comments, `.loc`/`.file` lines and debug
/// sections dropped.
fn statements(text: &str) -> Result<Vec<(usize, Statement)>, ParseError> {
    let mut out = Vec::new();
    let mut pending = String::new();
    let mut pending_line = 0;
    let mut section_depth: Option<usize> = None;
    let mut depth = 0usize;
    let mut in_block_comment = false;
    for (index, raw) in text.lines().enumerate() {
        let line_no = index + 1;
        let mut line = String::new();
        let mut rest = raw;
        // Comments: /* ... */ (possibly over lines) and // to the end of the line.
        loop {
            if in_block_comment {
                match rest.find("*/") {
                    Some(end) => {
                        rest = &rest[end + 2..];
                        in_block_comment = false;
                    }
                    None => break,
                }
            }
            let (slash, block) = (rest.find("//"), rest.find("/*"));
            match (slash, block) {
                (Some(s), b) if b.is_none_or(|b| s < b) => {
                    line.push_str(&rest[..s]);
                    break;
                }
                (_, Some(b)) => {
                    line.push_str(&rest[..b]);
                    rest = &rest[b + 2..];
                    in_block_comment = true;
                }
                _ => {
                    line.push_str(rest);
                    break;
                }
            }
        }
        let trimmed = line.trim();
        if trimmed.starts_with(".loc") || trimmed.starts_with(".file") {
            continue;
        }
        // Debug sections: `.section name { ... }`, skipped with their braces.
        if section_depth.is_none() && trimmed.starts_with(".section") {
            section_depth = Some(depth);
        }
        for c in trimmed.chars() {
            if let Some(base) = section_depth {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == base {
                            section_depth = None;
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '{' if pending.trim().is_empty() || pending.trim_end().ends_with(')') => {
                    flush(&mut pending, pending_line, &mut out);
                    out.push((line_no, Statement::Open));
                    depth += 1;
                }
                '}' if pending.trim().is_empty() => {
                    out.push((line_no, Statement::Close));
                    depth = depth.checked_sub(1).ok_or_else(|| ParseError {
                        line: line_no,
                        what: "a '}' closes nothing".into(),
                    })?;
                }
                ';' => {
                    pending.push(';');
                    flush(&mut pending, pending_line, &mut out);
                }
                ':' if is_label(&pending) => {
                    let name = pending.trim().to_string();
                    pending.clear();
                    out.push((line_no, Statement::Label(name)));
                }
                _ => {
                    if pending.trim().is_empty() {
                        pending_line = line_no;
                    }
                    pending.push(c);
                }
            }
        }
        // A directive without ';' ends with its line (.version, .target, .maxntid, ...),
        // except inside an entry's parameter list.
        let open = pending.matches('(').count() > pending.matches(')').count();
        let entry_header_open = pending.contains(".entry") && !pending.contains(')');
        if !open && !entry_header_open && pending.trim_start().starts_with('.') {
            flush(&mut pending, pending_line, &mut out);
        } else {
            pending.push(' ');
        }
    }
    flush(&mut pending, pending_line, &mut out);
    Ok(out)
}

fn is_label(pending: &str) -> bool {
    let name = pending.trim();
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
        && !name.starts_with('.')
}

fn flush(pending: &mut String, line: usize, out: &mut Vec<(usize, Statement)>) {
    let text = pending.trim();
    if !text.is_empty() {
        out.push((
            line,
            Statement::Text(text.trim_end_matches(';').trim().to_string()),
        ));
    }
    pending.clear();
}

fn number<T: std::str::FromStr>(text: &str, line: usize) -> Result<T, ParseError> {
    text.trim().parse().map_err(|_| ParseError {
        line,
        what: format!("{text:?} is not a number"),
    })
}

/// An `.entry` (its header in `text`) and its body from `statements[at..]`; returns the
/// kernel and the index after its closing brace.
fn entry(
    text: &str,
    line: usize,
    statements: &[(usize, Statement)],
    mut at: usize,
) -> Result<(Kernel, usize), ParseError> {
    let after = &text[text.find(".entry").expect("an entry") + ".entry".len()..];
    let open = after.find('(').ok_or_else(|| ParseError {
        line,
        what: format!("an .entry without parameters: {text}"),
    })?;
    let close = after.rfind(')').ok_or_else(|| ParseError {
        line,
        what: format!("an unclosed parameter list: {text}"),
    })?;
    let name = after[..open].trim().to_string();
    let mut params = Vec::new();
    for param in after[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let words: Vec<&str> = param.split_whitespace().collect();
        // A scalar, or bytes passed by value (`.param .align 2 .b8 name[2]`).
        let (ty, declared) = match words.as_slice() {
            [".param", ty, name] | [".param", ".align", _, ty, name] => {
                (ty.trim_start_matches('.'), *name)
            }
            _ => {
                return Err(ParseError {
                    line,
                    what: format!("a parameter of a form not run: {param:?}"),
                });
            }
        };
        let (pname, count) = match declared.split_once('[') {
            Some((name, count)) => (name, number::<usize>(count.trim_end_matches(']'), line)?),
            None => (declared, 1),
        };
        let element = type_bytes(ty).ok_or_else(|| ParseError {
            line,
            what: format!("a parameter type not run: {ty}"),
        })?;
        params.push(Param {
            name: pname.to_string(),
            ty: ty.to_string(),
            bytes: element * count,
        });
    }
    let mut kernel = Kernel {
        name,
        params,
        shared: Vec::new(),
        body: Vec::new(),
        labels: HashMap::new(),
        not_run: None,
    };
    // Performance directives up to the body's brace.
    while let Some((_, Statement::Text(_))) = statements.get(at) {
        at += 1;
    }
    if statements.get(at).map(|s| &s.1) != Some(&Statement::Open) {
        return Err(ParseError {
            line,
            what: format!("{} has no body", kernel.name),
        });
    }
    at += 1;
    let mut depth = 1;
    while depth > 0 {
        let Some((line, statement)) = statements.get(at) else {
            return Err(ParseError {
                line,
                what: format!("{}'s body is not closed", kernel.name),
            });
        };
        at += 1;
        match statement {
            Statement::Open => depth += 1,
            Statement::Close => depth -= 1,
            Statement::Label(name) => {
                kernel.labels.insert(name.clone(), kernel.body.len());
            }
            Statement::Text(text) => body_statement(&mut kernel, text, *line)?,
        }
    }
    Ok((kernel, at))
}

/// The size of a PTX scalar type (without the dot).
pub fn type_bytes(ty: &str) -> Option<usize> {
    Some(match ty {
        "pred" => 1,
        "b8" | "u8" | "s8" => 1,
        "b16" | "u16" | "s16" | "f16" | "bf16" => 2,
        "b32" | "u32" | "s32" | "f32" | "f16x2" | "bf16x2" | "tf32" => 4,
        "b64" | "u64" | "s64" | "f64" => 8,
        _ => return None,
    })
}

/// One statement of a body: a declaration or an instruction.
fn body_statement(kernel: &mut Kernel, text: &str, line: usize) -> Result<(), ParseError> {
    // `.param` in a body: a call's arguments (the call itself is refused when it runs).
    if text.starts_with(".reg")
        || text.starts_with(".param")
        || text.starts_with(".pragma")
        || text.starts_with(".local .align 0")
    {
        return Ok(());
    }
    if let Some(decl) = text.strip_prefix(".shared") {
        kernel.shared.push(shared(decl, line)?);
        return Ok(());
    }
    if text.starts_with('.') {
        return Err(ParseError {
            line,
            what: format!("a declaration not run: {text}"),
        });
    }
    kernel.body.push(instruction(text, line)?);
    Ok(())
}

/// `.align 4 .b8 name[bytes]` (after `.shared`).
fn shared(decl: &str, line: usize) -> Result<Shared, ParseError> {
    let bad = || ParseError {
        line,
        what: format!("a .shared declaration of a form not run: {decl}"),
    };
    let words: Vec<&str> = decl.split_whitespace().collect();
    let (align, ty, name) = match words.as_slice() {
        [".align", align, ty, name] => (number::<usize>(align, line)?, *ty, *name),
        [ty, name] => (1, *ty, *name),
        _ => return Err(bad()),
    };
    let element = type_bytes(ty.trim_start_matches('.')).ok_or_else(bad)?;
    let (name, count) = match name.split_once('[') {
        Some((name, count)) => (name, number::<usize>(count.trim_end_matches(']'), line)?),
        None => (name, 1),
    };
    Ok(Shared {
        name: name.to_string(),
        align,
        bytes: element * count,
    })
}

/// `@%p1 add.s32 %r1, %r2, 4`.
fn instruction(text: &str, line: usize) -> Result<Instruction, ParseError> {
    let mut rest = text.trim();
    let guard = match rest.strip_prefix('@') {
        Some(after) => {
            let (pred, tail) = after
                .split_once(char::is_whitespace)
                .ok_or_else(|| ParseError {
                    line,
                    what: format!("a guard with no instruction: {text}"),
                })?;
            rest = tail.trim_start();
            Some(match pred.strip_prefix('!') {
                Some(reg) => Guard {
                    reg: reg.to_string(),
                    negated: true,
                },
                None => Guard {
                    reg: pred.to_string(),
                    negated: false,
                },
            })
        }
        None => None,
    };
    let (opcode, operands) = match rest.split_once(char::is_whitespace) {
        Some((opcode, operands)) => (opcode, operands.trim()),
        None => (rest, ""),
    };
    // A call's operands (`(ret), function, (args)`) are kept out: calls are not run.
    let operands = if opcode.starts_with("call") {
        ""
    } else {
        operands
    };
    let operands = split_top(operands)
        .into_iter()
        .filter(|o| !o.is_empty())
        .map(|o| operand(o, line))
        .collect::<Result<_, _>>()?;
    Ok(Instruction {
        guard,
        opcode: opcode.to_string(),
        operands,
        line,
    })
}

/// `text` split at the commas outside brackets and braces.
fn split_top(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text[start..].trim());
    parts
}

fn operand(text: &str, line: usize) -> Result<Operand, ParseError> {
    let bad = || ParseError {
        line,
        what: format!("an operand not understood: {text:?}"),
    };
    if let Some(inner) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
        return Ok(Operand::Vector(
            split_top(inner)
                .into_iter()
                .map(|o| operand(o, line))
                .collect::<Result<_, _>>()?,
        ));
    }
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        let inner = inner.trim();
        let (base, offset) = match inner.find(['+', '-']).filter(|&i| i > 0) {
            Some(i) => {
                let offset = inner[i..].replace("+-", "-").replace('+', "");
                (
                    inner[..i].trim(),
                    offset.trim().parse::<i64>().map_err(|_| bad())?,
                )
            }
            None => (inner, 0),
        };
        return Ok(Operand::Address(if base.starts_with('%') {
            Address::Reg(base.to_string(), offset)
        } else if let Ok(absolute) = base.parse::<i64>() {
            Address::Absolute(absolute + offset)
        } else {
            Address::Symbol(base.to_string(), offset)
        }));
    }
    if text.starts_with('%') {
        return Ok(Operand::Reg(text.to_string()));
    }
    if text == "_" {
        return Ok(Operand::Sink);
    }
    if let Some(bits) = text.strip_prefix("0f").or_else(|| text.strip_prefix("0F")) {
        return u32::from_str_radix(bits, 16)
            .map(Operand::F32)
            .map_err(|_| bad());
    }
    if let Some(bits) = text.strip_prefix("0d").or_else(|| text.strip_prefix("0D")) {
        return u64::from_str_radix(bits, 16)
            .map(Operand::F64)
            .map_err(|_| bad());
    }
    let (negative, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let digits = digits.trim_end_matches('U');
    let value = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16).ok()
    } else if digits.chars().next().is_some_and(|c| c.is_ascii_digit()) {
        digits.parse::<u64>().ok()
    } else {
        None
    };
    if let Some(value) = value {
        let value = value as i64;
        return Ok(Operand::Int(if negative {
            value.wrapping_neg()
        } else {
            value
        }));
    }
    if text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
    {
        return Ok(Operand::Symbol(text.to_string()));
    }
    Err(bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCALE: &str = r#"
//
// Generated by NVIDIA NVVM Compiler
.version 8.8
.target sm_80
.address_size 64

	// .globl	scale_f32
.visible .entry scale_f32(
	.param .u64 scale_f32_param_0,
	.param .u64 scale_f32_param_1,
	.param .f64 scale_f32_param_2
)
.maxntid 256, 1, 1
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<3>;
	.shared .align 4 .b8 _ZZ5tileE1s[1024];
	.loc	1 110 0
	ld.param.u64 	%rd2, [scale_f32_param_0];
	mov.u32 	%r1, %ctaid.x;
	setp.ge.s64 	%p1, %rd1, %rd3;
	@%p1 bra 	$L__BB0_2;
	{ // inline asm scope
	.reg .b16 %tmp;
	mov.b32 %r2, 0f3F800000;
	}
	ld.global.f32 	%f1, [%rd8+-4];
	mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};
	@!%p1 st.shared.f32 [_ZZ5tileE1s+8], %f2;
$L__BB0_2:
	ret;

}
	.section	.debug_str
	{
.b8 95,90,53,0
	}
"#;

    #[test]
    fn a_kernel_with_its_parameters_shared_memory_labels_and_operands() {
        let module = parse(SCALE).unwrap();
        assert_eq!((module.version, module.target.as_str()), ((8, 8), "sm_80"));
        let k = module.kernel("scale_f32").unwrap();
        assert_eq!(
            k.params
                .iter()
                .map(|p| (p.ty.as_str(), p.bytes))
                .collect::<Vec<_>>(),
            [("u64", 8), ("u64", 8), ("f64", 8)]
        );
        assert_eq!(
            k.shared,
            [Shared {
                name: "_ZZ5tileE1s".into(),
                align: 4,
                bytes: 1024
            }]
        );
        let opcodes: Vec<&str> = k.body.iter().map(|i| i.opcode.as_str()).collect();
        assert_eq!(
            opcodes,
            [
                "ld.param.u64",
                "mov.u32",
                "setp.ge.s64",
                "bra",
                "mov.b32",
                "ld.global.f32",
                "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                "st.shared.f32",
                "ret"
            ]
        );
        assert_eq!(k.labels["$L__BB0_2"], 8);
        assert_eq!(
            k.body[3].guard,
            Some(Guard {
                reg: "%p1".into(),
                negated: false
            })
        );
        assert_eq!(k.body[3].operands, [Operand::Symbol("$L__BB0_2".into())]);
        assert_eq!(k.body[4].operands[1], Operand::F32(0x3F80_0000));
        assert_eq!(
            k.body[5].operands[1],
            Operand::Address(Address::Reg("%rd8".into(), -4))
        );
        let Operand::Vector(d) = &k.body[6].operands[0] else {
            panic!("a vector operand")
        };
        assert_eq!(d.len(), 4);
        assert!(k.body[7].guard.as_ref().is_some_and(|g| g.negated));
        assert_eq!(
            k.body[7].operands[0],
            Operand::Address(Address::Symbol("_ZZ5tileE1s".into(), 8))
        );
    }

    #[test]
    fn what_is_not_run_is_a_typed_error() {
        let err = parse(".version 8.0\n.target sm_80\n.address_size 32\n").unwrap_err();
        assert!(err.what.contains("64-bit"), "{err}");
        let err = parse(".version 8.0\n.target sm_80\n.func foo()\n{\nret;\n").unwrap_err();
        assert!(err.what.contains("never closes") && err.line == 3, "{err}");
        let err = parse("not ptx at all").unwrap_err();
        assert!(err.what.contains(".target"), "{err}");
        let err = parse(
            ".version 8.0\n.target sm_80\n.entry k(\n.param .u64 a\n)\n{\nadd.s32 %r1, ?!, 1;\n}\n",
        )
        .unwrap_err();
        assert!(err.what.contains("?!") && err.line == 7, "{err}");
    }

    #[test]
    fn device_functions_are_passed_over_and_a_call_is_not_run() {
        let text = ".version 8.0\n.target sm_80\n.address_size 64\n\
            .func (.param .b32 r) twice(\n.param .b32 x\n)\n{\n.reg .b32 %r<2>;\n\
            ld.param.b32 %r1, [x];\nadd.s32 %r1, %r1, %r1;\nst.param.b32 [r], %r1;\nret;\n}\n\
            .visible .entry k(\n.param .u64 a\n)\n{\n.reg .b32 %r<3>;\nmov.u32 %r1, 1;\n{\n\
            .param .b32 p;\nst.param.b32 [p], %r1;\n.param .b32 q;\n\
            call.uni (q), twice, (p);\nld.param.b32 %r2, [q];\n}\nret;\n}\n";
        let module = parse(text).unwrap();
        assert_eq!(module.kernels.len(), 1);
        let launch = crate::Launch {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            params: vec![vec![0; 8]],
            counters: false,
        };
        let err =
            crate::run(&module.kernels[0], &launch, &mut crate::Memory::default()).unwrap_err();
        assert!(err.to_string().contains("call"), "{err}");
    }

    #[test]
    fn kernels_that_read_module_scope_variables_load_but_do_not_run() {
        let module = |body: &str| {
            format!(
                ".version 8.0\n.target sm_80\n.address_size 64\n\
                 .global .align 8 .u64 bits = 512;\n\
                 .visible .entry k(\n.param .u64 a\n)\n{{\n{body}\nret;\n}}\n"
            )
        };
        let launch = crate::Launch {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            params: vec![vec![0; 8]],
            counters: false,
        };
        let run = |body: &str| {
            let parsed = parse(&module(body)).unwrap();
            crate::run(&parsed.kernels[0], &launch, &mut crate::Memory::default())
        };
        // As NVRTC 12.0 writes them: declared, never read.
        assert!(run("mov.u32 %r1, 1;").is_ok());
        // Read: the module loads, the kernel does not run.
        for body in ["ld.global.u64 %rd1, [bits];", "mov.u64 %rd1, bits;"] {
            let err = run(body).unwrap_err();
            assert!(
                err.to_string().contains("module-scope memory (bits)"),
                "{err}"
            );
            assert!(
                matches!(err, crate::ExecError::Unsupported { line: 9, .. }),
                "{err}"
            );
        }
    }
}
