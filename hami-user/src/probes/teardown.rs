//! Detaching the probes without making the agent wait.
//!
//! Closing a uprobe link is slow: the kernel releases its perf event under the global
//! `event_mutex` and, still holding it, waits for RCU grace periods
//! (`uprobe_unregister_sync`, then `tracepoint_synchronize_unregister`). Measured on the
//! 6.18 test machine: about 0.1 s per link, and closes made from several threads queue on
//! that mutex, so one libcuda (46 links) takes 4 to 5 s whichever way it is done; letting
//! the kernel close the fds at process exit is no faster (same path, one after another).
//!
//! [`ProbeLinks::detach_in_background`] therefore hands the links to a short-lived process:
//! it forks a keeper that holds the only remaining references, the agent closes its own
//! copies (cheap: not the last reference) and goes on, and the keeper exits, so the kernel
//! detaches the probes in the keeper's exit. Dropping a [`ProbeLinks`] detaches in this
//! process, from several threads (which still saves about a fifth).

use std::os::fd::RawFd;

/// Most threads a [`ProbeLinks`] drop starts.
const DETACH_THREADS: usize = 64;

/// Attached probe links taken out of [`Probes`](super::Probes) (see
/// [`Probes::take_links`](super::Probes::take_links)): the probes stay in the kernel until
/// this is dropped (detaches here, blocking) or [`ProbeLinks::detach_in_background`] is
/// called.
#[derive(Default)]
pub struct ProbeLinks {
    links: Vec<Box<dyn Send>>,
}

impl std::fmt::Debug for ProbeLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeLinks")
            .field("links", &self.links.len())
            .finish()
    }
}

impl ProbeLinks {
    pub(crate) fn new<T: Send + 'static>(links: Vec<T>) -> ProbeLinks {
        let mut l = ProbeLinks::default();
        l.extend(links);
        l
    }

    pub(crate) fn push<T: Send + 'static>(&mut self, link: T) {
        self.links.push(Box::new(link));
    }

    pub(crate) fn extend<T: Send + 'static>(&mut self, links: impl IntoIterator<Item = T>) {
        for l in links {
            self.push(l);
        }
    }

    /// Number of links (uprobes, uretprobes and the process-exit tracepoint).
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether there is nothing to detach.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// Detaches every probe now, in this process; returns when they are gone (about 0.1 s
    /// per link). Same as dropping.
    pub fn detach(self) {}

    /// Detaches every probe on a thread of its own and returns at once (for a process that
    /// goes on: the probes of one library, 4-5 s of the kernel's time, must not hold up
    /// its caller). Detached here, blocking, if no thread can be started.
    pub fn detach_in_thread(self) {
        if self.links.is_empty() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("hami-detach".into())
            .stack_size(256 << 10)
            .spawn(move || drop(self));
        if let Err(e) = spawned {
            // The failed spawn dropped the closure, and so the links: detached here.
            tracing::debug!(error = %e, "detach thread not started; detached inline");
        }
    }

    /// Detaches every probe without waiting: a forked keeper process takes over the links
    /// and exits, and the kernel detaches them in the keeper's exit, after this returns
    /// (for a few seconds the probes still run, into a ring buffer nobody reads). Returns
    /// `true` when handed off; `false` when it could not be (no fork, links that are not
    /// bpf_link fds as on kernels before 5.15): then they were detached here, as
    /// [`ProbeLinks::detach`] does. Meant for a process about to exit.
    pub fn detach_in_background(mut self) -> bool {
        if self.links.is_empty() {
            return true;
        }
        let Some((keep, highest)) = bpf_link_fds().filter(|(fds, _)| fds.len() >= self.links.len())
        else {
            tracing::debug!("probe links are not all bpf_link fds; detaching in process");
            return false;
        };
        match fork_keeper(keep, highest) {
            Some(release) => {
                // The keeper holds a reference to each link: these closes are cheap.
                self.links.clear();
                // Closing the pipe lets the keeper exit and the kernel detach.
                drop(release);
                true
            }
            None => false,
        }
    }
}

impl Drop for ProbeLinks {
    fn drop(&mut self) {
        drop_parallel(std::mem::take(&mut self.links));
    }
}

