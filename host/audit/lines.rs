//! Reading the trail's lines with a per-line cap: [`Lines`] (forward, for the readers), and
//! [`first_line`] and [`last_line`] (the writer's start and end of a file).
//!
//! # Background
//! The log is written by the agent, but a file beneath the host root can hold anything: a
//! 1 GiB "line", a file without a single newline. Readers stream the files line by line and
//! keep at most [`limits::MAX_LINE_BYTES`] of a line; a longer one is reported (its length)
//! and skipped, never held in memory. The writer reads back only the end of the active file,
//! and removes at most [`limits::MAX_TORN_BYTES`] of a torn last line.

use super::limits;
use super::trail::{TrailError, io_at};
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// One line as [`Lines`] read it.
#[derive(Debug)]
pub(crate) struct Line {
    /// Its number in the file, from 1.
    pub number: usize,
    /// Its bytes without the newline; `None` when it is longer than the cap.
    pub bytes: Option<Vec<u8>>,
    /// Its length in bytes without the newline.
    pub len: u64,
    /// Whether a newline ends it (the last line of a file may be torn).
    pub complete: bool,
}

/// The lines of a reader, each held only up to `cap` bytes.
pub(crate) struct Lines<R> {
    reader: BufReader<R>,
    cap: usize,
    number: usize,
    done: bool,
}

impl<R: io::Read> Lines<R> {
    /// The lines of `reader`, held up to `cap` bytes each.
    pub(crate) fn new(reader: R, cap: usize) -> Self {
        Lines {
            reader: BufReader::with_capacity(64 << 10, reader),
            cap,
            number: 0,
            done: false,
        }
    }

    fn read_line(&mut self) -> io::Result<Option<Line>> {
        let mut kept = Some(Vec::new());
        let mut len = 0u64;
        loop {
            let buf = self.reader.fill_buf()?;
            if buf.is_empty() {
                self.done = true;
                if len == 0 {
                    return Ok(None);
                }
                return Ok(Some(self.line(kept, len, false)));
            }
            let (piece, newline) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..i], true),
                None => (buf, false),
            };
            len += piece.len() as u64;
            if let Some(k) = &mut kept {
                if k.len() + piece.len() > self.cap {
                    kept = None;
                } else {
                    k.extend_from_slice(piece);
                }
            }
            let used = piece.len() + usize::from(newline);
            self.reader.consume(used);
            if newline {
                return Ok(Some(self.line(kept, len, true)));
            }
        }
    }

    fn line(&mut self, bytes: Option<Vec<u8>>, len: u64, complete: bool) -> Line {
        self.number += 1;
        Line {
            number: self.number,
            bytes,
            len,
            complete,
        }
    }
}

impl<R: io::Read> Iterator for Lines<R> {
    type Item = io::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        self.read_line().transpose()
    }
}

/// The first complete line of `file`, if it has one within the cap.
pub(crate) fn first_line(file: &File, path: &Path) -> Result<Option<Vec<u8>>, TrailError> {
    match Lines::new(file, limits::MAX_LINE_BYTES).next() {
        None => Ok(None),
        Some(Err(e)) => Err(io_at(path)(e)),
        Some(Ok(line)) if !line.complete => Ok(None),
        Some(Ok(line)) => line.bytes.map(Some).ok_or_else(|| TrailError::Tail {
            path: path.to_path_buf(),
            detail: format!(
                "its first line is longer than {} bytes",
                limits::MAX_LINE_BYTES
            ),
        }),
    }
}

/// The last complete line of `file` (`len` bytes) and, when the file does not end in a
/// newline, how many bytes follow that line (a torn record). A torn piece longer than
/// [`limits::MAX_TORN_BYTES`] is no torn record: an error, so the writer never cuts it.
pub(crate) fn last_line(
    file: &File,
    len: u64,
    path: &Path,
) -> Result<(Option<Vec<u8>>, Option<u64>), TrailError> {
    if len == 0 {
        return Ok((None, None));
    }
    let max_torn = limits::MAX_TORN_BYTES as u64;
    let window = len.min(max_torn + limits::MAX_LINE_BYTES as u64 + 2);
    let mut buf = vec![0u8; usize::try_from(window).map_err(|e| io_at(path)(io::Error::other(e)))?];
    file.read_exact_at(&mut buf, len - window)
        .map_err(io_at(path))?;
    let too_torn = |torn: u64| TrailError::Tail {
        path: path.to_path_buf(),
        detail: format!(
            "it ends in {torn} or more bytes without a line end: more than a record cut off \
             mid-write ({max_torn} bytes at most), so it is not removed"
        ),
    };
    let complete = match buf.iter().rposition(|b| *b == b'\n') {
        Some(i) => i,
        None if window == len && len <= max_torn => return Ok((None, Some(len))),
        None => return Err(too_torn(window)),
    };
    let torn = (buf.len() - complete - 1) as u64;
    if torn > max_torn {
        return Err(too_torn(torn));
    }
    let body = &buf[..complete];
    let start = body.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    if (start == 0 && window < len) || body.len() - start > limits::MAX_LINE_BYTES {
        return Err(TrailError::Tail {
            path: path.to_path_buf(),
            detail: format!(
                "its last line is longer than {} bytes",
                limits::MAX_LINE_BYTES
            ),
        });
    }
    Ok((Some(body[start..].to_vec()), (torn > 0).then_some(torn)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_over_the_cap_is_measured_not_kept() {
        let text = format!("a\n{}\nbc\ntorn", "x".repeat(100));
        let lines: Vec<Line> = Lines::new(text.as_bytes(), 10)
            .collect::<io::Result<_>>()
            .expect("lines");
        let seen: Vec<(usize, Option<&[u8]>, u64, bool)> = lines
            .iter()
            .map(|l| (l.number, l.bytes.as_deref(), l.len, l.complete))
            .collect();
        assert_eq!(
            seen,
            [
                (1, Some(&b"a"[..]), 1, true),
                (2, None, 100, true),
                (3, Some(&b"bc"[..]), 2, true),
                (4, Some(&b"torn"[..]), 4, false),
            ]
        );
    }

    #[test]
    fn a_torn_tail_over_the_cap_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("log");
        let small = "{\"seq\":1}\n{\"seq\":2}\n{\"se";
        std::fs::write(&path, small).expect("write");
        let f = File::open(&path).expect("open");
        let (last, torn) = last_line(&f, small.len() as u64, &path).expect("small");
        assert_eq!(last.as_deref(), Some(&b"{\"seq\":2}"[..]));
        assert_eq!(torn, Some(4));
        let big = format!("{{\"seq\":1}}\n{}", "y".repeat(limits::MAX_TORN_BYTES + 1));
        std::fs::write(&path, &big).expect("write");
        let f = File::open(&path).expect("open");
        let e = last_line(&f, big.len() as u64, &path).expect_err("too torn");
        assert!(e.to_string().contains("not removed"), "{e}");
    }
}
