use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn scratch() -> (tempfile::TempDir, Dir) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = open_dir(tmp.path()).expect("open");
    (tmp, dir)
}

/// Every name directly in `path`, sorted.
fn names(path: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("lstat")
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn temp_names_follow_the_scheme() {
    let a = temp_name("state");
    assert!(a.starts_with(".nodeward-tmp.state."), "{a}");
    assert_eq!(a.len(), ".nodeward-tmp.state.".len() + 16);
    assert_ne!(a, temp_name("state"));
    assert!(is_temp_name(&a));
    assert!(!is_temp_name("nodeward-tmp.state.0"));
    assert!(!is_temp_name(".install-record.json.nodeward-0123"));
}

#[test]
fn write_file_replaces_with_the_mode_and_leaves_no_temp_file() {
    let (tmp, dir) = scratch();
    write_file(&dir, "config", b"one", 0o600, "write").expect("create");
    assert_eq!(
        std::fs::read(tmp.path().join("config")).expect("read"),
        b"one"
    );
    assert_eq!(mode(&tmp.path().join("config")), 0o600);
    write_file(&dir, "config", b"two", 0o755, "write").expect("replace");
    assert_eq!(
        std::fs::read(tmp.path().join("config")).expect("read"),
        b"two"
    );
    assert_eq!(mode(&tmp.path().join("config")), 0o755);
    assert_eq!(names(tmp.path()), ["config"]);
}

type Make = for<'d> fn(&'d Dir, &'static str) -> io::Result<TempFile<'d>>;

/// Both kinds of temp file, made one at a time: anonymous (where /tmp supports `O_TMPFILE`)
/// and named from the start (what other filesystems get).
const BOTH_KINDS: [Make; 2] = [anonymous_where_possible, named];

fn anonymous_where_possible<'d>(dir: &'d Dir, purpose: &'static str) -> io::Result<TempFile<'d>> {
    TempFile::new(dir, purpose)
}

fn named<'d>(dir: &'d Dir, purpose: &'static str) -> io::Result<TempFile<'d>> {
    TempFile::new_named(dir, purpose)
}

#[test]
fn a_persisted_temp_file_is_the_target_and_only_it_remains() {
    let (tmp, dir) = scratch();
    for (i, make) in BOTH_KINDS.iter().enumerate() {
        let mut t = make(&dir, "write").expect("temp file");
        t.file
            .write_all(format!("body {i}").as_bytes())
            .expect("write");
        t.finish(0o640).expect("finish");
        t.persist("target").expect("persist");
        let path = tmp.path().join("target");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            format!("body {i}")
        );
        assert_eq!(mode(&path), 0o640);
        assert_eq!(names(tmp.path()), ["target"]);
    }
}

#[test]
fn no_temp_file_is_left_after_an_error_or_a_drop() {
    let (tmp, dir) = scratch();
    std::fs::create_dir(tmp.path().join("a-directory")).expect("mkdir");
    for make in BOTH_KINDS {
        let mut t = make(&dir, "write").expect("temp file");
        t.file.write_all(b"x").expect("write");
        t.finish(0o644).expect("finish");
        // rename(2) of a file over a directory fails: the temp file must go.
        let e = t.persist("a-directory").expect_err("over a directory");
        assert!(e.kind() != io::ErrorKind::NotFound, "{e}");
        assert_eq!(names(tmp.path()), ["a-directory"]);
    }
    for make in BOTH_KINDS {
        let mut t = make(&dir, "write").expect("temp file");
        t.file.write_all(b"x").expect("write");
        drop(t);
    }
    assert_eq!(names(tmp.path()), ["a-directory"]);
    let e = write_file(&dir, "a-directory", b"x", 0o644, "write").expect_err("dir");
    assert!(e.kind() != io::ErrorKind::NotFound, "{e}");
    assert_eq!(names(tmp.path()), ["a-directory"]);
}

#[test]
fn a_named_temp_file_has_the_scheme_name_while_it_is_written() {
    let (tmp, dir) = scratch();
    let t = TempFile::new_named(&dir, "download").expect("named");
    let now = names(tmp.path());
    assert_eq!(now.len(), 1);
    assert!(now[0].starts_with(".nodeward-tmp.download."), "{now:?}");
    assert_eq!(mode(&tmp.path().join(&now[0])), 0o600);
    drop(t);
    assert!(names(tmp.path()).is_empty());
}

