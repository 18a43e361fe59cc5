//! `download.fetch-and-extract` is bounded: a gzip bomb, an archive over the unpacked-size
//! limit, too many entries, a megabyte-long entry name and a deadline that passes while
//! unpacking are each refused with a typed error naming the limit, and leave nothing in the
//! destination nor in the artifact cache.
//!
//! The archives are served by a real HTTP server on 127.0.0.1 (`tests/common/http.rs`) and fetched by the
//! agent's own client; the bomb goes through the real component boundary (the probe guest).

mod common;

use common::http::{HttpServer, Reply};
use flate2::Compression;
use flate2::write::GzEncoder;
use nodeward::audit::Redactor;
use nodeward::caps::RunContext;
use nodeward::caps::download::{ExtractBounds, ExtractLimits};
use nodeward::caps::{Error, PhaseCtx};
use nodeward::grants::{DownloadGrant, FsGrant, Grants};
use nodeward::hostpath::{HostPath, HostRoot};
use nodeward::plan::RunMode;
use nodeward::runtime::Limits;
use nodeward::wit::download::Host as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CACHE: &str = "var/cache/test-artifacts";

/// Serves `body` at every path until dropped.
fn serve(body: Vec<u8>) -> HttpServer {
    HttpServer::start(move |_| Reply::ok(&body))
}

struct Host {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    session: Arc<RunContext>,
}

fn host(limits: ExtractLimits) -> Host {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("opt/pkg")).expect("mkdir");
    let mut session = RunContext::new(
        HostRoot::open(&root).expect("root"),
        RunMode::Apply,
        Redactor::default(),
    );
    session.downloads.cache_dir = HostPath::parse(CACHE).expect("cache path");
    session.downloads.policy.extract = limits;
    Host {
        _tmp: tmp,
        root,
        session: Arc::new(session),
    }
}

fn grants(server: &HttpServer) -> Grants {
    Grants {
        fs: FsGrant {
            read: vec![],
            write: vec!["opt".into()],
        },
        download: DownloadGrant {
            urls: vec![server.url("/")],
            ..DownloadGrant::default()
        },
        ..Grants::default()
    }
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Every path beneath `dir` except the cache, sorted.
fn tree(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = common::snapshot(dir)
        .into_keys()
        .filter(|p| !p.starts_with("var"))
        .collect();
    out.sort();
    out
}

/// A tar entry header for `name` of `size` bytes (GNU long names as the builder writes them).
fn append(b: &mut tar::Builder<impl Write>, name: &str, size: u64, data: impl std::io::Read) {
    let mut h = tar::Header::new_gnu();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(0);
    b.append_data(&mut h, name, data).expect("append");
}

fn gzip_tar(build: impl FnOnce(&mut tar::Builder<GzEncoder<Vec<u8>>>)) -> Vec<u8> {
    let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::default()));
    build(&mut b);
    b.into_inner().expect("tar").finish().expect("gzip")
}

/// Extracts through `ctx`; the error it returns.
fn refused(h: &Host, server: &HttpServer, archive: &[u8], deadline: Duration) -> Error {
    let mut ctx = PhaseCtx {
        phase: "test".into(),
        bundle_digest: "test".into(),
        grants: Arc::new(grants(server)),
        run: h.session.clone(),
        deadline: Instant::now() + deadline,
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    };
    ctx.fetch_and_extract(server.url("/a.tgz"), sha(archive), "opt/pkg/a".into(), 0)
        .expect_err("extraction refused")
}

/// Nothing was written outside the cache, and the refused archive is not cached either.
fn assert_nothing_left(h: &Host) {
    assert_eq!(tree(&h.root), ["opt", "opt/pkg"]);
    let cache = h.root.join(CACHE).join("sha256");
    let cached: Vec<_> = std::fs::read_dir(&cache)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(cached.is_empty(), "cache holds {cached:?}");
    assert!(h.session.changes().is_empty());
}

