//! Artifact cache eviction benchmark (`cargo bench --bench evict`): prints how long
//! `caps::download::evict` takes over caches of 1,000 and 10,000 entries (half of them evicted,
//! a tenth pinned), and how long a second run that has nothing to evict takes; asserts nothing
//! about time. A real cache holds a few dozen entries; the figures bound what eviction adds to
//! the end of a bootstrap or upgrade.

use nodeward::caps::download::{EvictPolicy, evict};
use nodeward::hostpath::{HostPath, HostRoot};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

const ENTRY_BYTES: u64 = 4096;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "artifact cache eviction (release build: {}); {ENTRY_BYTES}-byte entries on the disk of \
         the temp dir",
        !cfg!(debug_assertions)
    );
    for n in [1_000u64, 10_000] {
        let tmp = tempfile::tempdir()?;
        let cache = tmp.path().join("var/lib/nodeward/artifacts/sha256");
        std::fs::create_dir_all(&cache)?;
        let mut pinned = BTreeSet::new();
        let now = SystemTime::now();
        for i in 0..n {
            let name = hex::encode(Sha256::digest(i.to_le_bytes()));
            let f = std::fs::File::create(cache.join(&name))?;
            f.set_len(ENTRY_BYTES)?;
            f.set_modified(now - Duration::from_secs(n - i))?;
            if i % 10 == 0 {
                pinned.insert(name);
            }
        }
        let root = HostRoot::open(tmp.path())?;
        let dir = HostPath::parse("var/lib/nodeward/artifacts")?;
        let policy = EvictPolicy::with_max_bytes(n / 2 * ENTRY_BYTES);
        let started = Instant::now();
        let e = evict(root.dir(), &dir, &policy, &pinned, SystemTime::now())?;
        let first = started.elapsed();
        let started = Instant::now();
        let again = evict(root.dir(), &dir, &policy, &pinned, SystemTime::now())?;
        let second = started.elapsed();
        println!(
            "{n:>6} entries: evicted {} in {:.1} ms ({:.1} µs per entry listed); a second run \
             evicting {} took {:.1} ms",
            e.evicted.len(),
            first.as_secs_f64() * 1e3,
            first.as_secs_f64() * 1e6 / n as f64,
            again.evicted.len(),
            second.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
