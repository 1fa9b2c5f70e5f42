//! The agent's side of a probe's per-cgroup ledger
//! (`agent_common::ledger`): at each scrape, from the keys the programs
//! made for each cgroup (its *made* map, read before the maps it counts),
//! the keys they deleted (its freed words, read after those maps) and the
//! keys the agent found there and kept, what each cgroup's keys no longer
//! there come to, written to its *gone* map, which only the agent writes.
//! A cgroup with nothing left is forgotten (both its records deleted), so
//! the ledger holds the cgroups that hold keys.
//!
//! Reckoned whole at every scrape, not added up: a count the programs lost
//! (an add into a record the agent deleted as the program made a key) is
//! right again at the next scrape. Keys made, or deleted by a program,
//! between the reads of *made* and of a map count twice until then, so a
//! cgroup's count errs high, never low, and it holds at most its limit.

use std::collections::{BTreeSet, HashMap};

use agent_common::ledger::{self, Entries, COUNTED};

use super::maps::{self, MapError};

/// What the agent wrote to a probe's *gone* map, by cgroup.
#[derive(Debug, Default)]
pub struct Ledger {
    written: HashMap<u64, Entries>,
}

/// What one settlement writes: *gone* records to put, and cgroups to
/// forget (their *gone* record deleted, then their *made* one).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    pub put: Vec<(u64, Entries)>,
    pub forget: Vec<u64>,
}

/// Keys by cgroup and word of a map's entries: `cgroup` of each key.
pub fn count<T>(counts: &mut HashMap<u64, Entries>, word: usize, keys: impl IntoIterator<Item = T>, cgroup: impl Fn(&T) -> u64) {
    for k in keys {
        if let Some(w) = counts.entry(cgroup(&k)).or_default().words.get_mut(word) {
            *w += 1;
        }
    }
}

impl Ledger {
    /// The cgroups the agent has a *gone* record for.
    pub fn len(&self) -> usize {
        self.written.len()
    }

    pub fn is_empty(&self) -> bool {
        self.written.is_empty()
    }

    /// Pure: `made`, the programs' counts read before the maps were, and
    /// `after`, read after them (whose freed words count: a key a program
    /// deleted while the agent read is then neither kept nor made, rather
    /// than made and not kept, which would count it gone twice); `kept`,
    /// the keys each cgroup holds in the maps the agent read and did not
    /// delete, for the words in `fresh` (a word not read this time keeps
    /// what was written for it, and the programs' own count decides
    /// whether anything is left of it).
    pub fn settle(
        &mut self,
        made: &HashMap<u64, Entries>,
        after: &HashMap<u64, Entries>,
        kept: &HashMap<u64, Entries>,
        fresh: [bool; COUNTED],
    ) -> Settlement {
        let mut out = Settlement::default();
        let cgroups: BTreeSet<u64> = made.keys().chain(after.keys()).chain(kept.keys()).chain(self.written.keys()).copied().collect();
        for cg in cgroups {
            let m = made.get(&cg).copied().unwrap_or_default();
            let a = after.get(&cg).copied().unwrap_or_default();
            let k = kept.get(&cg).copied().unwrap_or_default();
            let before = self.written.get(&cg).copied();
            let was = before.unwrap_or_default();
            let mut gone = Entries::ZERO;
            let mut held = false;
            for (w, read) in fresh.iter().enumerate() {
                let freed = ledger::freed(w).map_or(0, |f| a.words[f]);
                let (k, was) = (k.words[w], was.words[w]);
                if *read {
                    gone.words[w] = m.words[w].wrapping_sub(freed).wrapping_sub(k);
                    held |= k > 0;
                } else {
                    gone.words[w] = was;
                    held |= ledger::live(a.net(w), was) > 0;
                }
            }
            if !held {
                if before.is_some() || made.contains_key(&cg) || after.contains_key(&cg) {
                    out.forget.push(cg);
                }
                self.written.remove(&cg);
            } else if before != Some(gone) {
                out.put.push((cg, gone));
                self.written.insert(cg, gone);
            }
        }
        out
    }

    /// Reads the programs' *made* map whole (before the maps it counts).
    pub fn read_made(ebpf: &aya::Ebpf, made: &'static str) -> Result<HashMap<u64, Entries>, MapError> {
        Ok(maps::hash_entries::<u64, Entries>(ebpf, made)?.into_iter().collect())
    }

