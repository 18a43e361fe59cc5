//! The bundle manifest: TOML through the host's own manifest checks (`Bundle::from_parts`:
//! strict serde, format, phase names, worlds, component names, digests, `Grants::validate`).
//! Every component reads as empty bytes, so a phase whose `sha256` is that of the empty string
//! passes the digest check (the seeds use it) and the whole manifest is exercised.
//!
//! Invariants: an accepted manifest re-serializes and re-parses to an equal manifest (with the
//! same checks); its digest is the sha256 of its bytes; every grant it holds is well-formed
//! and covers what it names (a path prefix, an exact sysctl key, module, unit, URL).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::bundle::{Bundle, BundleSource, sha256_hex};
use nodeward::grants::{Grants, UnitVerb};
use nodeward::hostpath::HostPath;

fuzz_target!(|data: &[u8]| {
    let source = BundleSource::Dir("fuzz".into());
    let bundle = match Bundle::from_parts(data, source.clone(), |_| Ok(Vec::new())) {
        Ok(b) => b,
        Err(e) => {
            assert!(e.to_string().starts_with("bundle fuzz: "), "{e}");
            return;
        }
    };
    assert_eq!(bundle.digest, sha256_hex(data));
    let m = &bundle.manifest;
    assert!(!m.phases.is_empty());
    for (i, p) in m.phases.iter().enumerate() {
        assert!(!m.phases[..i].iter().any(|q| q.name == p.name), "duplicate");
        assert!(!p.component.is_empty() && !p.component.contains('/'));
        assert!(!p.component.starts_with('.'), "component {:?}", p.component);
        assert_eq!(p.sha256, sha256_hex(b""));
        assert!(bundle.component(&p.name).is_some());
        grants_cover_what_they_name(&p.grants);
    }
    let text = toml::to_string(m).expect("serializes");
    let again = Bundle::from_parts(text.as_bytes(), source, |_| Ok(Vec::new()))
        .unwrap_or_else(|e| panic!("re-serialized manifest refused: {e}\n{text}"));
    assert_eq!(
        serde_json::to_value(&again.manifest).expect("json"),
        serde_json::to_value(m).expect("json"),
        "round trip"
    );
});

fn grants_cover_what_they_name(g: &Grants) {
    g.validate().expect("accepted grants validate");
    for p in g.fs.read.iter().chain(&g.fs.write) {
        let p = HostPath::parse(p).expect("validated path prefix");
        assert!(g.may_read(&p));
        if let Ok(child) = p.join("x") {
            assert!(g.may_read(&child));
        }
    }
    for p in &g.fs.write {
        let p = HostPath::parse(p).expect("validated path prefix");
        assert!(g.may_write(&p));
    }
    for p in &g.mounts.targets {
        assert!(g.may_mount(&HostPath::parse(p).expect("validated mount target")));
    }
    for m in &g.kernel.modules {
        assert!(g.may_load_module(m));
    }
    for k in &g.kernel.sysctls {
        let key = k.strip_suffix('*').unwrap_or(k);
        assert!(g.may_sysctl(key), "{k}");
    }
    for (verb, list) in [
        (UnitVerb::Write, &g.systemd.write),
        (UnitVerb::Enable, &g.systemd.enable),
        (UnitVerb::Start, &g.systemd.start),
        (UnitVerb::Mask, &g.systemd.mask),
        (UnitVerb::Status, &g.systemd.status),
    ] {
        for u in list {
            assert!(!u.contains('/') && !u.is_empty());
            if !u.contains(['*', '?', '[', ']']) {
                assert!(g.may_unit(verb, u), "{u}");
            }
        }
    }
    for u in &g.download.urls {
        if !u.contains('*')
            && let Ok(url) = url::Url::parse(u)
        {
            assert!(g.may_download(&url), "{u} does not cover {url}");
        }
    }
}
