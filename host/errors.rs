//! Error text as nodeward prints it.

/// The error and its sources, `: `-separated, each source once (some crates' own messages,
/// reqwest's and rustls's among them, are terse and put the cause only in the source).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}
