//! Which pods this probe instance probes when several run at once (`--probe-instance`):
//! rendezvous (highest-random-weight) hashing of (pod uid, instance id) over the member
//! list pod-sync pushes. Every instance computes the same owner from the same list, with
//! no coordination beyond that list.
//!
//! Rendezvous rather than a hash ring: with a handful of members it needs no virtual nodes
//! to balance, and removing a member moves exactly that member's pods (each to whichever
//! remaining member weighs most for it), which is what makes a death cheap.

use std::path::Path;

/// The pods this process probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// The default, single instance: every pod, as before scale-out.
    All,
    /// An instance that has not yet received a member list: no pod. Owning every pod until
    /// the first list would make N instances starting together probe N times every pod (a
    /// CPU burst on a small node); owning none costs one registration round trip, and
    /// pod-sync keeps the values it published meanwhile, so nothing flips.
    Pending { me: String },
    /// The pods that hash to `me` among `members`.
    Members { me: String, members: Vec<String> },
}

impl Ownership {
    pub fn owns(&self, pod_uid: &str) -> bool {
        match self {
            Self::All => true,
            Self::Pending { .. } => false,
            Self::Members { me, members } => owner(pod_uid, members) == Some(me.as_str()),
        }
    }

    /// This state after pod-sync sent `members`; the default instance ignores lists.
    pub fn with_members(&self, members: Vec<String>) -> Self {
        match self {
            Self::All => Self::All,
            Self::Pending { me } | Self::Members { me, .. } => Self::Members {
                me: me.clone(),
                members,
            },
        }
    }
}

/// The member that probes `pod_uid`: the highest weight, ties (never seen in practice)
/// going to the greater id so that every instance agrees.
pub fn owner<'a>(pod_uid: &str, members: &'a [String]) -> Option<&'a str> {
    members
        .iter()
        .max_by_key(|m| (weight(pod_uid, m), m.as_str()))
        .map(String::as_str)
}

/// A hash that every build and every process computes alike (std's hashers promise
/// neither): FNV-1a over uid, a separator and id, then a 64-bit finalizer (splitmix64)
/// so that ids differing in one character spread over the whole range.
fn weight(pod_uid: &str, member: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in pod_uid.bytes().chain([0u8]).chain(member.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Why an instance id was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InstanceIdError {
    /// The id is empty or longer than 63 characters.
    #[error("--probe-instance {0:?}: want 1 to 63 characters")]
    Length(String),
    /// The id has a character other than [A-Za-z0-9._-] (it names a socket file).
    #[error("--probe-instance {0:?}: only letters, digits, '.', '_' and '-' are allowed")]
    Character(String),
}

/// Checks an instance id. `auto` draws a random one (12 hex digits of a fresh UUID from
/// `uuid_file`) for replicas started with the same flags: the host name will not do, as
/// compose's `network_mode: service:` gives every replica the host name of the network's
/// owner. A restarted `auto` instance is a new member; its old id left with its stream.
pub fn resolve_instance_id(flag: &str, uuid_file: &Path) -> Result<String, InstanceIdError> {
    let id = if flag == "auto" {
        std::fs::read_to_string(uuid_file)
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(12)
            .collect()
    } else {
        flag.to_string()
    };
    if id.is_empty() || id.len() > 63 {
        return Err(InstanceIdError::Length(id));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(InstanceIdError::Character(id));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn uids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("{i:08x}-1c2d-4e5f-8a9b-{:012x}", i * 7919))
            .collect()
    }

    fn members(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn counts(uids: &[String], members: &[String]) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for u in uids {
            *counts
                .entry(owner(u, members).unwrap().to_string())
                .or_default() += 1;
        }
        counts
    }

    #[test]
    fn a_hundred_pods_spread_over_three_instances() {
        let c = counts(&uids(100), &members(&["a", "b", "c"]));
        assert_eq!(c.values().sum::<usize>(), 100);
        assert_eq!(c.len(), 3, "{c:?}");
        // A third is 33; a fair coin over 100 pods stays within about ±15 of it.
        assert!(c.values().all(|n| (18..=48).contains(n)), "{c:?}");
    }

    #[test]
    fn removing_a_member_moves_only_its_pods() {
        let all = members(&["a", "b", "c", "d"]);
        let rest = members(&["a", "c", "d"]);
        for u in uids(200) {
            let before = owner(&u, &all).unwrap();
            let after = owner(&u, &rest).unwrap();
            if before != "b" {
                assert_eq!(before, after, "{u} moved though its owner stayed");
            }
        }
    }

    #[test]
    fn the_owner_does_not_depend_on_list_order() {
        let ab = members(&["a", "b", "c"]);
        let ba = members(&["c", "a", "b"]);
        for u in uids(50) {
            assert_eq!(owner(&u, &ab), owner(&u, &ba));
        }
        assert_eq!(owner("x", &[]), None);
    }

    #[test]
    fn ownership_states() {
        let pending = Ownership::Pending { me: "b".into() };
        assert!(!pending.owns("u1"), "no list yet: no pod");
        assert!(Ownership::All.owns("u1"));
        assert_eq!(Ownership::All.with_members(members(&["a"])), Ownership::All);
        let alone = pending.with_members(members(&["b"]));
        assert!(uids(20).iter().all(|u| alone.owns(u)));
        let gone = pending.with_members(members(&["a", "c"]));
        assert!(
            uids(20).iter().all(|u| !gone.owns(u)),
            "not a member: no pod"
        );
    }

    #[test]
    fn instance_ids() {
        let dir = tempfile_dir();
        let host = dir.join("uuid");
        std::fs::write(&host, "3f2a9c1b-e0d4-4c2e-9d1a-55aa33bb22cc\n").unwrap();
        assert_eq!(resolve_instance_id("a", &host), Ok("a".into()));
        assert_eq!(
            resolve_instance_id("auto", &host),
            Ok("3f2a9c1be0d4".into())
        );
        assert!(matches!(
            resolve_instance_id("../x", &host),
            Err(InstanceIdError::Character(_))
        ));
        assert!(matches!(
            resolve_instance_id("", &host),
            Err(InstanceIdError::Length(_))
        ));
        assert!(matches!(
            resolve_instance_id("auto", &dir.join("missing")),
            Err(InstanceIdError::Length(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("probe-shard-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
