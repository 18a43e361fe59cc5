//! Kernel argument validators: sysctl keys (`is_sysctl_key`, which become paths beneath
//! `proc/sys`), module names (`is_module_name`, handed to `modprobe --`), and their grants
//! (`Grants::validate`, `may_sysctl`, `may_load_module`).
//!
//! Input: `NAME` or `NAME\nGRANT\nGRANT...` (the grants used as sysctl and module lists).
//!
//! Invariants: both validators accept exactly their documented language; a valid key maps to
//! a valid host path beneath `proc/sys` when it fits in 4096 bytes; a valid module name is one
//! plain path component; the grant decisions are exact match, or prefix match for a sysctl
//! grant ending in `*`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::grants::{Grants, KernelGrant, is_module_name, is_sysctl_key};
use nodeward::hostpath::HostPath;

fn word(p: &str) -> bool {
    !p.is_empty()
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fuzz_target!(|data: &[u8]| {
    let Some(s) = nodeward_fuzz::text(data) else {
        return;
    };
    let (name, list) = nodeward_fuzz::lines2(s);

    let key_ok = name.split('.').all(word);
    assert_eq!(is_sysctl_key(name), key_ok, "{name:?}");
    if key_ok {
        let path = format!("proc/sys/{}", name.replace('.', "/"));
        let p = HostPath::parse(&path);
        assert_eq!(p.is_ok(), path.len() <= 4096, "{path:?}");
        if let Ok(p) = p {
            assert_eq!(p.prefixes().count(), 2 + name.split('.').count());
        }
    }
    let module_ok = word(name) && name.len() <= 64;
    assert_eq!(is_module_name(name), module_ok, "{name:?}");
    if module_ok {
        assert!(HostPath::parse(name).is_ok_and(|p| p.parent().is_none()));
    }

    let list: Vec<String> = list.lines().map(String::from).collect();
    let g = Grants {
        kernel: KernelGrant {
            modules: list.clone(),
            sysctls: list.clone(),
            swap_off: false,
        },
        ..Default::default()
    };
    let sysctl_model = list.iter().any(|e| match e.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => e == name,
    });
    assert_eq!(g.may_sysctl(name), sysctl_model);
    assert_eq!(g.may_load_module(name), list.iter().any(|e| e == name));
    if g.validate().is_ok() {
        for e in &list {
            assert!(is_module_name(e));
            let key = e.strip_suffix('*').unwrap_or(e);
            assert!(is_sysctl_key(key.trim_end_matches('.')));
        }
    }
});
