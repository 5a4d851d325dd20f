//! Where a webhook may go. A target URL must be http(s); its host is resolved
//! and every address it resolves to must be a public unicast address, unless
//! `webhooks.allow_networks` names the network. The check runs at upsert and
//! again at every delivery, inside the HTTP client's resolver
//! ([`GuardedResolver`]), so the client connects only to addresses that were
//! just checked: a DNS answer that changes between the two (rebinding) is
//! refused, not followed.

use arc_swap::ArcSwap;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use url::{Host, Url};

/// Longest target URL accepted.
pub const MAX_URL_LEN: usize = 2048;
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Networks no webhook may reach, most specific first, each with what it is.
static FORBIDDEN_V4: LazyLock<Vec<(Ipv4Net, &'static str)>> = LazyLock::new(|| {
    [
        ("169.254.169.254/32", "cloud metadata"),
        ("100.100.100.200/32", "cloud metadata"),
        ("255.255.255.255/32", "broadcast"),
        ("0.0.0.0/32", "unspecified"),
        ("0.0.0.0/8", "this-network (0.0.0.0/8)"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT (shared)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    ]
    .into_iter()
    .map(|(n, what)| (n.parse().expect("static network"), what))
    .collect()
});

static FORBIDDEN_V6: LazyLock<Vec<(Ipv6Net, &'static str)>> = LazyLock::new(|| {
    [
        ("fd00:ec2::254/128", "cloud metadata"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001:db8::/32", "documentation"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    ]
    .into_iter()
    .map(|(n, what)| (n.parse().expect("static network"), what))
    .collect()
});

/// Why an address is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{addr} is a {kind} address, refused for webhooks (list its network in webhooks.allow_networks to allow it)")]
pub struct Refusal {
    pub addr: IpAddr,
    pub kind: &'static str,
}

/// What is wrong with a target URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("is not an absolute URL: {0}")]
    Invalid(String),
    #[error("is longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error("must use http or https")]
    Scheme,
    #[error("must name a host")]
    NoHost,
    #[error("host {0} does not resolve")]
    Unresolvable(String),
    #[error("host {host} resolves to {refusal}")]
    Refused { host: String, refusal: Refusal },
}

/// The forbidden ranges and the operator's exceptions to them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetPolicy {
    allow: Vec<IpNet>,
}

impl NetPolicy {
    /// From `webhooks.allow_networks` (validated CIDRs; anything else is skipped).
    pub fn new(allow_networks: &[String]) -> Self {
        NetPolicy {
            allow: allow_networks
                .iter()
                .filter_map(|n| n.parse::<IpNet>().ok())
                .map(|n| n.trunc())
                .collect(),
        }
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(&ip))
    }

    /// Ok when a webhook may connect to `ip`.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.allowed(ip) {
            return Ok(());
        }
        let refuse = |kind| Err(Refusal { addr: ip, kind });
        match ip {
            IpAddr::V4(v4) => match forbidden_v4(v4) {
                Some(kind) => refuse(kind),
                None => Ok(()),
            },
            IpAddr::V6(v6) => {
                if let Some((_, kind)) = FORBIDDEN_V6.iter().find(|(n, _)| n.contains(&v6)) {
                    return refuse(kind);
                }
                // Addresses that carry an IPv4 address reach that address:
                // they are judged by it (and the allowlist may name either form).
                if let Some(v4) = embedded_v4(v6) {
                    if self.allowed(IpAddr::V4(v4)) {
                        return Ok(());
                    }
                    if let Some(kind) = forbidden_v4(v4) {
                        return Err(Refusal {
                            addr: ip,
                            kind: match kind {
                                "loopback" => "IPv4-embedded loopback",
                                "private" => "IPv4-embedded private",
                                "link-local" => "IPv4-embedded link-local",
                                "cloud metadata" => "IPv4-embedded cloud metadata",
                                _ => "IPv4-embedded non-public",
                            },
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Checks a URL statically, then resolves its host and checks every
    /// address (all must pass: one bad answer refuses the target).
    pub async fn check_target(&self, raw: &str) -> Result<Url, TargetError> {
        let url = parse_target(raw)?;
        match url.host() {
            None => return Err(TargetError::NoHost),
            Some(Host::Ipv4(ip)) => self.check_host_ip(&url, IpAddr::V4(ip))?,
            Some(Host::Ipv6(ip)) => self.check_host_ip(&url, IpAddr::V6(ip))?,
            Some(Host::Domain(d)) => {
                let addrs = resolve(d)
                    .await
                    .map_err(|_| TargetError::Unresolvable(d.to_string()))?;
                for a in addrs {
                    self.check(a.ip()).map_err(|refusal| TargetError::Refused {
                        host: d.to_string(),
                        refusal,
                    })?;
                }
            }
        }
        Ok(url)
    }

    /// For an IP-literal URL (the HTTP client does not resolve those).
    pub fn check_literal(&self, url: &Url) -> Result<(), TargetError> {
        match url.host() {
            Some(Host::Ipv4(ip)) => self.check_host_ip(url, IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_host_ip(url, IpAddr::V6(ip)),
            Some(Host::Domain(_)) => Ok(()),
            None => Err(TargetError::NoHost),
        }
    }

    fn check_host_ip(&self, url: &Url, ip: IpAddr) -> Result<(), TargetError> {
        self.check(ip).map_err(|refusal| TargetError::Refused {
            host: url.host_str().unwrap_or_default().to_string(),
            refusal,
        })
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    FORBIDDEN_V4
        .iter()
        .find(|(n, _)| n.contains(&ip))
        .map(|(_, k)| *k)
}

/// The IPv4 address inside an IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible
/// (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d) or 6to4 (2002:aabb:ccdd::) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if s[..5] == [0, 0, 0, 0, 0] && (s[5] == 0xffff || s[5] == 0) {
        return Some(tail);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    None
}

/// Syntax only: an absolute http(s) URL with a host, of sane length.
pub fn parse_target(raw: &str) -> Result<Url, TargetError> {
    if raw.len() > MAX_URL_LEN {
        return Err(TargetError::TooLong);
    }
    let url = Url::parse(raw).map_err(|e| TargetError::Invalid(e.to_string()))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(TargetError::Scheme);
    }
    match url.host_str() {
        None | Some("") => Err(TargetError::NoHost),
        Some(_) => Ok(url),
    }
}

async fn resolve(host: &str) -> std::io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, 0)))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "DNS lookup timed out")
            })??
            .collect();
    if addrs.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no addresses",
        ));
    }
    Ok(addrs)
}

