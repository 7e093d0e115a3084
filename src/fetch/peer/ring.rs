//! Who owns a block: rendezvous (highest-random-weight) hashing over the members.
//!
//! A block is named by its bucket, key, ETag and index ([`BlockName`]), which never changes
//! meaning (an ETag names one version), so ownership needs no invalidation. Each member gets a
//! score for a block, a 64-bit mix of the member's hash and the block's hash; the members in
//! descending score order are the block's ranking ([`Ring::rank`]), the first its owner.
//! Removing a member changes the owner only of the blocks it owned (every other member's score
//! is unchanged), and adding one takes away from each other member only the blocks where the
//! newcomer scores highest, about 1/N of them: no data moves, the next reader simply asks the
//! new owner. Rendezvous rather than a ring of virtual nodes: no tuning, an even spread
//! without replicas, and the second-ranked member (the fallback) comes for free. Its cost is
//! one mix per member per block, nothing next to a network round trip for clusters up to
//! thousands of nodes.

use sha2::{Digest, Sha256};

/// The hash of a block, computed once per lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockName(u64);

impl BlockName {
    pub fn new(bucket: &str, key: &str, etag: &str, block: u64) -> BlockName {
        let mut h = Sha256::new();
        h.update(b"rifflefs-peer-block-v1\0");
        for field in [bucket, key, etag] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        h.update(block.to_le_bytes());
        BlockName(first_u64(&h.finalize()))
    }
}

/// One member of the ring, as every node names it (`HOST:PORT` from `--peers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub addr: String,
    /// This node itself (its own `--peer-listen` address).
    pub is_self: bool,
    hash: u64,
}

impl Member {
    pub fn new(addr: &str, is_self: bool) -> Member {
        let mut h = Sha256::new();
        h.update(b"rifflefs-peer-member-v1\0");
        h.update(addr.as_bytes());
        Member {
            addr: addr.to_string(),
            is_self,
            hash: first_u64(&h.finalize()),
        }
    }

    fn score(&self, block: BlockName) -> u64 {
        mix(self.hash ^ mix(block.0))
    }
}

/// The members; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Ring {
    members: Vec<Member>,
}

impl Ring {
    /// A ring of `members` (duplicates by address are dropped, the first kept).
    pub fn new(members: Vec<Member>) -> Ring {
        let mut unique: Vec<Member> = Vec::with_capacity(members.len());
        for m in members {
            if !unique.iter().any(|u| u.addr == m.addr) {
                unique.push(m);
            }
        }
        Ring { members: unique }
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The members ordered by their score for `block`, the owner first.
    pub fn rank(&self, block: BlockName) -> Vec<&Member> {
        let mut ranked: Vec<(u64, &Member)> =
            self.members.iter().map(|m| (m.score(block), m)).collect();
        // Ties (astronomically rare) are broken by address so every node agrees.
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.addr.cmp(&b.1.addr)));
        ranked.into_iter().map(|(_, m)| m).collect()
    }

    /// The owner of `block`, if there are members.
    #[cfg(test)]
    pub fn owner(&self, block: BlockName) -> Option<&Member> {
        self.members.iter().max_by(|a, b| {
            a.score(block)
                .cmp(&b.score(block))
                .then_with(|| b.addr.cmp(&a.addr))
        })
    }
}

fn first_u64(digest: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(b)
}

/// splitmix64's finaliser: a bijective mix with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: usize) -> Ring {
        Ring::new(
            (0..n)
                .map(|i| Member::new(&format!("10.0.0.{i}:7000"), false))
                .collect(),
        )
    }

    fn blocks(n: u64) -> Vec<BlockName> {
        (0..n)
            .map(|i| BlockName::new("bucket", &format!("train/{i:06}.jpg"), "etag", i % 3))
            .collect()
    }

    fn owners(ring: &Ring, blocks: &[BlockName]) -> Vec<String> {
        blocks
            .iter()
            .map(|b| ring.owner(*b).map(|m| m.addr.clone()).unwrap_or_default())
            .collect()
    }

    #[test]
    fn owner_is_the_first_ranked_and_every_node_agrees() {
        let a = ring(5);
        // The same members in another order (another node's --peers).
        let mut members = a.members().to_vec();
        members.reverse();
        let b = Ring::new(members);
        for block in blocks(500) {
            let ranked = a.rank(block);
            assert_eq!(ranked.len(), 5);
            assert_eq!(ranked[0].addr, a.owner(block).unwrap().addr);
            assert_eq!(a.owner(block).unwrap().addr, b.owner(block).unwrap().addr);
            let other: Vec<_> = b.rank(block).iter().map(|m| m.addr.clone()).collect();
            let mine: Vec<_> = ranked.iter().map(|m| m.addr.clone()).collect();
            assert_eq!(mine, other);
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_blocks_to_its_runner_up() {
        let full = ring(8);
        let blocks = blocks(20_000);
        let before = owners(&full, &blocks);
        let gone = full.members()[3].addr.clone();
        let smaller = Ring::new(
            full.members()
                .iter()
                .filter(|m| m.addr != gone)
                .cloned()
                .collect(),
        );
        let after = owners(&smaller, &blocks);
        for (i, block) in blocks.iter().enumerate() {
            if before[i] == gone {
                // Its blocks go to the member that ranked second.
                assert_eq!(after[i], full.rank(*block)[1].addr);
            } else {
                assert_eq!(after[i], before[i], "a block not owned by the leaver moved");
            }
        }
    }

    #[test]
    fn a_member_joining_takes_about_one_nth_and_only_for_itself() {
        let small = ring(7);
        let big = ring(8);
        let blocks = blocks(20_000);
        let before = owners(&small, &blocks);
        let after = owners(&big, &blocks);
        let newcomer = &big.members()[7].addr;
        let mut moved = 0;
        for i in 0..blocks.len() {
            if before[i] != after[i] {
                assert_eq!(&after[i], newcomer, "a block moved between old members");
                moved += 1;
            }
        }
        let share = moved as f64 / blocks.len() as f64;
        assert!(
            (0.10..0.15).contains(&share),
            "moved {share}, expected ~1/8"
        );
    }

    #[test]
    fn blocks_spread_evenly() {
        for n in [3, 8, 32] {
            let r = ring(n);
            let total = 30_000u64;
            let mut counts = std::collections::HashMap::new();
            for b in blocks(total) {
                *counts
                    .entry(r.owner(b).unwrap().addr.clone())
                    .or_insert(0u64) += 1;
            }
            assert_eq!(counts.len(), n);
            let mean = total as f64 / n as f64;
            for (m, c) in counts {
                let dev = (c as f64 - mean).abs() / mean;
                assert!(dev < 0.15, "{m} owns {c}, mean {mean}, n {n}");
            }
        }
    }

    #[test]
    fn duplicates_are_dropped_and_an_empty_ring_has_no_owner() {
        let r = Ring::new(vec![
            Member::new("a:1", true),
            Member::new("a:1", false),
            Member::new("b:1", false),
        ]);
        assert_eq!(r.len(), 2);
        assert!(r.members()[0].is_self);
        assert!(Ring::default()
            .owner(BlockName::new("b", "k", "e", 0))
            .is_none());
    }
}
