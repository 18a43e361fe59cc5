//! Download benchmark (`cargo bench --bench download`): prints figures and a ratio, asserts
//! nothing about time.
//!
//! A 256 MiB artifact is served over loopback by a minimal HTTP server in this process and
//! fetched through `download.fetch` (the host code a phase's call reaches: stream, hash,
//! temp file, fsync, cache link, rename), compared with the `sha256sum` program hashing the
//! same bytes from a file in the page cache, in the same run. The ratio is
//! download throughput / sha256sum throughput; the goal is at least 0.9, i.e. verifying while
//! downloading costs about what checking a file that is already there costs.

use nodeward::audit::Redactor;
use nodeward::caps::PhaseCtx;
use nodeward::caps::RunContext;
use nodeward::grants::{DownloadGrant, FsGrant, Grants};
use nodeward::hostpath::{HostPath, HostRoot};
use nodeward::plan::RunMode;
use nodeward::wit::download::Host as _;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: usize = 256 << 20;
const RUNS: usize = 3;

fn mib_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Answers every request on `listener` with `body` (one request per connection).
fn serve(listener: TcpListener, body: Arc<Vec<u8>>, requests: usize) {
    for conn in listener.incoming().take(requests) {
        let Ok(conn) = conn else { continue };
        let mut reader = BufReader::new(match conn.try_clone() {
            Ok(c) => c,
            Err(_) => continue,
        });
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            line.clear();
        }
        let mut out: TcpStream = conn;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = out.write_all(head.as_bytes());
        let _ = out.write_all(&body);
        let _ = out.shutdown(std::net::Shutdown::Both);
    }
}

/// One download of the artifact into a fresh root beneath `base`, cache empty.
fn download_once(base: &Path, url: &str, digest: &str) -> Result<Duration, String> {
    let root = tempfile::tempdir_in(base).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(root.path().join("opt/bin")).map_err(|e| e.to_string())?;
    let mut session = RunContext::new(
        HostRoot::open(root.path()).map_err(|e| e.to_string())?,
        RunMode::Apply,
        Redactor::default(),
    );
    session.downloads.cache_dir =
        HostPath::parse("var/cache/artifacts").map_err(|e| e.to_string())?;
    let prefix = url.rsplit_once('/').map_or(url, |(p, _)| p);
    let mut ctx = PhaseCtx {
        phase: "bench".into(),
        bundle_digest: "bench".into(),
        grants: Arc::new(Grants {
            fs: FsGrant {
                read: vec![],
                write: vec!["opt/bin".into()],
            },
            download: DownloadGrant {
                urls: vec![format!("{prefix}/")],
                ..Default::default()
            },
            ..Grants::default()
        }),
        run: Arc::new(session),
        deadline: Instant::now() + Duration::from_secs(600),
        budget: Default::default(),
        pinned_artifacts: Default::default(),
        node_bridge: None,
    };
    let t = Instant::now();
    ctx.fetch(url.into(), digest.into(), "opt/bin/artifact".into(), 0o755)
        .map_err(|e| format!("{e:?}"))?;
    Ok(t.elapsed())
}

fn sha256sum_once(file: &Path, digest: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let out = Command::new("sha256sum")
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run sha256sum: {e}"))?;
    let elapsed = t.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.starts_with(digest) {
        return Err(format!("sha256sum disagrees: {text}"));
    }
    Ok(elapsed)
}

fn main() -> Result<(), String> {
    println!(
        "nodeward download benchmark (release build: {}), {} MiB, best of {RUNS}",
        !cfg!(debug_assertions),
        SIZE >> 20
    );
    let mut rng = fastrand::Rng::with_seed(0x6e6f_6465_7761_7264);
    let mut body = vec![0u8; SIZE];
    rng.fill(&mut body);
    let digest = hex::encode(Sha256::digest(&body));
    let body = Arc::new(body);

    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let file = tmp.path().join("artifact.bin");
    std::fs::write(&file, body.as_slice()).map_err(|e| e.to_string())?;

    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let url = format!("http://127.0.0.1:{port}/artifacts/artifact.bin");
    let targets: [(&str, &Path); 2] = [
        ("disk (fsync reaches the device)", tmp.path()),
        ("tmpfs /dev/shm (no device I/O)", Path::new("/dev/shm")),
    ];
    let requests = RUNS * targets.len();
    let server = {
        let body = body.clone();
        std::thread::spawn(move || serve(listener, body, requests))
    };

    let mut sum = Vec::new();
    sha256sum_once(&file, &digest)?; // warm the page cache
    for _ in 0..RUNS {
        sum.push(sha256sum_once(&file, &digest)?);
    }
    let sum_best = sum.iter().min().copied().unwrap_or_default();
    println!(
        "  sha256sum from disk (page cache)     {:>8.1} MiB/s  ({:.3} s)",
        mib_s(SIZE, sum_best),
        sum_best.as_secs_f64()
    );
    let mut own = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let bytes = std::fs::read(&file).map_err(|e| e.to_string())?;
        let got = hex::encode(Sha256::digest(&bytes));
        own.push(t.elapsed());
        if got != digest {
            return Err("sha2 disagrees".into());
        }
    }
    let own_best = own.iter().min().copied().unwrap_or_default();
    println!(
        "  sha2 crate (this build) from disk    {:>8.1} MiB/s  ({:.3} s)  (reference: hashing alone)",
        mib_s(SIZE, own_best),
        own_best.as_secs_f64()
    );
    for (name, base) in targets {
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            runs.push(download_once(base, &url, &digest)?);
        }
        let best = runs.iter().min().copied().unwrap_or_default();
        println!(
            "  download + verify, root on {name:<34} {:>8.1} MiB/s  ({:.3} s)  ratio vs sha256sum {:.2} (goal >= 0.9), vs sha2 alone {:.2}",
            mib_s(SIZE, best),
            best.as_secs_f64(),
            sum_best.as_secs_f64() / best.as_secs_f64(),
            own_best.as_secs_f64() / best.as_secs_f64()
        );
    }
    let _ = server.join();
    Ok(())
}
