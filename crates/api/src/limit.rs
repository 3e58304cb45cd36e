//! Request rates at the door, checked before anything else is done with a request: per client
//! address (so a flood of made-up tokens costs no database read past its address's rate) and per
//! bearer token (so one runaway agent cannot take the database pool from the others). Past either:
//! `429 rate-limited` with `Retry-After`; nothing is read or written. Each server process keeps its
//! own counts: a fleet of N API pods admits N times the rate in all.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, NotUntil, Quota, RateLimiter};
use jobtrail_service::{ServiceError, auth};

use crate::Problem;

/// Requests between two sweeps of keys that have been quiet long enough to forget (the maps'
/// memory is bounded by the rates, not by how many addresses or tokens were ever seen).
const SWEEP_EVERY: u64 = 4096;

/// A rate and its burst, from `RATE/s` or `RATE/s,BURST` (the burst defaults to twice the rate);
/// `off` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate(Option<Quota>);

impl Rate {
    pub const OFF: Rate = Rate(None);
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_rate(s).map(Rate)
    }
}

fn parse_rate(s: &str) -> Result<Option<Quota>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let usage = || format!("{s:?}: a rate is RATE/s or RATE/s,BURST (50/s, 50/s,200) or off");
    let (rate, burst) = match s.split_once(',') {
        Some((r, b)) => (r.trim(), Some(b.trim())),
        None => (s, None),
    };
    let rate: u32 = rate
        .strip_suffix("/s")
        .and_then(|r| r.trim().parse().ok())
        .ok_or_else(usage)?;
    let rate =
        NonZeroU32::new(rate).ok_or_else(|| format!("{s:?}: a rate is at least 1/s (or off)"))?;
    let burst = match burst {
        None => rate.saturating_mul(NonZeroU32::MIN.saturating_add(1)),
        Some(b) => b
            .parse::<u32>()
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(usage)?,
    };
    Ok(Some(Quota::per_second(rate).allow_burst(burst)))
}

/// Proxies whose `X-Forwarded-For` names the client (an Ingress controller's pod range, say):
/// `10.0.0.0/8,192.168.1.7`; empty: none, every client is the connection's peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Proxies(Vec<ipnet::IpNet>);

impl std::str::FromStr for Proxies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let net = p
                    .parse::<ipnet::IpNet>()
                    .or_else(|_| p.parse::<IpAddr>().map(ipnet::IpNet::from))
                    .map_err(|_| format!("{p:?}: an address or a range (10.0.0.0/8, fd00:10::/64)"))?;
                // An address trusted here may name any client: a typo that trusts the world
                // (`10.0.0.0/0` for `/8`) would let anyone choose the address they are counted as.
                if net != net.trunc() {
                    return Err(format!(
                        "{p:?}: the address has bits set past the /{} prefix; did you mean {}?",
                        net.prefix_len(),
                        net.trunc()
                    ));
                }
                let widest = match net {
                    ipnet::IpNet::V4(_) => 8,
                    ipnet::IpNet::V6(_) => 16,
                };
                if net.prefix_len() < widest {
                    return Err(format!(
                        "{p:?}: wider than /{widest}: every address in it may name any client; name the proxies' own range"
                    ));
                }
                Ok(net)
            })
            .collect::<Result<_, _>>()
            .map(Proxies)
    }
}

impl Proxies {
    /// Whether `ip` is one of these proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(&ip.to_canonical()))
    }

    /// Who is asking: the peer, unless it is a trusted proxy; then the right-most address in
    /// `X-Forwarded-For` that is not one (each proxy appends whom it heard from, so entries left of
    /// the first untrusted one are whatever the client wrote). An entry that is not an address
    /// where one was expected: the peer.
    fn client(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            // Some balancers write a port too (`1.2.3.4:5678`, `[2001:db8::1]:443`).
            let parsed = hop
                .parse::<IpAddr>()
                .or_else(|_| hop.parse::<SocketAddr>().map(|s| s.ip()))
                .map(|ip| ip.to_canonical());
            match parsed {
                Ok(ip) if self.trusts(ip) => client = ip,
                Ok(ip) => return ip,
                Err(_) => return peer,
            }
        }
        client
    }
}

/// The door's rate limits (clone freely: one set of counts).
#[derive(Clone)]
pub struct Gate(Arc<Limits>);

struct Limits {
    proxies: Proxies,
    addresses: Option<DefaultKeyedRateLimiter<IpAddr>>,
    tokens: Option<DefaultKeyedRateLimiter<[u8; 32]>>,
    seen: AtomicU64,
}

impl Gate {
    pub fn new(per_address: Rate, per_token: Rate, proxies: Proxies) -> Self {
        Self(Arc::new(Limits {
            proxies,
            addresses: per_address.0.map(RateLimiter::keyed),
            tokens: per_token.0.map(RateLimiter::keyed),
            seen: AtomicU64::new(0),
        }))
    }

    /// `app` with every request counted against its address and its bearer token. The server must
    /// give the peer's address (`jobtrail_api::serve` does); without it only tokens are counted.
    pub fn around(self, app: axum::Router) -> axum::Router {
        app.layer(axum::middleware::from_fn_with_state(self, admit))
    }

    fn sweep(&self) {
        if self.0.seen.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            if let Some(l) = &self.0.addresses {
                l.retain_recent();
                l.shrink_to_fit();
            }
            if let Some(l) = &self.0.tokens {
                l.retain_recent();
                l.shrink_to_fit();
            }
        }
    }
}

