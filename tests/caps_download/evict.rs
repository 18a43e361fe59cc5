//! The artifact cache's eviction (`host/caps/download/evict.rs`): least recently used first
//! until under the cap, pinned entries never, leftover temp files by age, nothing followed;
//! and what marks an entry used (a cache hit of an apply).

use super::*;
use nodeward::caps::download::{EvictPolicy, Eviction, evict};
use std::collections::BTreeSet;
use std::time::SystemTime;

/// `n` seconds before now.
fn ago(n: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(n)
}

/// Puts `bytes` in the cache beneath `root` as its entry, last used at `used`; its digest.
fn put(root: &Path, bytes: &[u8], used: SystemTime) -> String {
    let dir = root.join(CACHE).join("sha256");
    std::fs::create_dir_all(&dir).expect("cache dir");
    let digest = sha(bytes);
    let f = std::fs::File::create(dir.join(&digest)).expect("entry");
    (&f).write_all(bytes).expect("write");
    f.set_modified(used).expect("mtime");
    digest
}

/// The entries left, sorted.
fn entries(root: &Path) -> Vec<String> {
    tree(&root.join(CACHE).join("sha256"))
}

fn run(h: &Host, max_bytes: u64, pinned: &[&str]) -> Eviction {
    let pinned: BTreeSet<String> = pinned.iter().map(|s| s.to_string()).collect();
    evict(
        h.session.root().dir(),
        &HostPath::parse(CACHE).expect("cache"),
        &EvictPolicy::with_max_bytes(max_bytes),
        &pinned,
        SystemTime::now(),
    )
    .expect("eviction")
}

#[test]
fn over_the_cap_the_least_recently_used_go_first_and_a_second_run_removes_nothing() {
    let h = host(RunMode::Apply);
    // Five 100-byte entries, used 5, 4, 3, 2 and 1 hours ago; named so that name order is not
    // age order.
    let d: Vec<String> = (0..5u8)
        .map(|i| put(&h.root, &[b'a' + i; 100], ago(3600 * (5 - u64::from(i)))))
        .collect();
    let e = run(&h, 250, &[]);
    assert_eq!(e.entries, 5);
    assert_eq!(e.bytes_before, 500);
    let evicted: Vec<&str> = e.evicted.iter().map(|x| x.sha256.as_str()).collect();
    assert_eq!(
        evicted,
        [&d[0], &d[1], &d[2]],
        "oldest first, until under the cap"
    );
    assert_eq!(e.bytes_after, 200);
    assert!(!e.over_cap);
    let mut left = vec![d[3].clone(), d[4].clone()];
    left.sort();
    assert_eq!(entries(&h.root), left);

    let again = run(&h, 250, &[]);
    assert!(again.evicted.is_empty(), "{again:?}");
    assert_eq!(again.bytes_after, 200);
    assert_eq!(entries(&h.root), left);

    // Under the cap, nothing goes however old.
    let e = run(&h, 200, &[]);
    assert!(e.evicted.is_empty());
}

#[test]
fn pinned_entries_stay_even_when_that_leaves_the_cache_over_its_cap() {
    let h = host(RunMode::Apply);
    let old_pinned = put(&h.root, &[b'p'; 300], ago(10 * 86400));
    let old = put(&h.root, &[b'o'; 100], ago(86400));
    let fresh_pinned = put(&h.root, &[b'f'; 300], ago(60));
    let e = run(&h, 100, &[&old_pinned, &fresh_pinned]);
    assert_eq!(e.pinned, 2);
    let evicted: Vec<&str> = e.evicted.iter().map(|x| x.sha256.as_str()).collect();
    assert_eq!(evicted, [old.as_str()], "only what is not pinned");
    assert!(e.over_cap, "600 pinned bytes over a 100-byte cap: {e:?}");
    assert_eq!(e.bytes_after, 600);
    let mut left = vec![old_pinned, fresh_pinned];
    left.sort();
    assert_eq!(entries(&h.root), left);
    // Pins mean the same next time: nothing more to do.
    let again = run(
        &h,
        100,
        &left.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(again.evicted.is_empty() && again.over_cap);
}

#[test]
fn links_planted_in_the_cache_are_never_followed() {
    let h = host(RunMode::Apply);
    let outside = h._tmp.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    let big = vec![b'x'; 10_000];
    std::fs::write(outside.join("big"), &big).expect("outside file");
    let kept = put(&h.root, b"a real entry", ago(3600));
    // An entry-named link to a file outside the root: not an entry, not counted, not removed,
    // its target untouched.
    let sha_dir = h.root.join(CACHE).join("sha256");
    let link = sha(&big);
    std::os::unix::fs::symlink(outside.join("big"), sha_dir.join(&link)).expect("link");
    let e = run(&h, 0, &[]);
    assert_eq!(e.entries, 1, "the link is not an entry: {e:?}");
    assert_eq!(e.evicted.len(), 1);
    assert_eq!(e.evicted[0].sha256, kept);
    assert!(sha_dir.join(&link).symlink_metadata().is_ok(), "link left");
    assert_eq!(std::fs::read(outside.join("big")).expect("target"), big);

    // `sha256/` itself a link to a directory of entries outside: refused, nothing removed.
    std::fs::remove_dir_all(&sha_dir).expect("rm");
    let elsewhere = outside.join("sha256");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join(sha(b"victim")), b"victim").expect("victim");
    std::os::unix::fs::symlink(&elsewhere, &sha_dir).expect("dir link");
    let pinned = BTreeSet::new();
    let err = evict(
        h.session.root().dir(),
        &HostPath::parse(CACHE).expect("cache"),
        &EvictPolicy::with_max_bytes(0),
        &pinned,
        SystemTime::now(),
    )
    .expect_err("a linked sha256/ is refused");
    assert!(err.to_string().contains("sha256"), "{err}");
    assert!(
        elsewhere.join(sha(b"victim")).is_file(),
        "nothing outside removed"
    );
}

