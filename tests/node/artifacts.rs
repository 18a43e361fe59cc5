//! The upstream artifacts of a none node, made from the Debian packages on this machine.
//!
//! nodeward downloads containerd and the CNI plugins as upstream's tarballs and runc raw; the
//! tests must not fetch them from the internet, so [`packed`] packs the installed binaries into
//! the same layouts (`bin/<file>` and `./<plugin>`) once per test binary run, deterministically
//! (so their sha256 is stable across runs). [`serve_artifacts`] puts them, and a kubelet (the
//! real one or [`stub_kubelet`]), on an [`ArtifactServer`]; [`write_tgz`] and [`tgz_entries`]
//! are the tarball helpers the tests use to build and inspect archives of their own.

use super::artifact_server::{ArtifactServer, Download};
use super::sha256_hex;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

/// containerd's files, as in the upstream `containerd-<v>-linux-<arch>.tar.gz` (`bin/<file>`).
pub const CONTAINERD_FILES: &[&str] = &[
    "/usr/bin/containerd",
    "/usr/bin/containerd-shim-runc-v2",
    "/usr/bin/ctr",
];
/// runc, served raw like upstream's `runc.<arch>`.
pub const RUNC_FILE: &str = "/usr/sbin/runc";
/// The CNI plugins, as in upstream's `cni-plugins-linux-<arch>-v<v>.tgz` (`./<plugin>`).
pub const CNI_DIR: &str = "/usr/lib/cni";
/// The versions of the Debian packages above (what the config's `components` names).
pub const CONTAINERD_VERSION: &str = "1.6.20";
pub const RUNC_VERSION: &str = "1.1.5";
pub const CNI_PLUGINS_VERSION: &str = "1.1.1";

/// The artifacts in their upstream formats.
#[derive(Debug)]
pub struct Packed {
    pub containerd_tgz: PathBuf,
    pub runc: PathBuf,
    pub cni_tgz: PathBuf,
    /// The CNI plugin names in the tarball.
    pub cni_plugins: Vec<String>,
    /// Milliseconds this run spent packing (0 when the cache was valid).
    pub pack_ms: u128,
}

/// The packed artifacts, made once per test binary run and cached across runs under cargo's
/// per-target temp dir (`target/tmp/node-artifacts`), keyed by the source files' size and
/// mtime. The tarballs are deterministic (sorted entries, uid/gid 0, mtime 0), so their sha256
/// is the same on every run that packs the same files.
pub fn packed() -> &'static Packed {
    static PACKED: OnceLock<Packed> = OnceLock::new();
    PACKED.get_or_init(|| pack_into(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("node-artifacts")))
}

fn cni_sources() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(CNI_DIR)
        .unwrap_or_else(|e| panic!("{CNI_DIR}: {e} (apt-get install containernetworking-plugins)"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// A stamp of the inputs: path, size and mtime of each.
fn stamp(paths: &[PathBuf]) -> String {
    let mut s = String::from("v1\n");
    for p in paths {
        let m = std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e} (apt-get install containerd runc)", p.display()));
        s.push_str(&format!(
            "{} {} {}.{}\n",
            p.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    s
}

/// Packs into `dir` unless its stamp matches the sources.
pub fn pack_into(dir: &Path) -> Packed {
    let t = Instant::now();
    std::fs::create_dir_all(dir).expect("artifact cache dir");
    let containerd_src: Vec<PathBuf> = CONTAINERD_FILES.iter().map(PathBuf::from).collect();
    let cni_src = cni_sources();
    let mut all = containerd_src.clone();
    all.push(PathBuf::from(RUNC_FILE));
    all.extend(cni_src.iter().cloned());
    let stamp_text = stamp(&all);
    let packed = Packed {
        containerd_tgz: dir.join(format!(
            "containerd-{CONTAINERD_VERSION}-linux-amd64.tar.gz"
        )),
        runc: dir.join("runc.amd64"),
        cni_tgz: dir.join(format!(
            "cni-plugins-linux-amd64-v{CNI_PLUGINS_VERSION}.tgz"
        )),
        cni_plugins: cni_src
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect(),
        pack_ms: 0,
    };
    let stamp_file = dir.join("stamp");
    if std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp_text)
        && [&packed.containerd_tgz, &packed.runc, &packed.cni_tgz]
            .iter()
            .all(|p| p.is_file())
    {
        return packed;
    }
    let _ = std::fs::remove_file(&stamp_file);
    let containerd_entries: Vec<(String, PathBuf)> = containerd_src
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            (format!("bin/{name}"), p.clone())
        })
        .collect();
    write_tgz(&packed.containerd_tgz, Some("bin/"), &containerd_entries);
    let cni_entries: Vec<(String, PathBuf)> = cni_src
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            (format!("./{name}"), p.clone())
        })
        .collect();
    write_tgz(&packed.cni_tgz, Some("./"), &cni_entries);
    let tmp = packed.runc.with_extension("tmp");
    std::fs::copy(RUNC_FILE, &tmp).expect("copy runc");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod runc");
    std::fs::rename(&tmp, &packed.runc).expect("rename runc");
    std::fs::write(&stamp_file, stamp_text).expect("stamp");
    Packed {
        pack_ms: t.elapsed().as_millis(),
        ..packed
    }
}

