//! Liveness through pidfds.

use super::*;

use std::os::fd::RawFd;
use std::sync::Mutex;

/// The pidfd tests count the test process's pidfds: one at a time.
static PIDFD_TESTS: Mutex<()> = Mutex::new(());

fn pidfd_lock() -> std::sync::MutexGuard<'static, ()> {
    PIDFD_TESTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Pidfds open in this (test) process.
fn pidfds_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("pidfd"))
        })
        .count()
}

/// A real child process (`sleep`), killed and reaped when dropped.
struct Kid(std::process::Child);

impl Kid {
    fn spawn() -> Kid {
        Kid(std::process::Command::new("sleep")
            .arg("120")
            .spawn()
            .unwrap())
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL, then wait until it is a zombie (not reaped: its pid stays taken).
    fn kill_unreaped(&mut self) {
        self.0.kill().unwrap();
        let t0 = Instant::now();
        while !procinfo::read_stat(Path::new("/proc"), self.pid()).is_ok_and(|s| s.is_dead()) {
            assert!(t0.elapsed() < Duration::from_secs(10), "child not dead");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The runtime whose reactor watches the tests' pidfds (its worker waits in `epoll_wait`
/// when idle, as the agent's do).
fn test_rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_io()
            .build()
            .unwrap()
    })
}

impl Agent {
    /// Tests: watch through pidfds on a fake tree whose pids are real processes.
    fn force_exit_watch(&mut self) -> &mut pidfds::ExitWatch {
        self.exits
            .insert(pidfds::ExitWatch::new(test_rt().handle().clone()))
    }

    fn pidfd_of(&self, pid: u32) -> Option<RawFd> {
        self.entries.get(&pid)?.pidfd.as_ref().map(|p| p.raw())
    }

