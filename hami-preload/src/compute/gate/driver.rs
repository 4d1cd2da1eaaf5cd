//! What the launch gate needs of the driver ([`Driver`]: events, capture state) and of time
//! ([`Clock`]): the policy in `gate.rs` is written against these, the real ones are in
//! `real.rs`, simulated ones in the tests.

/// The state of an event's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// Completed (`CUDA_SUCCESS`).
    Done,
    /// Not yet (`CUDA_ERROR_NOT_READY`).
    Pending,
    /// Any other answer: the event (or its context) is gone.
    Failed,
}

/// What the gate needs of the driver. Events are opaque handles.
pub trait Driver {
    /// Whether `stream` is capturing (`cuStreamIsCapturing(_ptsz)`); an error counts as not
    /// capturing (the launch then reports its own error).
    fn capturing(&self, stream: usize, ptsz: bool) -> bool;
    /// A new timing event in the current context.
    fn create_event(&self) -> Option<usize>;
    /// Destroys an event (errors ignored).
    fn destroy_event(&self, ev: usize);
    /// Records `ev` on `stream` (`cuEventRecord(_ptsz)`); false on error.
    fn record(&self, ev: usize, stream: usize, ptsz: bool) -> bool;
    /// `cuEventQuery`.
    fn query(&self, ev: usize) -> Query;
    /// Nanoseconds between two completed events (`cuEventElapsedTime`).
    fn elapsed_ns(&self, start: usize, end: usize) -> Option<u64>;
    /// Nanoseconds from `start` to `end`, negative when `end` completed first (where the
    /// driver says so; one that will not is asked the other way round: [`super::offset_ns`]).
    fn elapsed_signed_ns(&self, start: usize, end: usize) -> Option<i64> {
        self.elapsed_ns(start, end)
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
    }
    /// Runs `f` with this thread allowed to query events while another stream capture is
    /// under way (`cuThreadExchangeStreamCaptureMode` to relaxed and back).
    fn relaxed(&self, f: &mut dyn FnMut()) {
        f()
    }
}

/// Wall time and sleeping.
pub trait Clock {
    /// `CLOCK_MONOTONIC` in nanoseconds.
    fn now_ns(&self) -> u64;
    /// Sleeps (never spins) for about `ns`.
    fn sleep_ns(&self, ns: u64);
}
