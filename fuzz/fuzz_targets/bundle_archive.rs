//! The bundle archive reader (`nodeward::bundle::archive::read_from`: tar, optionally gzip,
//! read whole into memory), then the manifest of what it holds (`Bundle::from_parts`, the
//! components read from the archive's members, digests checked).
//!
//! Invariants: every member the reader returns is a plain file name (no `/`, not `.`/`..`,
//! not empty, no NUL), within the archive cap; the members re-packed (tar, and tar.gz) read
//! back equal; an accepted bundle's every component is a member with the pinned sha256.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::bundle::archive::{MAX_ARCHIVE_BYTES, read_from};
use nodeward::bundle::{Bundle, BundleSource, FileError, MANIFEST_FILE, sha256_hex};
use std::collections::BTreeMap;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let Ok(members) = read_from(data) else {
        return;
    };
    let mut total = 0u64;
    for (name, bytes) in &members {
        assert!(!name.is_empty() && name != "." && name != "..", "{name:?}");
        assert!(!name.contains(['/', '\0']), "{name:?}");
        total += bytes.len() as u64;
    }
    assert!(total <= MAX_ARCHIVE_BYTES);
    if let Some(tar) = repack(&members) {
        assert_eq!(
            read_from(tar.as_slice()).ok().as_ref(),
            Some(&members),
            "tar round trip"
        );
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).expect("gzip");
        let gz = gz.finish().expect("gzip");
        assert_eq!(
            read_from(gz.as_slice()).ok().as_ref(),
            Some(&members),
            "tar.gz round trip"
        );
    }
    let Some(manifest) = members.get(MANIFEST_FILE) else {
        return;
    };
    let source = BundleSource::Archive("fuzz.tar".into());
    let read = |f: &str| {
        members
            .get(f)
            .cloned()
            .ok_or(FileError::NoMember)
    };
    if let Ok(bundle) = Bundle::from_parts(manifest, source, read) {
        for p in &bundle.manifest.phases {
            let bytes = members
                .get(&p.component)
                .expect("an accepted component is a member");
            assert_eq!(sha256_hex(bytes), p.sha256);
            assert_eq!(bundle.component(&p.name), Some(bytes.as_slice()));
        }
    }
});

/// The members as a tar archive the way `archive::write` makes one; `None` when a name cannot
/// be stored (the builder refuses it).
fn repack(members: &BTreeMap<String, Vec<u8>>) -> Option<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, bytes) in members {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, name, bytes.as_slice())
            .ok()?;
    }
    builder.into_inner().ok()
}
