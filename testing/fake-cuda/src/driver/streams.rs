//! Events, streams and stream capture.

use super::{Inner, R};
use crate::ffi::*;

impl Inner {
    /// `cuEventCreate`.
    pub fn event_create(&mut self) -> R<u64> {
        let (c, _) = self.current()?;
        let h = self.handle(0xe5);
        self.events.insert(h, c);
        Ok(h)
    }

    /// Validates an event handle.
    pub fn check_event(&self, h: u64) -> R<()> {
        match self.events.get(&h) {
            Some(&c) => self.ctx(c).map(|_| ()),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuEventDestroy_v2`.
    pub fn event_destroy(&mut self, h: u64) -> R<()> {
        self.events
            .remove(&h)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// Validates a stream handle (the null, legacy and per-thread streams need a context).
    pub fn check_stream(&self, s: u64) -> R<()> {
        if s == 0 || s == CU_STREAM_LEGACY as u64 || s == CU_STREAM_PER_THREAD as u64 {
            self.current()?;
            return Ok(());
        }
        match self.streams.get(&s) {
            Some(&c) => self.ctx(c).map(|_| ()),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `cuStreamBeginCapture_v2`: only a created stream can be captured.
    pub fn begin_capture(&mut self, s: u64) -> R<()> {
        self.check_stream(s)?;
        if !self.streams.contains_key(&s) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if !self.capturing.insert(s) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(())
    }

    /// `cuStreamEndCapture`: a graph handle.
    pub fn end_capture(&mut self, s: u64) -> R<u64> {
        self.check_stream(s)?;
        if !self.capturing.remove(&s) {
            return Err(CUDA_ERROR_ILLEGAL_STATE);
        }
        Ok(self.handle(0x6a))
    }

    /// Whether stream `s` is being captured.
    pub fn is_capturing(&self, s: u64) -> bool {
        self.capturing.contains(&s)
    }

    /// `cuStreamCreate`.
    pub fn stream_create(&mut self) -> R<u64> {
        let (c, _) = self.current()?;
        let h = self.handle(0x50);
        self.streams.insert(h, c);
        Ok(h)
    }

    /// `cuStreamDestroy_v2`.
    pub fn stream_destroy(&mut self, s: u64) -> R<()> {
        self.capturing.remove(&s);
        self.streams
            .remove(&s)
            .map(|_| ())
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}
