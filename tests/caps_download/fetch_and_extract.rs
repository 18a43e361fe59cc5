//! `download.fetch-and-extract`: modes, links and `strip-components` of a good archive, and
//! hostile archives (`..`, absolute names, links out of the destination, writing through an
//! existing link) refused before anything is written.

use super::*;

/// Appends an entry with a raw header, bypassing `tar::Builder`'s own path checks, so hostile
/// names reach the archive.
fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
    name: &str,
    kind: tar::EntryType,
    link: Option<&str>,
    data: &[u8],
    mode: u32,
) {
    let mut h = tar::Header::new_gnu();
    let old = h.as_old_mut();
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        old.linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(kind);
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, data).expect("append");
}

/// An archive entry: name, type, link target, contents, mode.
pub type Spec<'a> = (&'a str, tar::EntryType, Option<&'a str>, &'a [u8], u32);

pub fn tgz(entries: &[Spec<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link, data, mode) in entries {
        raw_entry(&mut b, name, *kind, *link, data, *mode);
    }
    let tar = b.into_inner().expect("tar");
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&tar).expect("gz");
    gz.finish().expect("gz")
}

use tar::EntryType as T;

fn good_archive() -> Vec<u8> {
    tgz(&[
        ("cni-v1/", T::Directory, None, b"", 0o755),
        ("cni-v1/bin/", T::Directory, None, b"", 0o755),
        (
            "cni-v1/bin/bridge",
            T::Regular,
            None,
            b"\x7fELF bridge",
            0o755,
        ),
        ("cni-v1/README", T::Regular, None, b"read me\n", 0o644),
        ("cni-v1/bin/br", T::Symlink, Some("bridge"), b"", 0o777),
        (
            "cni-v1/docs/readme",
            T::Symlink,
            Some("../README"),
            b"",
            0o777,
        ),
        (
            "cni-v1/bin/bridge2",
            T::Link,
            Some("cni-v1/bin/bridge"),
            b"",
            0o755,
        ),
    ])
}

#[test]
fn extracts_with_modes_links_and_strip_components() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let url = server.url("/ok/cni.tgz");
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("extract");
    assert_eq!(got, Outcome::Created);
    let d = h.root.join("opt/pkg/cni");
    assert_eq!(
        tree(&d),
        vec![
            "README",
            "bin",
            "bin/br",
            "bin/bridge",
            "bin/bridge2",
            "docs",
            "docs/readme"
        ]
    );
    let mode = |p: &str| {
        std::fs::symlink_metadata(d.join(p))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("bin/bridge"), 0o755, "executables stay executable");
    assert_eq!(mode("README"), 0o644);
    assert_eq!(
        std::fs::read_link(d.join("bin/br")).expect("link"),
        Path::new("bridge")
    );
    assert_eq!(
        std::fs::read(d.join("docs/readme")).expect("via link"),
        b"read me\n"
    );
    assert_eq!(
        std::fs::read(d.join("bin/bridge2")).expect("hard link"),
        b"\x7fELF bridge"
    );
    assert!(
        tree(&h.root.join("opt/pkg"))
            .iter()
            .all(|p| p.starts_with("cni"))
    );

    // Everything in place: unchanged, from the cache, no request.
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("again");
    assert_eq!(got, Outcome::Unchanged);
    assert_eq!(server.hits("/ok/cni.tgz"), 1);

    // One file changed on disk: only it is rewritten.
    std::fs::write(d.join("README"), b"edited").expect("edit");
    let got = c
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("repair");
    assert_eq!(got, Outcome::Changed);
    assert_eq!(
        std::fs::read(d.join("README")).expect("readme"),
        b"read me\n"
    );
    assert_eq!(server.hits("/ok/cni.tgz"), 1);

    let kinds: Vec<_> = h.session.changes().into_iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), 2, "created, then repaired: {kinds:?}");

    // Plan mode over the same root, archive cached: exact, read-only, no request.
    let mut session = RunContext::new(
        HostRoot::open(&h.root).expect("root"),
        RunMode::Plan,
        Redactor::default(),
    );
    session.downloads.cache_dir = HostPath::parse(CACHE).expect("cache");
    let plan = Host {
        _tmp: tempfile::tempdir().expect("tmp"),
        root: h.root.clone(),
        session: Arc::new(session),
    };
    let mut p = ctx(&plan, grants(&server), Duration::from_secs(30));
    let got = p
        .fetch_and_extract(url.clone(), sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("plan in place");
    assert_eq!(got, Outcome::Unchanged);
    std::fs::remove_file(d.join("bin/bridge2")).expect("rm");
    let got = p
        .fetch_and_extract(url, sha(&archive), "opt/pkg/cni".into(), 1)
        .expect("plan repair");
    assert_eq!(got, Outcome::Changed);
    assert!(!d.join("bin/bridge2").exists(), "plan wrote nothing");
    assert_eq!(plan.session.changes().len(), 1);
    assert_eq!(server.hits("/ok/cni.tgz"), 1);
}