#[test]
fn a_temp_file_is_anonymous_while_it_is_written_where_the_filesystem_allows() {
    let (tmp, dir) = scratch();
    let supported = temp::anonymous(&dir).expect("probe").is_some();
    let mut t = TempFile::new(&dir, "download").expect("new");
    t.file.write_all(b"half a body").expect("write");
    // Killed now, a process would leave nothing here.
    assert_eq!(names(tmp.path()).is_empty(), supported);
    t.persist("artifact").expect("persist");
    assert_eq!(names(tmp.path()), ["artifact"]);
}

#[test]
fn link_into_gives_the_same_file_a_second_name() {
    let (tmp, dir) = scratch();
    std::fs::create_dir(tmp.path().join("cache")).expect("mkdir");
    let cache = open_dir(&tmp.path().join("cache")).expect("cache");
    for (i, make) in BOTH_KINDS.iter().enumerate() {
        let mut t = make(&dir, "download").expect("temp file");
        t.file.write_all(b"artifact").expect("write");
        t.finish(0o755).expect("finish");
        let entry = format!("entry-{i}");
        t.link_into(&cache, &entry, "cache").expect("link");
        t.persist("dest").expect("persist");
        let a = std::fs::metadata(tmp.path().join("dest")).expect("dest");
        let b = std::fs::metadata(tmp.path().join("cache").join(&entry)).expect("entry");
        assert_eq!(a.ino(), b.ino());
    }
    assert_eq!(names(tmp.path()), ["cache", "dest"]);
    assert_eq!(names(&tmp.path().join("cache")), ["entry-0", "entry-1"]);
}

#[test]
fn replace_symlink_swaps_the_link_and_leaves_no_temp_entry() {
    let (tmp, dir) = scratch();
    replace_symlink(&dir, "v1", "current").expect("create");
    replace_symlink(&dir, "v2", "current").expect("replace");
    let target = std::fs::read_link(tmp.path().join("current")).expect("link");
    assert_eq!(target.to_str(), Some("v2"));
    assert_eq!(names(tmp.path()), ["current"]);
}

#[test]
fn sweep_removes_only_the_schemes_entries_directly_in_the_directory_and_follows_no_link() {
    let (tmp, dir) = scratch();
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("precious"), "keep").expect("precious");
    let base = tmp.path();
    std::fs::write(base.join(".nodeward-tmp.state.0123456789abcdef"), "token").expect("f");
    std::os::unix::fs::symlink(
        outside.path().join("precious"),
        base.join(".nodeward-tmp.link.1111111111111111"),
    )
    .expect("link to a file outside");
    // A scheme-named directory (the store's staging) with a link out of it inside.
    let staging = base.join(".nodeward-tmp.stage.2222222222222222");
    std::fs::create_dir(&staging).expect("staging");
    std::fs::write(staging.join("manifest.toml"), "x").expect("in staging");
    std::os::unix::fs::symlink(outside.path(), staging.join("out")).expect("link out");
    // Not the scheme, or not directly in the directory: kept.
    for keep in ["keep", ".hidden", "nodeward-tmp.state.1", ".nodeward-tmp"] {
        std::fs::write(base.join(keep), "x").expect("keep");
    }
    std::fs::create_dir(base.join("sub")).expect("sub");
    std::fs::write(base.join("sub/.nodeward-tmp.write.3333333333333333"), "x").expect("deep");

    // Where a phase can write, a scheme-named directory is left: its depth is the phase's.
    let removed = sweep(&dir, TempDirs::Leave).expect("sweep leaving directories");
    assert_eq!(
        removed,
        [
            ".nodeward-tmp.link.1111111111111111",
            ".nodeward-tmp.state.0123456789abcdef",
        ]
    );
    assert!(staging.join("manifest.toml").exists());
    let removed = sweep(&dir, TempDirs::Remove).expect("sweep");
    assert_eq!(removed, [".nodeward-tmp.stage.2222222222222222"]);
    assert_eq!(
        names(base),
        [
            ".hidden",
            ".nodeward-tmp",
            "keep",
            "nodeward-tmp.state.1",
            "sub"
        ]
    );
    assert_eq!(
        names(&base.join("sub")),
        [".nodeward-tmp.write.3333333333333333"]
    );
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious")).expect("outside intact"),
        "keep"
    );
    assert!(sweep(&dir, TempDirs::Remove).expect("again").is_empty());
}

#[test]
fn sweep_path_of_a_missing_directory_is_empty() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert!(
        sweep_path(&tmp.path().join("missing"), TempDirs::Remove)
            .expect("missing")
            .is_empty()
    );
}