#[test]
fn stale_temp_files_go_by_age_and_other_names_are_left_alone() {
    let h = host(RunMode::Apply);
    let entry = put(&h.root, b"entry", ago(60));
    let cache = h.root.join(CACHE);
    let sha_dir = cache.join("sha256");
    let stale = sha_dir.join(".nodeward-tmp.download.00000000000000aa");
    let fresh = sha_dir.join(".nodeward-tmp.download.00000000000000bb");
    let stale_top = cache.join(".nodeward-tmp.cache.00000000000000cc");
    for (p, age) in [(&stale, 7200), (&fresh, 10), (&stale_top, 7200)] {
        let f = std::fs::File::create(p).expect("temp");
        f.set_modified(ago(age)).expect("mtime");
    }
    std::fs::write(sha_dir.join("README"), "not an entry").expect("other file");
    let e = run(&h, 1 << 30, &[]);
    assert_eq!(
        e.temp_removed,
        vec![
            ".nodeward-tmp.cache.00000000000000cc".to_string(),
            "sha256/.nodeward-tmp.download.00000000000000aa".to_string()
        ]
    );
    assert_eq!(e.entries, 1, "README is neither counted nor removed");
    let mut left = vec![
        ".nodeward-tmp.download.00000000000000bb".to_string(),
        "README".to_string(),
        entry,
    ];
    left.sort();
    assert_eq!(entries(&h.root), left);
}

#[test]
fn a_missing_cache_is_empty() {
    let h = host(RunMode::Apply);
    let e = run(&h, 0, &[]);
    assert_eq!(e, Eviction::default());
}

#[test]
fn an_apply_served_from_the_cache_marks_the_entry_used() {
    let server = Server::start();
    let (a, b) = (b"artifact a".repeat(10), b"artifact b".repeat(10));
    server.script("/ok/a", vec![ok(&a)]);
    server.script("/ok/b", vec![ok(&b)]);
    let h = host(RunMode::Apply);
    let mut c = ctx(&h, grants(&server), Duration::from_secs(30));
    for (name, body) in [("a", &a), ("b", &b)] {
        c.fetch(
            server.url(&format!("/ok/{name}")),
            sha(body),
            format!("opt/bin/{name}"),
            0,
        )
        .expect("download");
    }
    // The cached entries are hard links to opt/bin/{a,b}; age them: a older than b.
    let entry = |d: &[u8]| h.root.join(CACHE).join("sha256").join(sha(d));
    for (d, age) in [(&a, 7200), (&b, 3600)] {
        let f = std::fs::File::options()
            .write(true)
            .open(entry(d))
            .expect("entry");
        f.set_modified(ago(age)).expect("mtime");
    }
    // An apply of `a` to a new place is a cache hit: `a` becomes the most recently used.
    c.fetch(server.url("/ok/a"), sha(&a), "opt/pkg/a".into(), 0)
        .expect("from the cache");
    assert_eq!(server.hits("/ok/a"), 1, "served from the cache");
    let used = std::fs::metadata(entry(&a))
        .expect("meta")
        .modified()
        .expect("mtime");
    assert!(used > ago(60), "marked used");
    let e = run(&h, a.len() as u64, &[]);
    let evicted: Vec<&str> = e.evicted.iter().map(|x| x.sha256.as_str()).collect();
    assert_eq!(
        evicted,
        [sha(&b).as_str()],
        "b is now the least recently used"
    );
}
