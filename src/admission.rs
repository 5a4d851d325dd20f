//! Which client connections a listener (api, proxy) takes: at most
//! `limits.max_client_connections` open at once, and at most `limits.max_connections_per_client`
//! of them from one client address, so that one address holding thousands of slow or idle
//! connections cannot keep every other client out. A connection beyond either bound is closed
//! as soon as it is accepted.
//!
//! An address is the peer's IP address (an IPv4-mapped IPv6 address counts as its IPv4
//! address). A sidecar's clients in the same pod all connect from the loopback address and so
//! share one address's connections; `max_connections_per_client` equal to
//! `max_client_connections` turns the share off.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The listener holds `max_client_connections`.
    Total,
    /// The client's address holds `max_connections_per_client`.
    PerClient,
}

impl Refused {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::PerClient => "per_client",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_addr: HashMap<IpAddr, usize>,
}

/// One listener's open connections, in total and by client address.
#[derive(Debug, Default)]
pub struct Admission {
    counts: Mutex<Counts>,
}

/// An admitted connection: counted until it is dropped.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    addr: Option<IpAddr>,
}

impl Admission {
    pub fn new() -> Arc<Admission> {
        Arc::new(Admission::default())
    }

    /// Takes a connection from `addr` (unknown for a Unix socket peer, which counts only in
    /// the total) if neither bound is reached.
    pub fn admit(
        self: &Arc<Self>,
        addr: Option<IpAddr>,
        max_total: usize,
        max_per_client: usize,
    ) -> Result<Admitted, Refused> {
        let addr = addr.map(|a| a.to_canonical());
        let mut c = self.lock();
        if c.total >= max_total {
            return Err(Refused::Total);
        }
        if let Some(a) = addr {
            let n = c.by_addr.entry(a).or_insert(0);
            if *n >= max_per_client {
                return Err(Refused::PerClient);
            }
            *n += 1;
        }
        c.total += 1;
        Ok(Admitted {
            admission: self.clone(),
            addr,
        })
    }

    /// Connections open now, in total and from `addr`.
    pub fn open(&self, addr: Option<IpAddr>) -> (usize, usize) {
        let c = self.lock();
        let from = addr
            .and_then(|a| c.by_addr.get(&a.to_canonical()).copied())
            .unwrap_or(0);
        (c.total, from)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent even if a holder panicked: every update is one step.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self.admission.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(a) = self.addr {
            if let Some(n) = c.by_addr.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    // No entry outlives its last connection: the map holds open addresses only.
                    c.by_addr.remove(&a);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn one_address_is_held_to_its_share_while_another_is_served() {
        let a = Admission::new();
        let held: Vec<_> = (0..3)
            .map(|_| a.admit(ip("10.0.0.1"), 10, 3).unwrap())
            .collect();
        assert_eq!(
            a.admit(ip("10.0.0.1"), 10, 3).unwrap_err(),
            Refused::PerClient
        );
        let other = a.admit(ip("10.0.0.2"), 10, 3).unwrap();
        assert_eq!(a.open(ip("10.0.0.1")), (4, 3));
        drop(held);
        assert_eq!(a.open(ip("10.0.0.1")), (1, 0));
        drop(other);
        assert_eq!(a.open(None), (0, 0));
        assert!(a.lock().by_addr.is_empty());
    }

    #[test]
    fn the_total_bounds_every_address_together() {
        let a = Admission::new();
        let _x = a.admit(ip("10.0.0.1"), 2, 2).unwrap();
        let _y = a.admit(None, 2, 2).unwrap();
        assert_eq!(a.admit(ip("10.0.0.3"), 2, 2).unwrap_err(), Refused::Total);
    }

    #[test]
    fn a_mapped_ipv6_address_counts_as_its_ipv4_address() {
        let a = Admission::new();
        let _x = a.admit(ip("127.0.0.1"), 10, 1).unwrap();
        assert_eq!(
            a.admit(ip("::ffff:127.0.0.1"), 10, 1).unwrap_err(),
            Refused::PerClient
        );
    }
}