#[test]
fn a_second_holder_of_a_lock_is_refused_with_the_first_ones_pid() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("x.lock");
    let first = Lock::acquire(&path).expect("first");
    match Lock::acquire(&path) {
        Err(LockError::Held { holder, .. }) => {
            assert_eq!(holder, Some(std::process::id().to_string()));
        }
        other => panic!("expected Held, got {other:?}"),
    }
    drop(first);
    Lock::acquire(&path).expect("free again");
    let e = Lock::acquire(&tmp.path().join("missing/x.lock")).expect_err("no dir");
    assert!(matches!(e, LockError::Open { .. }), "{e}");
}

#[test]
fn a_lock_file_planted_as_a_link_is_never_written_through() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let precious = tmp.path().join("precious");
    std::fs::write(&precious, "keep\n").expect("precious");
    let hard = tmp.path().join("hard.lock");
    std::fs::hard_link(&precious, &hard).expect("planted hard link");
    let lock = Lock::acquire(&hard).expect("a hard link can still be flocked");
    assert_eq!(std::fs::read_to_string(&precious).expect("read"), "keep\n");
    drop(lock);
    let soft = tmp.path().join("soft.lock");
    std::os::unix::fs::symlink(&precious, &soft).expect("planted symlink");
    let e = Lock::acquire(&soft).expect_err("a symlink is not opened");
    assert!(matches!(e, LockError::Open { .. }), "{e}");
    assert_eq!(std::fs::read_to_string(&precious).expect("read"), "keep\n");
}

#[test]
fn sweep_never_removes_a_live_writers_temp_file() {
    let (tmp, dir) = scratch();
    // A live writer, between its named temp file and its rename.
    let mut live = TempFile::new_named(&dir, "ledger").expect("live");
    live.file.write_all(b"half").expect("write");
    // What a killed writer left: the same kind of file, its lock gone with its process.
    std::fs::write(
        tmp.path().join(".nodeward-tmp.ledger.00000000000000aa"),
        "x",
    )
    .expect("dead");
    let live_name = names(tmp.path())
        .into_iter()
        .find(|n| n != ".nodeward-tmp.ledger.00000000000000aa")
        .expect("the live one");
    assert!(held_by_a_writer(&dir, &live_name).expect("held?"));
    assert!(!held_by_a_writer(&dir, ".nodeward-tmp.ledger.00000000000000aa").expect("held?"));
    let removed = sweep(&dir, TempDirs::Remove).expect("sweep");
    assert_eq!(removed, [".nodeward-tmp.ledger.00000000000000aa"]);
    assert_eq!(names(tmp.path()), [live_name.as_str()]);
    live.finish(0o600).expect("finish");
    live.persist("daemon-operations.json")
        .expect("the live write completes");
    assert_eq!(names(tmp.path()), ["daemon-operations.json"]);
}

#[test]
fn sweep_state_dir_sweeps_the_directories_of_files_without_a_lock_and_no_other() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let outside = tmp.path().join("outside");
    for d in ["audit-heads", "downloads", "bundles"] {
        std::fs::create_dir_all(state.join(d)).expect("mkdir");
    }
    std::fs::create_dir_all(&outside).expect("outside");
    // A link where `compiled/` belongs is not followed.
    std::os::unix::fs::symlink(&outside, state.join("compiled")).expect("link");
    let leftovers = [
        ".nodeward-tmp.repave.0000000000000001",
        "audit-heads/.nodeward-tmp.audit.0000000000000002",
        "downloads/.nodeward-tmp.download.0000000000000003",
    ];
    let kept = [
        "daemon-operations.json",
        // The store's leftovers need its lock (links, staging directories).
        "bundles/.nodeward-tmp.history.0000000000000004",
    ];
    for rel in leftovers.iter().chain(&kept) {
        std::fs::write(state.join(rel), "x").expect("write");
    }
    std::fs::write(outside.join(".nodeward-tmp.compiled.0000000000000005"), "x").expect("out");
    let mut removed = sweep_state_dir(&state).expect("sweep");
    removed.sort();
    let mut want: Vec<String> = leftovers
        .iter()
        .map(|r| state.join(r).display().to_string())
        .collect();
    want.sort();
    assert_eq!(removed, want);
    for rel in kept {
        assert!(state.join(rel).exists(), "{rel}");
    }
    assert!(
        outside
            .join(".nodeward-tmp.compiled.0000000000000005")
            .exists()
    );
    assert!(
        sweep_state_dir(&tmp.path().join("missing"))
            .expect("missing")
            .is_empty()
    );
}
