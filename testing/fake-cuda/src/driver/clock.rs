//! Simulated device time: kernel durations, stream and context tails, events, graphs and
//! the bounded launch queue. The device schedule itself is shared by every process
//! (`fake_state::Shared::schedule`); the process-local part is `timeline.rs`'s `Timeline`, which
//! the calls here move.
//!
//! Model (see `docs/fake-driver.md`): a device runs one piece of work at a time, across all
//! processes and streams, in submission order (with `FAKE_CUDA_STREAM_LANES` > 1 up to that
//! many of one process's submissions at once: [`stream_lanes`]). A submission of `d` ns starts
//! at `max(now, its stream's tail, the device's tail)`; an event recorded on a stream completes
//! at `max(now, the stream's tail, the device's tail)`.

use std::sync::MutexGuard;

use fake_state::now_ns;

use super::timeline::*;
use super::{inited, Inner, Owner};
use crate::ffi::*;

impl Inner {
    /// The clock's key, context and physical device of stream `s` (`ptsz`: called through a
    /// `_ptsz` entry point, where the NULL stream is the per-thread stream).
    pub fn stream_key(&self, s: u64, ptsz: bool) -> R<(StreamKey, u64, usize)> {
        self.check_stream(s)?;
        let (ctx, key) = if s == CU_STREAM_PER_THREAD as u64 || (s == 0 && ptsz) {
            let (c, _) = self.current()?;
            (c, (c, CU_STREAM_PER_THREAD as u64, thread_id()))
        } else if s == 0 || s == CU_STREAM_LEGACY as u64 {
            let (c, _) = self.current()?;
            (c, (c, 0, 0))
        } else {
            let c = *self.streams.get(&s).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            (c, (c, s, 0))
        };
        Ok((key, ctx, self.ctx(ctx)?.phys))
    }

    /// Records the kernel duration of a just-loaded module or library.
    pub fn set_module_time(&mut self, module: u64, t: KernelTime) {
        if t != KernelTime::Default {
            self.clock.modules.insert(module, t);
        }
    }

    /// Duration of one launch of function or kernel `f`; `first_param` reads the launch's
    /// first kernel parameter (only called for `ns=param` modules; `None` = no parameters:
    /// the default duration).
    pub fn kernel_ns(&self, f: u64, first_param: impl FnOnce() -> Option<u64>) -> u64 {
        let module = match self.functions.get(&f) {
            Some(Owner::Function(m)) | Some(Owner::Kernel(m)) => *m,
            None => return default_kernel_ns(),
        };
        match self.clock.modules.get(&module) {
            Some(KernelTime::Fixed(n)) => *n,
            Some(KernelTime::Param) => first_param().unwrap_or_else(default_kernel_ns),
            _ => default_kernel_ns(),
        }
    }

