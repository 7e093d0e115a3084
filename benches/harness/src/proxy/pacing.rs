//! Per-connection bandwidth pacing (a token bucket in GCRA form).
//!
//! A [`Pacer`] keeps one "theoretical arrival time" (`tat`): the moment the
//! bytes sent so far would have finished at the configured rate. A piece may
//! go once `tat - BURST <= now` (`BURST`: 2 ms worth, or one piece); sending
//! it moves `tat` forward by `n / rate`.
//!
//! Two refinements make the average rate right on a busy machine, where
//! sleeps end late by a few milliseconds:
//!
//! - Falling behind within a response is forgiven only beyond
//!   [`MAX_DEBT`]: a late wake-up (or a client that paused) is made up by
//!   sending the next pieces without waiting, up to that much. A plain token
//!   bucket would instead lose every late millisecond and deliver well under
//!   the rate.
//! - Idle time between responses earns nothing: [`Pacer::begin_response`]
//!   restarts the schedule at the first byte, so a response's body takes
//!   `len / rate` (less the small burst) however long the connection idled,
//!   as on a real link where the first-byte delay and the transfer add up.
//!
//! The body is fed through in pieces of at most [`Pacer::piece_size`] bytes
//! (10 ms worth at the rate, capped at 64 KiB), so a slow rate gives a
//! steady trickle rather than a burst followed by a long pause.

use std::time::Duration;

use tokio::time::Instant;

/// Largest piece handed to the connection at once.
const MAX_PIECE: usize = 64 * 1024;

/// The least burst allowed ahead of the schedule.
const MIN_BURST: Duration = Duration::from_millis(2);

/// How far behind schedule a response may fall and still catch up.
pub const MAX_DEBT: Duration = Duration::from_millis(25);

/// The pacing state of one connection.
#[derive(Debug)]
pub struct Pacer {
    tat: Instant,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer {
            tat: Instant::now(),
        }
    }
}

impl Pacer {
    /// The piece size for `rate` bytes per second.
    pub fn piece_size(rate: u64) -> usize {
        usize::try_from(rate / 100)
            .unwrap_or(MAX_PIECE)
            .clamp(1, MAX_PIECE)
    }

    /// Starts the schedule of a new response body at `now` (or where the
    /// previous response's schedule ends, if that is later).
    pub fn begin_response(&mut self, now: Instant) {
        self.tat = self.tat.max(now);
    }

    /// Books `n` bytes at `rate` bytes per second (`rate > 0`) and returns
    /// the instant they may be sent (possibly already past).
    pub fn reserve(&mut self, n: usize, rate: u64, now: Instant) -> Instant {
        let rate_f = rate.max(1) as f64;
        let cost = Duration::from_secs_f64(n as f64 / rate_f);
        let burst = Duration::from_secs_f64(Self::piece_size(rate) as f64 / rate_f).max(MIN_BURST);
        let send_at = self.tat.checked_sub(burst).map_or(now, |t| t.max(now));
        let floor = now.checked_sub(MAX_DEBT).unwrap_or(now);
        self.tat = self.tat.max(floor) + cost;
        send_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_sizes() {
        assert_eq!(Pacer::piece_size(1), 1);
        assert_eq!(Pacer::piece_size(1000), 10);
        assert_eq!(Pacer::piece_size(100_000_000), MAX_PIECE);
    }

    #[test]
    fn spaces_sends_at_the_rate() {
        let now = Instant::now();
        let mut pacer = Pacer { tat: now };
        // 1000 B/s, 10-byte pieces: tolerance is 10 ms.
        let first = pacer.reserve(10, 1000, now);
        assert_eq!(first, now);
        let mut last = first;
        for _ in 0..99 {
            last = pacer.reserve(10, 1000, now);
        }
        // Piece i may go at i * 10 ms less the 10 ms tolerance.
        let wait = last - now;
        assert!(wait >= Duration::from_millis(975), "{wait:?}");
        assert!(wait <= Duration::from_millis(985), "{wait:?}");
    }

    #[test]
    fn idle_time_is_not_banked() {
        let now = Instant::now();
        let mut pacer = Pacer { tat: now };
        let later = now + Duration::from_secs(10);
        pacer.begin_response(later);
        assert_eq!(pacer.reserve(1000, 1000, later), later);
        let next = pacer.reserve(1000, 1000, later);
        assert!(next >= later + Duration::from_millis(900));
    }

    #[test]
    fn late_wake_ups_are_made_up() {
        let start = Instant::now();
        let mut pacer = Pacer { tat: start };
        // 100 KB/s, 1000-byte pieces (10 ms each); every sleep ends 15 ms
        // late, more than the 10 ms burst. After 100 pieces the schedule
        // must still be ~1 s, not ~1.5 s.
        let mut now = start;
        for _ in 0..100 {
            let send_at = pacer.reserve(1000, 100_000, now);
            if send_at > now {
                now = send_at + Duration::from_millis(15);
            }
        }
        let took = now - start;
        assert!(took <= Duration::from_millis(1020), "{took:?}");
        assert!(took >= Duration::from_millis(970), "{took:?}");
    }

    #[test]
    fn long_stalls_are_forgiven_beyond_the_debt() {
        let start = Instant::now();
        let mut pacer = Pacer { tat: start };
        pacer.reserve(1000, 1000, start);
        // The client paused 10 s: only MAX_DEBT plus the burst (35 ms,
        // 35 bytes) may go at once.
        let later = start + Duration::from_secs(10);
        let mut free = 0;
        while pacer.reserve(1, 1000, later) <= later {
            free += 1;
        }
        assert!((30..=40).contains(&free), "{free}");
    }
}