/// The key an address is counted under: an IPv6 client by its /64, which one machine commonly
/// holds whole (counting each of its addresses apart would be no limit at all).
pub(crate) fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// Who sent a request, as the rate per address counts it (behind trusted proxies the client they
/// name; an IPv6 client by its /64), for routes that bound what one sender holds; known only when
/// the rate per address is on or proxies are trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sender(pub IpAddr);

async fn admit(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    gate.sweep();
    let sender = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| address_key(gate.0.proxies.client(peer.ip(), req.headers())));
    if let Some(sender) = sender {
        if let Some(l) = &gate.0.addresses
            && let Err(wait) = l.check_key(&sender)
        {
            return refused(&wait, "this address");
        }
        // Only where addresses are told apart: with the rate per address off and no proxies to
        // trust (behind an Ingress not named), every request has the Ingress's address, and a
        // bound per address would be one bound for everyone.
        if gate.0.addresses.is_some() || !gate.0.proxies.0.is_empty() {
            req.extensions_mut().insert(Sender(sender));
        }
    }
    // Only a token-shaped one is counted (anything else is refused without a lookup anyway), by
    // its digest: the map never holds a token.
    let token = crate::bearer(req.headers()).filter(|t| auth::token_shaped(t));
    if let (Some(l), Some(t)) = (&gate.0.tokens, token)
        && let Err(wait) = l.check_key(&auth::token_digest(t))
    {
        return refused(&wait, "this token");
    }
    next.run(req).await
}

fn refused(wait: &NotUntil<<DefaultClock as Clock>::Instant>, whose: &str) -> Response {
    let secs = wait
        .wait_time_from(DefaultClock::default().now())
        .as_secs_f64()
        .ceil()
        .max(1.0) as u64;
    Problem(ServiceError::rate_limited(
        format!("too many requests from {whose}: try again in {secs} s"),
        secs,
    ))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_careless_ones_are_refused() {
        assert!(parse_rate("off").unwrap().is_none());
        let q = parse_rate("50/s").unwrap().unwrap();
        assert_eq!(q.burst_size().get(), 100);
        let q = parse_rate(" 5/s, 7 ").unwrap().unwrap();
        assert_eq!(q.burst_size().get(), 7);
        for bad in ["", "0/s", "50", "50/m", "-1/s", "5/s,0", "5/s,x", "5/s,"] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn trusted_proxies_that_would_trust_the_world_are_refused() {
        for bad in [
            "0.0.0.0/0",
            "10.0.0.0/0",
            "10.1.2.3/8",
            "10.0.0.0/7",
            "::/0",
            "fd00::/8",
            "10.0.0.0/8,0.0.0.0/0",
            "proxy.local",
        ] {
            assert!(bad.parse::<Proxies>().is_err(), "{bad:?}");
        }
        for good in [
            "",
            "10.0.0.0/8",
            "192.168.1.7",
            "fd00::/16",
            "::1",
            "10.0.0.0/8, 10.1.0.0/16",
        ] {
            assert!(good.parse::<Proxies>().is_ok(), "{good:?}");
        }
    }

    #[test]
    fn a_client_behind_trusted_proxies_is_the_right_most_untrusted_hop() {
        let proxies: Proxies = "10.0.0.0/8, 192.168.1.7".parse().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let xff = |v: &[&str]| {
            let mut h = axum::http::HeaderMap::new();
            for x in v {
                h.append("x-forwarded-for", x.parse().unwrap());
            }
            h
        };
        // Not from a proxy: the header is the client's own writing.
        assert_eq!(
            proxies.client(ip("203.0.113.9"), &xff(&["1.2.3.4"])),
            ip("203.0.113.9")
        );
        // Through two proxies, with a forged entry on the left.
        let h = xff(&["6.6.6.6, 198.51.100.4", "10.1.2.3"]);
        assert_eq!(proxies.client(ip("192.168.1.7"), &h), ip("198.51.100.4"));
        // All hops trusted: the left-most; none: the peer; garbage where an address belongs: the peer.
        assert_eq!(
            proxies.client(ip("10.0.0.1"), &xff(&["10.9.9.9"])),
            ip("10.9.9.9")
        );
        assert_eq!(proxies.client(ip("10.0.0.1"), &xff(&[])), ip("10.0.0.1"));
        assert_eq!(
            proxies.client(ip("10.0.0.1"), &xff(&["1.2.3.4, junk"])),
            ip("10.0.0.1")
        );
        // A dual-stack listener sees IPv4 peers mapped; a balancer may add ports.
        assert_eq!(
            proxies.client(ip("::ffff:10.0.0.1"), &xff(&["1.2.3.4:5678"])),
            ip("1.2.3.4")
        );
        assert_eq!(
            proxies.client(ip("10.0.0.1"), &xff(&["[2001:db8::1]:443"])),
            ip("2001:db8::1")
        );
        assert!("".parse::<Proxies>().unwrap().0.is_empty());
        for bad in ["10.0.0.0/33", "ingress", "10.0.0.1/8/8"] {
            assert!(bad.parse::<Proxies>().is_err(), "{bad}");
        }
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(address_key(mapped), "127.0.0.1".parse::<IpAddr>().unwrap());
    }
}
