//! Worker fleet (in progress).