/// Drops `links` spread over up to [`DETACH_THREADS`] threads and returns when all are
/// gone. The kernel serialises most of the work (see the module docs), but the parts outside
/// its mutex overlap: 46 links took 3.9 s this way against 5.0 s one after another.
fn drop_parallel<T: Send + 'static>(links: Vec<T>) {
    if links.len() <= 1 {
        return;
    }
    let threads = links.len().min(DETACH_THREADS);
    let per = links.len().div_ceil(threads);
    let mut rest = links.into_iter();
    let mut handles = Vec::with_capacity(threads);
    loop {
        let chunk: Vec<T> = rest.by_ref().take(per).collect();
        if chunk.is_empty() {
            break;
        }
        let spawned = std::thread::Builder::new()
            .name("hami-detach".into())
            .stack_size(64 << 10)
            .spawn(move || drop(chunk));
        match spawned {
            Ok(h) => handles.push(h),
            // The failed spawn dropped the closure and so its chunk: detached here.
            Err(e) => tracing::debug!(error = %e, "detach thread not started; detached inline"),
        }
    }
    for h in handles {
        let _ = h.join();
    }
}

/// The fds of this process that are bpf links, and the highest open fd; `None` if
/// `/proc/self/fd` is unreadable.
fn bpf_link_fds() -> Option<(Vec<RawFd>, RawFd)> {
    let mut fds = Vec::new();
    let mut highest = 0;
    for e in std::fs::read_dir("/proc/self/fd").ok()? {
        let Ok(e) = e else { continue };
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<RawFd>().ok()) else {
            continue;
        };
        highest = highest.max(fd);
        if std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link") {
            fds.push(fd);
        }
    }
    Some((fds, highest))
}

/// An owned fd closed on drop.
struct Fd(RawFd);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the fd is owned by this value and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Forks (twice, so nobody has to reap it) a keeper process that keeps the fds in `keep`,
/// closes every other fd (those up to `highest` at least), and exits once the returned pipe
/// end is closed. `None` if pipe or fork failed (nothing was handed off).
fn fork_keeper(mut keep: Vec<RawFd>, highest: RawFd) -> Option<Fd> {
    let mut p: [libc::c_int; 2] = [-1; 2];
    // SAFETY: pipe2 writes two fds into the two-element array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let (read_end, write_end) = (Fd(p[0]), Fd(p[1]));
    keep.push(read_end.0);
    keep.sort_unstable();
    keep.dedup();
    let highest = highest.max(read_end.0).max(write_end.0) + 64;
    // SAFETY: fork in a multi-threaded process: the child calls only async-signal-safe
    // functions (fork, close, close_range, prctl, read, _exit) and allocates nothing.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above; `keeper` never returns.
        unsafe {
            let keeper_pid = libc::fork();
            if keeper_pid == 0 {
                keeper(&keep, read_end.0, highest);
            }
            // The keeper, if it started, is reparented to init; status 1 says it did not.
            libc::_exit(i32::from(keeper_pid < 0));
        }
    }
    drop(read_end);
    if pid < 0 {
        return None;
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
    (libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0).then_some(write_end)
}

/// Body of the keeper process (see [`fork_keeper`]): async-signal-safe calls only.
///
/// # Safety
/// Call only in a freshly forked child; `keep` is sorted and includes `read_end`.
unsafe fn keeper(keep: &[RawFd], read_end: RawFd, highest: RawFd) -> ! {
    let mut from: RawFd = 0;
    for &k in keep.iter().chain(std::iter::once(&RawFd::MAX)) {
        if k > from {
            close_range(from, k - 1, highest);
        }
        from = k.saturating_add(1);
    }
    // SAFETY: (the whole block) prctl reads a NUL-terminated name; read writes one byte into
    // a live local; _exit ends the process.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"hami-detach".as_ptr());
        let mut b = 0u8;
        loop {
            let n = libc::read(read_end, (&mut b as *mut u8).cast(), 1);
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        libc::_exit(0)
    }
}

/// Closes the fds `lo..=hi` (close_range, or one by one up to `highest` on kernels before
/// 5.9). Async-signal-safe.
fn close_range(lo: RawFd, hi: RawFd, highest: RawFd) {
    // SAFETY: close_range takes plain integers; closing fds this process owns.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            lo as libc::c_uint,
            hi as libc::c_uint,
            0,
        )
    };
    if r != 0 {
        for fd in lo..=hi.min(highest) {
            // SAFETY: closing an fd number; EBADF for unused ones is harmless.
            unsafe { libc::close(fd) };
        }
    }
}
