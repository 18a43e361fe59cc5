//! URL grants: `Grants::validate` on arbitrary `download.urls` lists and `Grants::may_download`
//! on arbitrary URLs (parsed as the download capability parses them, `url::Url::parse`).
//!
//! Input: `URL` or `URL\nGRANT\nGRANT...`.
//!
//! Invariants: a URL carrying credentials never matches, whatever the grants (even
//! `https://*:*/`); the decision is the OR of each grant alone; a grant that does not validate
//! matches nothing; a grant that matches has the URL's scheme and, unless its host is `*`,
//! the URL's host and port, and a path the URL's path starts with; `http(s)://*:*/` match
//! every http(s) URL with a host and no credentials.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nodeward::grants::{DownloadGrant, Grants};
use url::{Position, Url};

fn grants(urls: &[&str]) -> Grants {
    Grants {
        download: DownloadGrant {
            urls: urls.iter().map(|u| u.to_string()).collect(),
        },
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(s) = nodeward_fuzz::text(data) else {
        return;
    };
    let (u, list) = nodeward_fuzz::lines2(s);
    let Ok(url) = Url::parse(u) else {
        return;
    };
    let list: Vec<&str> = list.lines().collect();
    let all = grants(&list);
    let may = all.may_download(&url);
    let has_credentials = !url.username().is_empty() || url.password().is_some();
    if has_credentials {
        assert!(!may, "{url} carries credentials");
    }
    let mut any = false;
    for g in &list {
        let one = grants(&[g]);
        let valid = one.validate().is_ok();
        let m = one.may_download(&url);
        assert!(valid || !m, "invalid grant {g:?} matched {url}");
        any |= m;
        if m {
            check_match(g, &url);
        }
    }
    assert_eq!(may, any, "{url} against {list:?}");
    assert_eq!(
        all.validate().is_ok(),
        list.iter().all(|g| grants(&[g]).validate().is_ok())
    );

    let wild = grants(&["https://*:*/", "http://*:*/"]);
    wild.validate().expect("wildcards are valid grants");
    let web =
        matches!(url.scheme(), "http" | "https") && url.host_str().is_some_and(|h| !h.is_empty());
    assert_eq!(wild.may_download(&url), web && !has_credentials, "{url}");
    let mut with_user = url.clone();
    if with_user.set_username("user").is_ok() {
        assert!(!wild.may_download(&with_user) && !all.may_download(&with_user));
    }
    let mut with_password = url.clone();
    if with_password.set_password(Some("pw")).is_ok() {
        assert!(!wild.may_download(&with_password) && !all.may_download(&with_password));
    }
});

/// `grant` matched `url`: check that independently of the grant parser.
fn check_match(grant: &str, url: &Url) {
    let (scheme, rest) = grant.split_once("://").expect("a valid grant has ://");
    // The scheme as the URL parser reads it (it drops leading spaces, tabs and newlines).
    let scheme = Url::parse(&format!("{scheme}://h/")).expect("a valid grant's scheme");
    assert_eq!(url.scheme(), scheme.scheme(), "{grant} matched {url}");
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.starts_with('*') || authority.ends_with(":*") {
        return;
    }
    let g = Url::parse(grant).expect("a valid grant without * is a URL");
    assert_eq!(url.host_str(), g.host_str(), "{grant} matched {url}");
    assert_eq!(url.port_or_known_default(), g.port_or_known_default());
    assert!(url[Position::BeforePath..].starts_with(&g[Position::BeforePath..]));
}