    /// Waits until the reactor has seen `pid`'s pidfd readable (moments after the kernel
    /// signalled the exit: the next tick then drops it).
    fn wait_exit_seen(&self, pid: u32) {
        let t0 = Instant::now();
        let p = self.entries[&pid].pidfd.as_ref().expect("watched");
        while p.exited() != Some(true) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "exit of {pid} not seen"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// An agent on this kernel's `/proc`, made inside [`test_rt`] (as the agent is made inside
/// its runtime).
fn real_agent() -> Agent {
    let _rt = test_rt().enter();
    Agent::new(AgentOptions {
        settle: Duration::from_millis(0),
        ..Default::default()
    })
}

#[test]
fn exit_watch_only_on_the_agents_own_procfs() {
    assert!(pidfds::is_own_procfs(Path::new("/proc")));
    let w = World::new();
    assert!(!pidfds::is_own_procfs(&w.root));
    // A fake tree's pids are not ours to open.
    assert!(w.agent(false).exits.is_none());
    assert!(real_agent().exits.is_some());
    // Outside a runtime: no reactor to watch pidfds, the stat path.
    let outside = Agent::new(AgentOptions::default());
    assert!(outside.exits.is_none());
    // Nor inside a current-thread runtime (its reactor runs only while it awaits).
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let _ct = ct.enter();
    assert!(Agent::new(AgentOptions::default()).exits.is_none());
}

#[test]
fn exited_process_is_dropped_on_the_next_tick_without_a_stat_read_of_the_others() {
    let _g = pidfd_lock();
    let mut kids: Vec<Kid> = (0..3).map(|_| Kid::spawn()).collect();
    let mut a = real_agent();
    for k in &kids {
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
        assert!(a.pidfd_of(k.pid()).is_some(), "pid {} watched", k.pid());
    }
    assert_eq!(a.process_count(), 3);
    a.tick(Instant::now());
    assert_eq!(a.process_count(), 3);
    procinfo::tests::take_stat_reads();
    a.tick(Instant::now());
    assert_eq!(
        procinfo::tests::take_stat_reads(),
        Vec::<u32>::new(),
        "a quiet tick reads no /proc/<pid>/stat"
    );
    kids[0].kill_unreaped();
    a.wait_exit_seen(kids[0].pid());
    a.tick(Instant::now());
    let reads = procinfo::tests::take_stat_reads();
    assert_eq!(
        a.process_count(),
        2,
        "the zombie is dropped on the next tick"
    );
    assert!(!a.entries.contains_key(&kids[0].pid()));
    let others = [kids[1].pid(), kids[2].pid()];
    assert!(
        !reads.iter().any(|p| others.contains(p)),
        "live processes' stat read: {reads:?}"
    );
}

#[test]
fn pidfds_are_closed_when_their_processes_go() {
    let _g = pidfd_lock();
    let before = pidfds_open();
    let mut kids: Vec<Kid> = (0..6).map(|_| Kid::spawn()).collect();
    let mut a = real_agent();
    for k in &kids {
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
    }
    assert_eq!(pidfds_open(), before + 6, "one pidfd per tracked process");
    // Three exit unseen (the pidfd notices), one through its exit event.
    for k in &mut kids[..3] {
        k.kill_unreaped();
        a.wait_exit_seen(k.pid());
    }
    a.on_event(&ev(EventKind::ProcessExit, kids[3].pid(), 0, 0, 0));
    kids[3].kill_unreaped();
    a.tick(Instant::now());
    assert_eq!(a.process_count(), 2);
    assert_eq!(pidfds_open(), before + 2);
    // Processes coming and going: the count does not grow.
    for _ in 0..5 {
        let mut k = Kid::spawn();
        a.on_event(&ev(EventKind::MemAlloc, k.pid(), MIB, 0x1000, 0));
        a.tick(Instant::now());
        assert_eq!(pidfds_open(), before + 3);
        k.kill_unreaped();
        a.wait_exit_seen(k.pid());
        drop(k);
        a.tick(Instant::now());
        assert_eq!(a.process_count(), 2);
        assert_eq!(pidfds_open(), before + 2);
    }
    drop(a);
    assert_eq!(pidfds_open(), before, "the agent closes its pidfds");
}

#[test]
fn pidfd_of_a_reused_pid_is_refused() {
    let _g = pidfd_lock();
    let kid = Kid::spawn();
    let w = World::new();
    w.spawn(kid.pid(), 7, true, "1g");
    let before = pidfds_open();
    let mut watch = pidfds::ExitWatch::new(test_rt().handle().clone());
    // The facts were read of a process that started at 42: the pid's process now started
    // at another time, so the pidfd names another process.
    assert!(watch.watch(&w.root, kid.pid(), Some(42)).is_none());
    assert_eq!(pidfds_open(), before, "refused pidfd closed");
    let p = watch
        .watch(&w.root, kid.pid(), Some(5000 + kid.pid() as u64))
        .expect("same start time");
    assert_eq!(p.start_time, 5000 + kid.pid() as u64);
    assert_eq!(pidfds_open(), before + 1);
}

#[test]
fn slot_of_an_older_process_with_a_watched_pid_is_reused_not_alive() {
    let _g = pidfd_lock();
    let kid = Kid::spawn();
    let pid = kid.pid();
    let w = World::new();
    w.spawn(pid, 7, true, "1g");
    let r = w.region(pid, 1 << 30, &[]);
    // The slot of an earlier process that had nspid 7 and died without releasing it.
    let old = r
        .register(ProcessId {
            pid: 7,
            start_time: 42,
        })
        .unwrap();
    r.try_charge(old, 0, UsageKind::Data, 64 * MIB).unwrap();
    let mut a = w.agent(false);
    a.force_exit_watch();
    a.on_event(&ev(EventKind::CtxSetCurrent, pid, 0, 0xc, 0));
    assert!(a.pidfd_of(pid).is_some());
    let out = a.tick(Instant::now());
    let l: Vec<SlotLiveness> = a.regions[0].liveness.values().cloned().collect();
    assert_eq!(
        l,
        vec![SlotLiveness::Reused {
            host_pid: pid,
            start_time: 5000 + pid as u64
        }]
    );
    assert!(
        kinds(&out.raised).contains(&(FindingKind::LeakedSlot, findings::reason::PID_REUSED)),
        "{:?}",
        out.raised
    );
}

#[test]
fn slot_of_a_watched_process_is_alive_without_a_stat_read_and_dead_on_the_tick_after_exit() {
    let _g = pidfd_lock();
    let mut kid = Kid::spawn();
    let pid = kid.pid();
    let w = World::new();
    w.spawn(pid, 7, true, "1g");
    let r = w.region(pid, 1 << 30, &[]);
    register(&r, pid, 7, 512 * MIB);
    let mut a = w.agent(false);
    a.force_exit_watch();
    a.on_event(&ev(EventKind::MemAlloc, pid, 512 * MIB, 0x7000, 0));
    assert!(a.pidfd_of(pid).is_some());
    procinfo::tests::take_stat_reads();
    assert!(a.tick(Instant::now()).raised.is_empty());
    assert!(
        !procinfo::tests::take_stat_reads().contains(&pid),
        "watched process's stat read"
    );
    assert_eq!(
        a.regions[0].liveness.values().cloned().collect::<Vec<_>>(),
        vec![SlotLiveness::Alive { host_pid: pid }]
    );
    // SIGKILL: no exit handler ran, no exit event; the slot still holds the memory. Found on
    // the very next tick, as with the stat path.
    kid.kill_unreaped();
    a.wait_exit_seen(pid);
    w.kill(pid);
    let out = a.tick(Instant::now());
    assert!(!a.entries.contains_key(&pid));
    assert_eq!(
        kinds(&out.raised),
        vec![(FindingKind::LeakedSlot, findings::reason::PROCESS_DEAD)]
    );
}

#[test]
fn without_pidfds_processes_keep_the_stat_path() {
    for errno in [libc::EMFILE, libc::ENOSYS, libc::ESRCH] {
        let w = World::new();
        w.spawn(100, 7, false, "1g");
        w.spawn(101, 8, false, "1g");
        let mut a = w.agent(false);
        a.force_exit_watch().fail_open = Some(errno);
        a.on_event(&ev(EventKind::MemAlloc, 100, MIB, 0x1000, 0));
        a.on_event(&ev(EventKind::MemAlloc, 101, MIB, 0x2000, 0));
        assert!(a.pidfd_of(100).is_none() && a.pidfd_of(101).is_none());
        procinfo::tests::take_stat_reads();
        a.tick(Instant::now());
        let mut reads = procinfo::tests::take_stat_reads();
        reads.sort();
        assert_eq!(reads, vec![100, 101], "errno {errno}: stat polled");
        w.kill(100);
        a.tick(Instant::now());
        assert_eq!(a.process_count(), 1, "errno {errno}: gone process dropped");
        assert!(a.entries.contains_key(&101));
    }
}