    /// Submits `dur` ns of work on stream `s` now, or says until when the stream's queue is
    /// full (`Err(Ok(t))`). `Err(Err(code))`: a bad stream.
    ///
    /// `waited`: this launch already slept for room until that instant. A real driver would
    /// have queued it then (its queue is deep; the fake's is kept short for fairness), so it
    /// is booked as from then, even if the host woke up later (the device would not have
    /// idled for the host's lateness), and an event recorded just before it still marks its
    /// start.
    fn try_submit(
        &mut self,
        s: u64,
        ptsz: bool,
        dur: u64,
        waited: Option<u64>,
    ) -> Result<(u64, u64), R<u64>> {
        if self.is_capturing(s) {
            *self.clock.capture.entry(s).or_default() += dur;
            return Ok((0, 0));
        }
        if dur == 0 {
            // Work of no length would start and end at max(now, stream tail, device tail):
            // never later than anything recorded or synchronised after it, so nothing moves.
            return Ok((0, 0));
        }
        let (key, ctx, phys) = self.stream_key(s, ptsz).map_err(Err)?;
        let now = now_ns();
        let depth = queue_depth();
        let q = self.clock.pending.entry(phys).or_default();
        while q.front().is_some_and(|&e| e <= now) {
            q.pop_front();
        }
        if q.len() >= depth {
            return Err(Ok(q.front().copied().unwrap_or(now)));
        }
        let ahead = queue_ahead_ns();
        if let Some(&last) = q.back() {
            if last > now.saturating_add(ahead) {
                return Err(Ok(last - ahead));
            }
        }
        let from = waited.map_or(now, |w| w.min(now));
        let earliest = from.max(self.clock.streams.get(&key).map_or(0, |c| c.tail));
        let (start, end) =
            self.shared()
                .schedule_lanes(phys, self.slot, earliest, dur, stream_lanes());
        self.clock.pending.entry(phys).or_default().push_back(end);
        if let Some(list) = self.clock.markers.remove(&key) {
            for e in list {
                if let Some(ev) = self.clock.events.get_mut(&e) {
                    if let Some((_, at_min)) = ev.open.filter(|o| o.0 == key) {
                        // Within one queue horizon of the marker's instant: the host was
                        // late by less than the work a real driver's deeper queue would
                        // have held; the launch still follows the marker directly.
                        let grace = queue_ahead_ns();
                        let follows = waited.is_some() || now <= at_min.saturating_add(grace);
                        ev.at = Some(if follows { start } else { at_min });
                        ev.open = None;
                    }
                }
            }
        }
        let st = self.clock.streams.entry(key).or_default();
        st.tail = st.tail.max(end);
        st.after_submission = true;
        let t = self.clock.ctx_tail.entry(ctx).or_default();
        *t = (*t).max(end);
        Ok((start, end))
    }

    /// The instant stream `s`'s work completes: its tail; the NULL (legacy) stream
    /// synchronises with the whole context, as the legacy stream waits for every blocking
    /// stream.
    pub fn stream_done_at(&self, s: u64, ptsz: bool) -> R<u64> {
        let (key, ctx, _) = self.stream_key(s, ptsz)?;
        if key.1 == 0 {
            return Ok(self.ctx_done_at(ctx));
        }
        Ok(self.clock.streams.get(&key).map(|c| c.tail).unwrap_or(0))
    }

    /// The instant every submission of context `ctx` completes.
    pub fn ctx_done_at(&self, ctx: u64) -> u64 {
        self.clock.ctx_tail.get(&ctx).copied().unwrap_or(0)
    }

    /// Forgets a destroyed stream's queue (its work still completes on the device).
    pub fn clock_stream_destroyed(&mut self, s: u64) {
        self.clock.streams.retain(|k, _| k.1 != s);
        self.clock.capture.remove(&s);
    }