#[test]
fn extract_wrong_hash_fails_and_leaves_nothing() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/cni.tgz"),
            sha(b"other"),
            "opt/pkg/cni".into(),
            1,
        )
        .expect_err("mismatch");
    assert_eq!(err_kind(&e), "failed");
    assert!(!h.root.join("opt/pkg/cni").exists());
    assert!(
        tree(&h.root.join(CACHE)).iter().all(|p| p == "sha256"),
        "{:?}",
        tree(&h.root.join(CACHE))
    );
}

fn assert_refused(archive: Vec<u8>, strip: u32, why: &str) {
    let server = Server::start();
    server.script("/ok/evil.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let before = tree(&h.root);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/evil.tgz"),
            sha(&archive),
            "opt/pkg/evil".into(),
            strip,
        )
        .expect_err(why);
    assert_eq!(err_kind(&e), "failed", "{why}: {e:?}");
    assert!(message(&e).contains("refused"), "{why}: {e:?}");
    eprintln!("{why}: {}", message(&e));
    // Nothing written anywhere: not the destination, not outside it, not the cache entry.
    let after: Vec<_> = tree(&h.root)
        .into_iter()
        .filter(|p| !p.starts_with("var/cache"))
        .collect();
    assert_eq!(after, before, "{why}");
    assert!(
        tree(&h.root.join(CACHE)).iter().all(|p| p == "sha256"),
        "{why}: {:?}",
        tree(&h.root.join(CACHE))
    );
    assert!(h.session.changes().is_empty());
}

#[test]
fn archive_with_dotdot_is_refused() {
    assert_refused(
        tgz(&[
            ("pkg/ok", T::Regular, None, b"fine", 0o644),
            ("pkg/../../../etc/evil", T::Regular, None, b"evil", 0o644),
        ]),
        1,
        "dotdot",
    );
    assert_refused(
        tgz(&[("../evil", T::Regular, None, b"evil", 0o644)]),
        0,
        "leading dotdot",
    );
}

#[test]
fn archive_with_absolute_name_is_refused() {
    assert_refused(
        tgz(&[
            ("ok", T::Regular, None, b"fine", 0o644),
            ("/etc/evil", T::Regular, None, b"evil", 0o644),
        ]),
        0,
        "absolute",
    );
}

#[test]
fn archive_with_escaping_links_is_refused() {
    assert_refused(
        tgz(&[("pkg/esc", T::Symlink, Some("../../etc"), b"", 0o777)]),
        1,
        "symlink up and out",
    );
    assert_refused(
        tgz(&[("esc", T::Symlink, Some("/etc"), b"", 0o777)]),
        0,
        "absolute symlink",
    );
    assert_refused(
        tgz(&[
            ("d", T::Symlink, Some("."), b"", 0o777),
            ("up", T::Symlink, Some("d/.."), b"", 0o777),
        ]),
        0,
        "climbing out through another symlink",
    );
    assert_refused(
        tgz(&[
            ("link", T::Symlink, Some("sub"), b"", 0o777),
            ("link/file", T::Regular, None, b"through", 0o644),
        ]),
        0,
        "writing through a symlink",
    );
    assert_refused(
        tgz(&[("hard", T::Link, Some("../../etc/passwd"), b"", 0o644)]),
        0,
        "hard link out",
    );
    assert_refused(
        tgz(&[("hard", T::Link, Some("missing"), b"", 0o644)]),
        0,
        "hard link to nothing in the archive",
    );
    assert_refused(tgz(&[("dev", T::Char, None, b"", 0o644)]), 0, "device");
}

#[test]
fn extract_into_a_missing_parent_is_not_found() {
    let server = Server::start();
    let archive = good_archive();
    server.script("/ok/cni.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/cni.tgz"),
            sha(&archive),
            "opt/none/cni".into(),
            1,
        )
        .expect_err("no parent");
    assert_eq!(err_kind(&e), "not-found", "{e:?}");
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn archive_writing_through_an_existing_symlink_is_refused() {
    let server = Server::start();
    let archive = tgz(&[("sub/evil", T::Regular, None, b"evil", 0o644)]);
    server.script("/ok/evil.tgz", vec![ok(&archive)]);
    let h = host(RunMode::Apply);
    std::fs::create_dir_all(h.root.join("opt/pkg/evil")).expect("mkdir");
    // Within the host root, but outside the destination directory.
    std::os::unix::fs::symlink("../../../etc", h.root.join("opt/pkg/evil/sub")).expect("link");
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    let e = c
        .fetch_and_extract(
            server.url("/ok/evil.tgz"),
            sha(&archive),
            "opt/pkg/evil".into(),
            0,
        )
        .expect_err("through a symlink");
    assert_eq!(err_kind(&e), "failed", "{e:?}");
    assert!(message(&e).contains("existing symlink"), "{e:?}");
    assert!(!h.root.join("etc/evil").exists());
    assert!(tree(&h.root.join("etc")).is_empty());
}
