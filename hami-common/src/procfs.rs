//! The one reader of the `/proc` fields both halves need, allocation-free: a process's
//! `stat` line (state, thread count, start time, `comm`) with the zombie rule, and the `NSpid`
//! line of its `status`. The preload reads them on its hot paths (a slot's liveness, its host
//! pid), the agent for every process it judges; both go through these parsers, so a tenant's
//! `comm` with spaces and parentheses or a pid namespace is read the same way on both sides.

/// The fields of a `/proc/<pid>/stat` line the project uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFields {
    /// State letter (field 3): `R`, `S`, `Z`, ...
    pub state: u8,
    /// Number of threads (field 20).
    pub num_threads: u64,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
    /// Where `comm` (field 2, the tenant's bytes) lies in the line: `line[comm.0..comm.1]`.
    pub comm: (usize, usize),
}

impl StatFields {
    /// Whether the process is gone in all but name: a zombie (or dead) whose last thread is
    /// gone. Its resources, GPU memory included, are released; a zombie leader with live
    /// threads still runs (`num_threads` counts them).
    pub fn is_dead(&self) -> bool {
        is_dead(self.state, self.num_threads)
    }
}

/// The zombie rule on a stat line's state letter and thread count (see
/// [`StatFields::is_dead`]).
pub fn is_dead(state: u8, num_threads: u64) -> bool {
    matches!(state, b'Z' | b'X') && num_threads <= 1
}

/// Parses a `/proc/<pid>/stat` line as the kernel writes it, `<pid> (<comm>) <state> ...`.
/// `comm` may hold spaces and parentheses, so the fields are counted from the last `)`.
/// `None` when the line does not read so or a needed field is missing or not a number.
pub fn parse_stat(line: &[u8]) -> Option<StatFields> {
    let open = line.iter().position(|&b| b == b'(')?;
    let close = line.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let rest = &line[close + 1..];
    let mut fields = rest
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    // Field 3 is the first after ')'.
    let state = *fields.next()?.first()?;
    let mut num_threads = None;
    let mut start_time = None;
    for (i, f) in fields.enumerate() {
        let field_no = i + 4;
        if field_no == 20 {
            num_threads = Some(parse_u64(f)?);
        } else if field_no == 22 {
            start_time = Some(parse_u64(f)?);
            break;
        }
    }
    Some(StatFields {
        state,
        num_threads: num_threads?,
        start_time: start_time?,
        comm: (open + 1, close),
    })
}

/// The `NSpid` entries of a `/proc/<pid>/status` text, outermost first: the pid in the pid
/// namespace of that `/proc` mount, then in each nested namespace down to the process's own.
/// Empty when there is no `NSpid` line (kernels before 4.1); stops at the first entry that
/// is not a number.
pub fn nspids(status: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let line = status
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"NSpid:"))
        .unwrap_or(&[]);
    line.split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .map_while(|f| u32::try_from(parse_u64(f)?).ok())
}

/// The first `NSpid` entry ([`nspids`]): the pid as that `/proc` mount names it.
pub fn first_nspid(status: &[u8]) -> Option<u32> {
    nspids(status).next()
}

/// The last `NSpid` entry ([`nspids`]): the pid in the process's own (innermost) namespace.
pub fn last_nspid(status: &[u8]) -> Option<u32> {
    nspids(status).last()
}

/// A decimal `u64` of ASCII digits only; `None` for anything else or an overflow.
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in s {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(comm: &str, state: char, threads: u64, start: u64) -> String {
        let mut f: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        f[20 - 4] = threads.to_string();
        f[22 - 4] = start.to_string();
        format!("4242 ({comm}) {state} {}\n", f.join(" "))
    }

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        for comm in ["python3", "a b) S 1 2 (c", ") (", "", "x\ny"] {
            let l = line(comm, 'S', 7, 123_456);
            let s = parse_stat(l.as_bytes()).unwrap_or_else(|| panic!("{comm:?}"));
            assert_eq!((s.state, s.num_threads, s.start_time), (b'S', 7, 123_456));
            assert_eq!(&l.as_bytes()[s.comm.0..s.comm.1], comm.as_bytes());
        }
        assert!(parse_stat(b"1234 (x) S 1 2").is_none(), "fields missing");
        assert!(parse_stat(b"no parenthesis at all").is_none());
        assert!(parse_stat(b"1 )x( S").is_none(), "')' before '('");
        let bad = line("x", 'S', 1, 5).replace(" 5\n", " 5x\n");
        assert!(parse_stat(bad.as_bytes()).is_none() || !bad.contains(" 5x"));
    }

    #[test]
    fn the_zombie_rule() {
        let st = |s: char, t: u64| parse_stat(line("x", s, t, 1).as_bytes()).unwrap();
        assert!(st('Z', 1).is_dead());
        assert!(st('X', 0).is_dead());
        assert!(
            !st('Z', 3).is_dead(),
            "a zombie leader with live threads runs"
        );
        assert!(!st('S', 1).is_dead());
    }

    #[test]
    fn nspid_entries_outermost_first() {
        let s = b"Name:\tx\nNSpid:\t31337\t12\t1\nVmRSS:\t1 kB\n";
        assert_eq!(nspids(s).collect::<Vec<_>>(), [31337, 12, 1]);
        assert_eq!((first_nspid(s), last_nspid(s)), (Some(31337), Some(1)));
        assert_eq!(first_nspid(b"Name:\tx\n"), None);
        assert_eq!(last_nspid(b"NSpid:\t\n"), None);
        assert_eq!(nspids(b"NSpid:\t5\tx\t7\n").collect::<Vec<_>>(), [5]);
        assert_eq!(first_nspid(b"NSpid:\t99999999999\n"), None, "not a pid");
    }
}