    /// `cuEventCreate` flags, checked: only `BLOCKING_SYNC`, `DISABLE_TIMING` and
    /// `INTERPROCESS` (with `DISABLE_TIMING`) exist.
    pub fn check_event_flags(flags: u32) -> R<()> {
        let known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
        if flags & !known != 0
            || (flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    /// Remembers a new event's flags.
    pub fn event_created(&mut self, h: u64, flags: u32) {
        self.clock.events.insert(
            h,
            EventClock {
                flags,
                ..Default::default()
            },
        );
    }

    /// Forgets a destroyed event.
    pub fn clock_event_destroyed(&mut self, h: u64) {
        self.clock.events.remove(&h);
    }

    /// `cuEventRecord(_ptsz)`: the event completes when the stream's work before it has
    /// completed and the device has finished what was submitted before it, or, if the
    /// stream's next submission comes before then, when that submission starts
    /// ([`EventClock::open`]). Recording into a stream being captured records nothing.
    pub fn event_record(&mut self, e: u64, s: u64, ptsz: bool) -> R<()> {
        self.check_event(e)?;
        let (key, _, phys) = self.stream_key(s, ptsz)?;
        if self.is_capturing(s) {
            return Ok(());
        }
        let tail = if key.1 == 0 {
            self.ctx_done_at(key.0)
        } else {
            self.clock.streams.get(&key).map(|c| c.tail).unwrap_or(0)
        };
        let st = self.clock.streams.entry(key).or_default();
        let after_submission = std::mem::take(&mut st.after_submission);
        let now = now_ns();
        // Right after a kernel still queued: the marker completes with it. Otherwise (after
        // another marker, or on an idle stream) it completes when the stream's work is done
        // and the device reaches it, or when the next submission starts if that comes first.
        let (fixed, at) = if tail > now && after_submission {
            (true, tail)
        } else if tail > now {
            (false, tail)
        } else {
            let at = now.max(self.shared().device_tail(phys));
            (at <= now, at)
        };
        let ev = self.clock.events.entry(e).or_default();
        if fixed {
            ev.at = Some(at);
            ev.open = None;
        } else {
            ev.at = None;
            ev.open = Some((key, at));
            // Only the events still open on this stream stay listed (an event fixed since, or
            // re-recorded elsewhere, drops out), so the list cannot grow without bound.
            let events = &self.clock.events;
            let list = self.clock.markers.entry(key).or_default();
            list.retain(|x| {
                *x != e
                    && events
                        .get(x)
                        .is_some_and(|v| v.open.is_some_and(|o| o.0 == key))
            });
            list.push(e);
        }
        Ok(())
    }

    /// Events listed as open, all streams together (for tests).
    #[cfg(test)]
    pub fn open_marker_count(&self) -> usize {
        self.clock.markers.values().map(Vec::len).sum()
    }

    /// `cuStreamWaitEvent(_ptsz)`: stream `s`'s later work starts after event `e` completes
    /// (an event still open: after its earliest instant; the device is serial anyway).
    /// Waiting on a never-recorded event, or in a stream being captured, changes nothing.
    pub fn stream_wait_event(&mut self, s: u64, e: u64, ptsz: bool) -> R<()> {
        self.check_event(e)?;
        let (key, ctx, _) = self.stream_key(s, ptsz)?;
        if self.is_capturing(s) {
            return Ok(());
        }
        let at = match self.clock.events.get(&e) {
            Some(EventClock { at: Some(t), .. }) => *t,
            Some(EventClock {
                open: Some((_, t)), ..
            }) => *t,
            _ => return Ok(()),
        };
        let st = self.clock.streams.entry(key).or_default();
        st.tail = st.tail.max(at);
        st.after_submission = false;
        let t = self.clock.ctx_tail.entry(ctx).or_default();
        *t = (*t).max(at);
        Ok(())
    }

    /// When event `e` completes (`None`: never recorded, complete). An open event (recorded
    /// behind queued work, its stream's next submission not yet made) is fixed once its
    /// earliest instant has passed; before, that instant is returned (a lower bound: a
    /// submission may still move it later, never earlier than now).
    pub fn event_done_at(&mut self, e: u64) -> R<Option<u64>> {
        self.check_event(e)?;
        let Some(ev) = self.clock.events.get_mut(&e) else {
            return Ok(None);
        };
        if let Some((_, at_min)) = ev.open {
            if now_ns() >= at_min {
                ev.at = Some(at_min);
                ev.open = None;
            }
            return Ok(Some(at_min));
        }
        Ok(ev.at)
    }

    /// `cuEventElapsedTime(_v2)`: milliseconds from `start` to `end`.
    pub fn event_elapsed_ms(&mut self, start: u64, end: u64) -> R<f32> {
        self.check_event(start)?;
        self.check_event(end)?;
        let get = |t: &Timeline, e: u64| t.events.get(&e).copied().unwrap_or_default();
        let (a, b) = (get(&self.clock, start), get(&self.clock, end));
        if (a.flags | b.flags) & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let recorded = |e: &EventClock| e.at.is_some() || e.open.is_some();
        if !recorded(&a) || !recorded(&b) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (Some(ta), Some(tb)) = (self.event_done_at(start)?, self.event_done_at(end)?) else {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        };
        if now_ns() < ta.max(tb) {
            return Err(CUDA_ERROR_NOT_READY);
        }
        Ok(((tb as i128 - ta as i128) as f64 / 1e6) as f32)
    }

    /// A capture began on `s`: nothing captured yet.
    pub fn clock_capture_began(&mut self, s: u64) {
        self.clock.capture.insert(s, 0);
    }

    /// A capture on `s` ended as graph `g`: the graph takes what was captured.
    pub fn clock_capture_ended(&mut self, s: u64, g: u64) {
        let ns = self.clock.capture.remove(&s).unwrap_or(0);
        self.clock.graphs.insert(g, ns);
        self.graph_captured(g);
    }

    /// A graph made by `cuGraphCreate`: no work yet.
    pub fn clock_graph_created(&mut self, g: u64) {
        self.clock.graphs.insert(g, 0);
    }

    /// `cuGraphInstantiate*` (`flags`: `CUgraphInstantiate_flags`): an executable graph of
    /// graph `g`.
    pub fn graph_instantiate(&mut self, g: u64, flags: u64) -> R<u64> {
        let ns = *self.clock.graphs.get(&g).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        self.current()?;
        let h = self.handle(0x6b);
        self.graph_exec_created(h, g, flags)?;
        self.clock.execs.insert(h, ns);
        Ok(h)
    }

    /// Total ns of executable graph `x`.
    pub fn graph_exec_ns(&self, x: u64) -> R<u64> {
        self.clock
            .execs
            .get(&x)
            .copied()
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuGraphDestroy`.
    pub fn graph_destroy(&mut self, g: u64) -> R<()> {
        self.graph_forget(g);
        self.clock
            .graphs
            .remove(&g)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    /// `cuGraphExecDestroy`.
    pub fn graph_exec_destroy(&mut self, x: u64) -> R<()> {
        self.graph_exec_forget(x);
        self.clock
            .execs
            .remove(&x)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Submits `dur` ns of work on stream `s` (a launch, a graph launch), sleeping with the lock
/// released while the process's queue on the device is full ([`queue_depth`],
/// [`queue_ahead_ns`]).
pub fn submit(mut g: MutexGuard<'static, Inner>, s: u64, ptsz: bool, dur: u64) -> R<()> {
    let mut waited = None;
    loop {
        match g.try_submit(s, ptsz, dur, waited) {
            Ok(_) => return Ok(()),
            Err(Err(code)) => return Err(code),
            Err(Ok(until)) => {
                drop(g);
                sleep_until(until);
                waited = Some(until);
                g = inited()?;
            }
        }
    }
}

/// Sleeps, with the driver unlocked, until `at` (if any), then re-locks.
pub fn wait_until(g: MutexGuard<'static, Inner>, at: Option<u64>) -> R<MutexGuard<'static, Inner>> {
    match at {
        Some(t) if t > now_ns() => {
            drop(g);
            sleep_until(t);
            inited()
        }
        _ => Ok(g),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_keys() {
        assert_eq!(
            image_kernel_time(b"FAKECUBIN globals=0 ns=2ms"),
            Some(KernelTime::Fixed(2_000_000))
        );
        assert_eq!(
            image_kernel_time(b"FAKECUBIN ns=param globals=1M"),
            Some(KernelTime::Param)
        );
        assert_eq!(
            image_kernel_time(b"FAKECUBIN globals=1M"),
            Some(KernelTime::Default)
        );
        assert_eq!(image_kernel_time(b"\x7fELF..."), Some(KernelTime::Default));
        assert_eq!(image_kernel_time(b"FAKECUBIN ns=soon"), None);
    }

    #[test]
    fn event_flags() {
        assert!(Inner::check_event_flags(0).is_ok());
        assert!(Inner::check_event_flags(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING).is_ok());
        assert!(Inner::check_event_flags(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING).is_ok());
        assert_eq!(
            Inner::check_event_flags(CU_EVENT_INTERPROCESS),
            Err(CUDA_ERROR_INVALID_VALUE)
        );
        assert_eq!(Inner::check_event_flags(8), Err(CUDA_ERROR_INVALID_VALUE));
    }

    #[test]
    fn sleeping_reaches_the_deadline() {
        let t = now_ns() + 2_000_000;
        sleep_until(t);
        assert!(now_ns() >= t);
    }
}
