//! The retry schedule: `webhooks.schedule_secs[i]` is the delay before
//! attempt i + 1 of a cycle (the first is normally 0), randomized by the
//! configured jitter; a `Retry-After` on 429 / 503 pushes the next attempt
//! back to at least the receiver's wish (capped at a day). When the schedule
//! is used up, the delivery is dead-lettered.

use chrono::{DateTime, Utc};
use rand::Rng;
use std::time::Duration;

/// Most a receiver's `Retry-After` can delay one attempt.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in 0..=delay ("full jitter": retries of many deliveries that
    /// failed together spread out instead of arriving together).
    Full,
    /// Uniform in delay/2..=delay.
    Equal,
    /// Exactly the schedule.
    None,
}

impl Jitter {
    pub fn parse(s: &str) -> Jitter {
        match s {
            "none" => Jitter::None,
            "equal" => Jitter::Equal,
            _ => Jitter::Full,
        }
    }

    pub fn apply(self, delay: Duration, rng: &mut impl Rng) -> Duration {
        let ms = delay.as_millis().min(u64::MAX as u128) as u64;
        match self {
            Jitter::None => delay,
            _ if ms == 0 => Duration::ZERO,
            Jitter::Full => Duration::from_millis(rng.gen_range(0..=ms)),
            Jitter::Equal => Duration::from_millis(rng.gen_range(ms / 2..=ms)),
        }
    }
}

/// The delay before the next attempt after `attempts_done` attempts of the
/// current cycle failed, or None when the schedule is used up (dead letter).
pub fn next_delay(
    schedule_secs: &[u64],
    attempts_done: u32,
    jitter: Jitter,
    retry_after: Option<Duration>,
    rng: &mut impl Rng,
) -> Option<Duration> {
    let base = *schedule_secs.get(attempts_done as usize)?;
    let d = jitter.apply(Duration::from_secs(base), rng);
    Some(match retry_after {
        Some(ra) => d.max(ra.min(MAX_RETRY_AFTER)),
        None => d,
    })
}

/// `Retry-After` as delay-seconds or an HTTP-date, relative to `now`.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let at = DateTime::parse_from_rfc2822(v).ok()?.with_timezone(&Utc);
    Some(
        (at - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_runs_out_into_a_dead_letter() {
        let s = [0, 5, 300];
        let mut rng = rand::thread_rng();
        assert_eq!(
            next_delay(&s, 1, Jitter::None, None, &mut rng),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            next_delay(&s, 2, Jitter::None, None, &mut rng),
            Some(Duration::from_secs(300))
        );
        assert_eq!(next_delay(&s, 3, Jitter::None, None, &mut rng), None);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let mut rng = rand::thread_rng();
        let d = Duration::from_secs(300);
        let mut below_half = false;
        for _ in 0..2000 {
            let f = Jitter::Full.apply(d, &mut rng);
            assert!(f <= d);
            below_half |= f < d / 2;
            let e = Jitter::Equal.apply(d, &mut rng);
            assert!(e >= d / 2 && e <= d);
        }
        assert!(below_half, "full jitter spreads over the whole range");
        assert_eq!(Jitter::Full.apply(Duration::ZERO, &mut rng), Duration::ZERO);
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        let mut rng = rand::thread_rng();
        let s = [0, 1, 1];
        assert_eq!(
            next_delay(&s, 1, Jitter::None, Some(Duration::from_secs(30)), &mut rng),
            Some(Duration::from_secs(30))
        );
        let now = DateTime::parse_from_rfc3339("2015-10-21T07:28:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:29:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("99999999", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon", now), None);
    }
}
