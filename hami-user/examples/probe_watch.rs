//! Print what the libcuda probes see, one line per event, for checking the probes on a real
//! driver: `probe_watch [SECONDS] [LIBCUDA...]` (root). Discovery runs as in the agent
//! (ld.so.cache, well-known dirs, running processes); extra paths are attached too. Ends with
//! the attached files and the counters.

use std::path::PathBuf;
use std::time::Duration;

use hami_user::probes::{DiscoveryOptions, ProbeOptions, Probes};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let secs: u64 = match args.peek().and_then(|a| a.parse().ok()) {
        Some(s) => {
            args.next();
            s
        }
        None => 10,
    };
    let extra: Vec<PathBuf> = args.map(PathBuf::from).collect();
    let probes = Probes::load(&ProbeOptions::default())?;
    let (mut rx, handle) = probes.spawn(DiscoveryOptions {
        extra,
        ..Default::default()
    })?;
    for o in handle.rescan() {
        println!(
            "attached {} ({} probed, missing {:?})",
            o.path.display(),
            o.attached.len(),
            o.missing
        );
    }
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Some(ev)) => {
                println!(
                    "event kind={:?} tgid={} tid={} size={} addr={:#x} ctx={:#x} extra={}",
                    ev.kind, ev.tgid, ev.tid, ev.size, ev.addr, ev.ctx, ev.extra as i64
                );
            }
            Ok(None) => break,
            Err(_) => break,
        }
    }
    for l in handle.attached() {
        println!(
            "library {} dev={} ino={} symbols={}",
            l.path.display(),
            l.file_id.0,
            l.file_id.1,
            l.symbols.len()
        );
    }
    println!("counters {:?}", handle.counters());
    Ok(())
}