/// A tar header with `name` written verbatim (the tar crate's `set_path` drops a leading `./`,
/// which upstream's CNI tarball has), owned by root, mtime 0.
fn header(name: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    let bytes = name.as_bytes();
    assert!(bytes.len() < 100, "short names only: {name}");
    h.as_gnu_mut().expect("gnu header").name[..bytes.len()].copy_from_slice(bytes);
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// Writes a deterministic tar.gz: the directory entry `dir` (if any), then `entries` (name in
/// the archive, source file) in order, each mode 0755, owned by root, mtime 0.
pub fn write_tgz(dest: &Path, dir: Option<&str>, entries: &[(String, PathBuf)]) {
    let tmp = dest.with_extension("tmp");
    let file = std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    // Level 1: these are test fixtures, ~100 MB of binaries; speed matters more than size.
    let gz =
        flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    if let Some(d) = dir {
        b.append(
            &header(d, tar::EntryType::Directory, 0o755, 0),
            std::io::empty(),
        )
        .expect("tar dir");
    }
    for (name, src) in entries {
        let f = std::fs::File::open(src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let len = f.metadata().expect("metadata").len();
        b.append(&header(name, tar::EntryType::Regular, 0o755, len), f)
            .unwrap_or_else(|e| panic!("tar {name}: {e}"));
    }
    let gz = b.into_inner().expect("finish tar");
    let w = gz.finish().expect("finish gzip");
    let f = w.into_inner().expect("flush");
    f.sync_all().expect("fsync tarball");
    std::fs::rename(&tmp, dest).expect("rename tarball");
}

/// The entries of a tar.gz: name → (mode, sha256 of the contents; empty for directories).
pub fn tgz_entries(path: &Path) -> BTreeMap<String, (u32, String)> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut a = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut out = BTreeMap::new();
    for e in a.entries().expect("tar entries") {
        let mut e = e.expect("tar entry");
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let mode = e.header().mode().expect("mode");
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).expect("tar contents");
        let sha = if e.header().entry_type().is_dir() {
            String::new()
        } else {
            sha256_hex(&bytes)
        };
        out.insert(name, (mode, sha));
    }
    out
}

/// The four `downloads` of a none node.
#[derive(Clone, Debug)]
pub struct Served {
    pub kubelet: Download,
    pub containerd: Download,
    pub runc: Download,
    pub cni_plugins: Download,
}

impl Served {
    /// `(name in the config's downloads map, download)`.
    pub fn entries(&self) -> [(&'static str, &Download); 4] {
        [
            ("kubelet", &self.kubelet),
            ("containerd", &self.containerd),
            ("runc", &self.runc),
            ("cni-plugins", &self.cni_plugins),
        ]
    }
}

/// Serves the packed artifacts and `kubelet` (the real one or [`stub_kubelet`]), raw.
pub fn serve_artifacts(server: &ArtifactServer, kubelet: &Path) -> Served {
    let p = packed();
    Served {
        kubelet: server.download("kubelet", kubelet),
        containerd: server.download(
            p.containerd_tgz.file_name().unwrap().to_str().unwrap(),
            &p.containerd_tgz,
        ),
        runc: server.download("runc.amd64", &p.runc),
        cni_plugins: server.download(p.cni_tgz.file_name().unwrap().to_str().unwrap(), &p.cni_tgz),
    }
}

/// The stub kubelet (`examples/stub_kubelet.rs`), which `cargo test` builds: a stand-in for the
/// kubelet used only in the crash-at-every-mutation loop.
pub fn stub_kubelet() -> PathBuf {
    // target/<profile>/deps/<test binary> → target/<profile>/examples/stub_kubelet
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let p = profile_dir.join("examples").join("stub_kubelet");
    assert!(
        p.is_file(),
        "{} missing: `cargo test` builds the examples; run `cargo build --examples`",
        p.display()
    );
    p
}