#[test]
fn a_gzip_bomb_is_refused_at_the_ratio_limit_through_the_guest() {
    // 2 GiB of zeros in one entry: about 2 MiB of .tar.gz.
    let size = 2u64 << 30;
    let bomb = gzip_tar(|b| {
        append(
            b,
            "zeros",
            size,
            std::io::Read::take(std::io::repeat(0), size),
        )
    });
    let server = serve(bomb.clone());
    let h = host(ExtractLimits::default());
    let loaded = common::load_guest(
        nodeward::built::TEST_GUEST_PROBE_COMPONENT,
        "probe",
        "probe",
    );
    let ctx = PhaseCtx {
        phase: "probe".into(),
        bundle_digest: "test".into(),
        grants: Arc::new(grants(&server)),
        run: h.session.clone(),
        deadline: Instant::now() + Duration::from_secs(120),
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    };
    let calls = json!([{"op": "download.fetch-and-extract", "url": server.url("/bomb.tgz"),
                        "sha256": sha(&bomb), "dest-dir": "opt/pkg/bomb"}]);
    let report = common::runtime()
        .run(
            &loaded,
            ctx,
            &calls.to_string(),
            Limits {
                deadline: Duration::from_secs(120),
                ..Limits::default()
            },
        )
        .expect("probe runs");
    let results: Vec<Value> = serde_json::from_str(&report.summary).expect("summary");
    assert_eq!(results[0]["err"]["kind"], "failed", "{results:?}");
    let message = results[0]["err"]["message"].as_str().expect("message");
    assert!(
        message.contains("unpacks to more than 200 times its compressed size (the ratio limit")
            && message.ends_with("nothing was extracted"),
        "{message}"
    );
    eprintln!("{} byte bomb: {message}", bomb.len());
    assert_nothing_left(&h);
}

/// `n` bytes that do not compress.
fn noise(n: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(7);
    (0..n).map(|_| rng.u8(..)).collect()
}

#[test]
fn an_archive_over_the_unpacked_size_limit_is_refused() {
    let data = noise(3 << 20);
    let archive = gzip_tar(|b| {
        append(b, "a", data.len() as u64, &data[..]);
        append(b, "b", data.len() as u64, &data[..]);
    });
    let server = serve(archive.clone());
    let h = host(ExtractLimits {
        max_unpacked_bytes: 4 << 20,
        ..ExtractLimits::default()
    });
    let e = refused(&h, &server, &archive, Duration::from_secs(60));
    assert!(
        matches!(&e, Error::Failed(m) if m.contains("unpacks to more than 4194304 bytes (the unpacked size limit)")),
        "{e:?}"
    );
    assert_nothing_left(&h);
}

#[test]
fn an_archive_with_too_many_entries_is_refused() {
    let archive = gzip_tar(|b| {
        for i in 0..11 {
            append(b, &format!("f{i}"), 1, &b"x"[..]);
        }
    });
    let server = serve(archive.clone());
    let h = host(ExtractLimits {
        max_entries: 10,
        ..ExtractLimits::default()
    });
    let e = refused(&h, &server, &archive, Duration::from_secs(60));
    assert!(
        matches!(&e, Error::Failed(m) if m.contains("has more than 10 entries (the entry limit)")),
        "{e:?}"
    );
    assert_nothing_left(&h);
}

#[test]
fn a_megabyte_long_entry_name_is_refused_before_it_is_kept() {
    // The tar reader keeps a GNU long name in memory whole: 2 MiB of name, compressing well.
    let name = format!("{}/f", "d".repeat(2 << 20));
    let archive = gzip_tar(|b| append(b, &name, 1, &b"x"[..]));
    let server = serve(archive.clone());
    let h = host(ExtractLimits::default());
    let e = refused(&h, &server, &archive, Duration::from_secs(60));
    assert!(
        matches!(&e, Error::Failed(m) if m.contains("bytes of headers, long names or skipped data before one entry")),
        "{e:?}"
    );
    assert_nothing_left(&h);
}

#[test]
fn a_deadline_that_passes_while_unpacking_stops_it() {
    let archive = gzip_tar(|b| append(b, "f", 1, &b"x"[..]));
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("a.tgz"), &archive).expect("write archive");
    std::fs::create_dir(tmp.path().join("dest-parent")).expect("mkdir");
    let root = cap_std::fs::Dir::open_ambient_dir(tmp.path(), cap_std::ambient_authority())
        .expect("open temp dir");
    let mut file = root.open("a.tgz").expect("open archive");
    let url = url::Url::parse("http://127.0.0.1/a.tgz").expect("url");
    let e = nodeward::caps::download::extract(
        &root,
        &mut file,
        &HostPath::parse("dest-parent/dest").expect("path"),
        0,
        &url,
        false,
        &nodeward::audit::Redactor::default(),
        ExtractBounds {
            limits: ExtractLimits::default(),
            deadline: Instant::now(),
        },
    )
    .map_err(Error::from)
    .expect_err("past the deadline");
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("the phase deadline passed while unpacking it; nothing was extracted")),
        "{e:?}"
    );
    assert!(!tmp.path().join("dest-parent/dest").exists());
}
