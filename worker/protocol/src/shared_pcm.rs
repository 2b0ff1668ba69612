//! 16 kHz mono samples shared between a recording and the requests cut from it.

use std::ops::{Deref, Range};
use std::sync::Arc;

/// All or part of a shared sample buffer: a sender hands a recording's segment to the wire
/// without copying it out of the recording, and keeps one copy of it however often it is
/// resent (to another worker after a restart). Compares by its samples.
#[derive(Debug, Clone)]
pub struct SharedPcm {
    buffer: Arc<Vec<f32>>,
    /// Within `buffer` (checked where made).
    range: Range<usize>,
}

impl SharedPcm {
    /// `range` of `buffer`; `None` if it is not within the buffer.
    pub fn part(buffer: Arc<Vec<f32>>, range: Range<usize>) -> Option<Self> {
        buffer.get(range.clone())?;
        Some(Self { buffer, range })
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.buffer[self.range.clone()]
    }

    /// The samples as an owned vector: no copy when this holds the whole buffer and nothing
    /// else shares it (a request just decoded from the wire).
    pub fn into_vec(self) -> Vec<f32> {
        if self.range == (0..self.buffer.len()) {
            Arc::unwrap_or_clone(self.buffer)
        } else {
            self.as_slice().to_vec()
        }
    }
}

impl Deref for SharedPcm {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl From<Arc<Vec<f32>>> for SharedPcm {
    fn from(buffer: Arc<Vec<f32>>) -> Self {
        let range = 0..buffer.len();
        Self { buffer, range }
    }
}

impl From<Vec<f32>> for SharedPcm {
    fn from(samples: Vec<f32>) -> Self {
        Arc::new(samples).into()
    }
}

impl PartialEq for SharedPcm {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_is_its_range_and_only_a_range_within_the_buffer() {
        let buffer = Arc::new(vec![0.0, 1.0, 2.0, 3.0]);
        let part = SharedPcm::part(buffer.clone(), 1..3).expect("1..3 of 4 samples");
        assert_eq!(&*part, &[1.0, 2.0]);
        assert_eq!(part.clone().into_vec(), vec![1.0, 2.0]);
        assert_eq!(part, SharedPcm::from(vec![1.0, 2.0]));
        assert!(SharedPcm::part(buffer.clone(), 3..5).is_none());
        assert!(SharedPcm::part(buffer, 4..4).is_some());
    }

    #[test]
    fn the_whole_buffer_comes_back_without_a_copy_when_unshared() {
        let samples = vec![0.5; 8];
        let address = samples.as_ptr();
        let back = SharedPcm::from(samples).into_vec();
        assert_eq!(back.as_ptr(), address);
    }
}
