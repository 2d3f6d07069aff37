//! When to try a request again, and after how long.
//!
//! 429 and 5xx answers and failed connections are retried up to
//! `max_retries` times, waiting 0.5 s, 1 s, 2 s, ... (at most 30 s) between
//! attempts, or what the server's `Retry-After` asks when it says (seconds;
//! capped at 60 s so that a server cannot park a turn for an hour). 401 and
//! 403 are never retried: the key will not get better.

use std::time::Duration;

/// The retry schedule of one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    max_retries: u32,
    done: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const LONGEST: Duration = Duration::from_secs(30);
    const LONGEST_ASKED: Duration = Duration::from_secs(60);

    /// A schedule allowing `max_retries` retries.
    pub(crate) fn new(max_retries: u32) -> Self {
        Backoff {
            max_retries,
            done: 0,
        }
    }

    /// The wait before the next retry, or `None` when none is left.
    /// `retry_after` is what the server asked for.
    pub(crate) fn next(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        if self.done >= self.max_retries {
            return None;
        }
        let own = Self::FIRST
            .saturating_mul(1u32 << self.done.min(16))
            .min(Self::LONGEST);
        self.done += 1;
        Some(retry_after.map_or(own, |asked| asked.min(Self::LONGEST_ASKED)))
    }

    /// Whether a status is worth another try.
    pub(crate) fn retryable(status: u16) -> bool {
        status == 429 || (500..600).contains(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_honours_retry_after_and_stops() {
        let mut backoff = Backoff::new(3);
        assert_eq!(backoff.next(None), Some(Duration::from_millis(500)));
        assert_eq!(
            backoff.next(Some(Duration::from_secs(2))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(backoff.next(None), Some(Duration::from_secs(2)));
        assert_eq!(backoff.next(None), None);
        let mut greedy = Backoff::new(1);
        assert_eq!(
            greedy.next(Some(Duration::from_secs(3600))),
            Some(Duration::from_secs(60))
        );
        assert!(Backoff::retryable(429) && Backoff::retryable(503));
        assert!(!Backoff::retryable(401) && !Backoff::retryable(400));
    }
}