/// The delivery client's DNS resolver: resolves, checks every address
/// against the current policy, and hands the client only checked addresses
/// (or an error naming the refused one).
pub struct GuardedResolver {
    pub policy: Arc<ArcSwap<NetPolicy>>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.load_full();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = resolve(&host).await?;
            for a in &addrs {
                policy
                    .check(a.ip())
                    .map_err(|refusal| TargetError::Refused {
                        host: host.clone(),
                        refusal,
                    })?;
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(p: &NetPolicy, ip: &str) -> Option<&'static str> {
        p.check(ip.parse().unwrap()).err().map(|r| r.kind)
    }

    #[test]
    fn every_forbidden_range_is_refused() {
        let p = NetPolicy::default();
        for (ip, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.1.1", "link-local"),
            ("169.254.169.254", "cloud metadata"),
            ("100.64.0.1", "carrier-grade NAT (shared)"),
            ("100.127.255.255", "carrier-grade NAT (shared)"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this-network (0.0.0.0/8)"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("fd00:ec2::254", "cloud metadata"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "IPv4-embedded loopback"),
            ("::ffff:10.0.0.1", "IPv4-embedded private"),
            ("::ffff:169.254.169.254", "IPv4-embedded cloud metadata"),
            ("64:ff9b::192.168.0.1", "IPv4-embedded private"),
            ("2002:7f00:1::", "IPv4-embedded loopback"),
        ] {
            assert_eq!(refused(&p, ip), Some(kind), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        let p = NetPolicy::default();
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(refused(&p, ip), None, "{ip}");
        }
    }

    #[test]
    fn the_allowlist_opens_exactly_its_networks() {
        let p = NetPolicy::new(&["127.0.0.0/8".into(), "::1/128".into()]);
        assert_eq!(refused(&p, "127.0.0.1"), None);
        assert_eq!(refused(&p, "::1"), None);
        assert_eq!(refused(&p, "::ffff:127.0.0.1"), None);
        assert_eq!(refused(&p, "10.0.0.1"), Some("private"));
        assert_eq!(refused(&p, "169.254.169.254"), Some("cloud metadata"));
    }

    #[tokio::test]
    async fn targets_are_checked_before_and_after_resolution() {
        let p = NetPolicy::default();
        assert_eq!(
            p.check_target("ftp://example.com/x").await,
            Err(TargetError::Scheme)
        );
        assert!(matches!(
            p.check_target("not a url").await,
            Err(TargetError::Invalid(_))
        ));
        assert!(matches!(
            p.check_target("http://[::1]:8080/hook").await,
            Err(TargetError::Refused { .. })
        ));
        // WHATWG parsing turns numeric hosts into addresses before we judge them.
        assert!(matches!(
            p.check_target("http://2130706433/").await,
            Err(TargetError::Refused { .. })
        ));
        assert!(matches!(
            p.check_target("http://0x7f.1/").await,
            Err(TargetError::Refused { .. })
        ));
        // A name is resolved and judged by what it resolves to.
        assert!(matches!(
            p.check_target("http://localhost:9/").await,
            Err(TargetError::Refused { .. })
        ));
        let open = NetPolicy::new(&["127.0.0.0/8".into(), "::1/128".into()]);
        assert!(open.check_target("http://localhost:9/").await.is_ok());
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(p.check_target(&long).await, Err(TargetError::TooLong));
    }
}
