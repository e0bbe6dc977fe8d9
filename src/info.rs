//! The `backends info` report: every module's queries and flags, as JSON or as text.

use serde_json::{Map, Value, json};

/// The module names of `docs/behaviour.md`, each a top-level key of [`report`].
pub const MODULES: [&str; 12] = [
    "cpu",
    "cuda",
    "cudnn",
    "cusparselt",
    "mha",
    "mps",
    "mkl",
    "mkldnn",
    "nnpack",
    "openmp",
    "opt_einsum",
    "xeon",
];

/// The whole report: one key per module (see [`MODULES`]), plus `global` (process-wide
/// settings outside any module) and `wgpu` (the adapters found). Each flag appears as
/// `{"value": …, "source": "default" | "env VAR" | "set"}`.
pub fn report() -> Value {
    let global = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "fp32_precision": crate::core::precision::FP32_PRECISION.report(),
        "deterministic_algorithms": crate::core::determinism::DETERMINISTIC_ALGORITHMS.report(),
        "deterministic_algorithms_warn_only": crate::core::determinism::DETERMINISTIC_WARN_ONLY.report(),
        "deterministic_required": crate::deterministic_required(),
        "num_threads": crate::get_num_threads(),
        "verbose_level": crate::core::verbose::level(),
    });
    let sections = [
        ("global", global),
        ("cpu", crate::cpu::report()),
        ("cuda", crate::cuda::report()),
        ("cudnn", crate::cudnn::report()),
        ("cusparselt", crate::cusparselt::report()),
        ("mha", crate::ops::mha::report()),
        ("mps", crate::mps::report()),
        ("mkl", crate::mkl::report()),
        ("mkldnn", crate::mkldnn::report()),
        ("nnpack", crate::nnpack::report()),
        ("openmp", crate::openmp::report()),
        ("opt_einsum", crate::ops::einsum::path::report()),
        ("xeon", crate::xeon::report()),
        ("wgpu", crate::runtime::wgpu::adapters::report()),
    ];
    Value::Object(
        sections
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    )
}

/// The report as indented text, one line per value; flags show their source.
pub fn render_text(report: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(sections) = report {
        for (name, section) in sections {
            out.push_str(&format!("{name}\n"));
            if let Value::Object(fields) = section {
                render_fields(fields, 1, &mut out);
            }
        }
    }
    out
}

fn render_fields(fields: &Map<String, Value>, depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    for (key, value) in fields {
        match value {
            Value::Object(inner) if is_flag(inner) => {
                out.push_str(&format!(
                    "{indent}{key}: {} ({})\n",
                    scalar(&inner["value"]),
                    scalar(&inner["source"])
                ));
            }
            Value::Object(inner) => {
                out.push_str(&format!("{indent}{key}:\n"));
                render_fields(inner, depth + 1, out);
            }
            Value::Array(items) if items.iter().any(Value::is_object) => {
                out.push_str(&format!(
                    "{indent}{key}:{}\n",
                    if items.is_empty() { " none" } else { "" }
                ));
                for item in items {
                    let line = match item {
                        Value::Object(o) => o
                            .iter()
                            .map(|(k, v)| format!("{k}={}", scalar(v)))
                            .collect::<Vec<_>>()
                            .join(", "),
                        other => scalar(other),
                    };
                    out.push_str(&format!("{indent}  - {line}\n"));
                }
            }
            other => out.push_str(&format!("{indent}{key}: {}\n", scalar(other))),
        }
    }
}

fn is_flag(fields: &Map<String, Value>) -> bool {
    fields.len() == 2 && fields.contains_key("value") && fields.contains_key("source")
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "none".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "none".to_string(),
        Value::Array(items) => items.iter().map(scalar).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_shows_flags_with_their_source_and_empty_lists_as_none() {
        let report = json!({
            "m": {
                "flag": {"value": true, "source": "default"},
                "list": [],
                "devices": [{"index": 0, "name": "x"}],
                "nested": {"depth": 2},
            }
        });
        let text = render_text(&report);
        assert!(text.contains("  flag: true (default)\n"), "{text}");
        assert!(text.contains("  list: none\n"), "{text}");
        assert!(text.contains("    - index=0, name=x\n"), "{text}");
        assert!(text.contains("  nested:\n    depth: 2\n"), "{text}");
    }
}