    /// Writes a settlement: *gone* records put, forgotten cgroups' *gone*
    /// records deleted before their *made* ones (in between, a program
    /// counts high, not low). A record the *gone* map has no room for is
    /// left out (the programs then count the cgroup's keys high).
    pub fn apply(ebpf: &mut aya::Ebpf, made: &'static str, gone: &'static str, s: &Settlement) -> Result<(), MapError> {
        if !s.put.is_empty() {
            let mut m: aya::maps::HashMap<_, u64, Entries> =
                aya::maps::HashMap::try_from(ebpf.map_mut(gone).ok_or(MapError::Missing(gone))?)
                    .map_err(|source| MapError::Map { map: gone, source })?;
            for (cg, e) in &s.put {
                let _ = m.insert(cg, e, 0);
            }
        }
        maps::hash_delete::<u64, Entries>(ebpf, gone, &s.forget)?;
        maps::hash_delete::<u64, Entries>(ebpf, made, &s.forget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_common::ledger::{AUX, AUX2, LAT, STATS, WORDS};

    fn e(stats: u64, lat: u64, aux: u64) -> Entries {
        let mut e = Entries::ZERO;
        e.words[..3].copy_from_slice(&[stats, lat, aux]);
        e
    }

    /// A record with `made` keys by `word` and `freed` of them deleted by
    /// the programs.
    fn deleted(word: usize, made: u64, freed: u64) -> Entries {
        let mut e = Entries::ZERO;
        e.words[word] = made;
        e.words[ledger::freed(word).expect("a word with deletions")] = freed;
        e
    }

    const ALL: [bool; COUNTED] = [true; COUNTED];

    fn none() -> HashMap<u64, Entries> {
        HashMap::new()
    }

    #[test]
    fn gone_is_made_less_kept_and_written_when_it_changes() {
        let mut l = Ledger::default();
        let made: HashMap<u64, Entries> = [(7, e(10, 4, 2))].into();
        let kept: HashMap<u64, Entries> = [(7, e(6, 4, 2))].into();
        let s = l.settle(&made, &made, &kept, ALL);
        assert_eq!(s, Settlement { put: vec![(7, e(4, 0, 0))], forget: vec![] });
        assert_eq!(ledger::live(10, 4), 6);
        // Nothing changed: nothing written.
        assert_eq!(l.settle(&made, &made, &kept, ALL), Settlement::default());
        assert_eq!(l.len(), 1);
        assert_eq!(Entries::ZERO.words.len(), WORDS);
    }

    #[test]
    fn a_cgroup_with_nothing_left_is_forgotten() {
        let mut l = Ledger::default();
        let m: HashMap<u64, Entries> = [(7, e(3, 1, 0))].into();
        l.settle(&m, &m, &m, ALL);
        let s = l.settle(&m, &m, &none(), ALL);
        assert_eq!(s, Settlement { put: vec![], forget: vec![7] });
        assert!(l.is_empty());
        // A made record alone (the agent never wrote one) is deleted too.
        let m: HashMap<u64, Entries> = [(8, e(1, 0, 0))].into();
        let s = l.settle(&m, &m, &none(), ALL);
        assert_eq!(s.forget, vec![8]);
        // Nothing at all: nothing to do.
        assert_eq!(l.settle(&none(), &none(), &none(), ALL), Settlement::default());
    }

    #[test]
    fn an_add_lost_with_a_forgotten_record_is_right_at_the_next_settlement() {
        let mut l = Ledger::default();
        // The agent forgets cgroup 7 as a program makes a key for it: the
        // add went into the record deleted, so made says 0 while 1 is kept.
        let s = l.settle(&none(), &none(), &[(7, e(1, 0, 0))].into(), ALL);
        let gone = s.put[0].1;
        assert_eq!(gone.words[STATS], u64::MAX, "0 made less 1 kept, wrapped");
        // The program's next key: made 1, so it holds 1 - (-1) = 2.
        assert_eq!(ledger::live(1, gone.words[STATS]), 2);
    }

    #[test]
    fn a_word_not_read_keeps_its_reckoning_and_the_programs_count_says_if_any_is_left() {
        let mut l = Ledger::default();
        // Sockets read: 5 followed of 6 made (one closed while read).
        l.settle(&[(7, deleted(AUX, 6, 0))].into(), &[(7, deleted(AUX, 6, 1))].into(), &[(7, e(0, 0, 5))].into(), ALL);
        let not_socks = [true, true, false, true, true];
        // Not read this time: its gone (0) kept; the programs count 7 made,
        // 4 closed, so 3 are followed and the cgroup is kept.
        let now: HashMap<u64, Entries> = [(7, deleted(AUX, 7, 4))].into();
        let s = l.settle(&now, &now, &none(), not_socks);
        assert_eq!(s, Settlement::default());
        // All 7 closed: none left; forgotten.
        let now: HashMap<u64, Entries> = [(7, deleted(AUX, 7, 7))].into();
        let s = l.settle(&now, &now, &none(), not_socks);
        assert_eq!(s.forget, vec![7]);
        let mut counts = HashMap::new();
        count(&mut counts, LAT, [7u64, 7, 9], |c| *c);
        count(&mut counts, AUX, [9u64], |c| *c);
        assert_eq!(counts[&7], e(0, 2, 0));
        assert_eq!(counts[&9], e(0, 1, 1));
    }

    /// A cgroup holds 5 waiting queries; between the agent's read of made
    /// and its read of the map, a response deletes one: the agent reads 4.
    /// Its count must not fall below the 4 it holds, or it could pass its
    /// limit until the next scrape. Counted in the same word (one less at
    /// each deletion, made read before the map), it would hold 3: the
    /// deleted key counted neither in made nor in what was kept. A query
    /// made and answered meanwhile as well counts high (5), never low.
    #[test]
    fn a_key_a_program_deletes_while_the_agent_reads_never_counts_low() {
        let before: HashMap<u64, Entries> = [(7, deleted(AUX2, 5, 0))].into();
        let mut k = Entries::ZERO;
        k.words[AUX2] = 4;
        let kept: HashMap<u64, Entries> = [(7, k)].into();
        let held = |after: Entries| {
            let s = Ledger::default().settle(&before, &[(7, after)].into(), &kept, ALL);
            ledger::live(after.net(AUX2), s.put[0].1.words[AUX2])
        };
        assert_eq!(held(deleted(AUX2, 5, 1)), 4);
        assert_eq!(held(deleted(AUX2, 6, 2)), 5, "a query made and answered while read, counted high until the next scrape");
        // The same read with deletions one less in the made word: low.
        let (net_before, net_after) = (5u64, 4u64);
        assert_eq!(ledger::live(net_after, net_before - 4), 3, "one fewer than held");
    }
}
