//! The node journal: every inode the namespace hands out, in the order it hands them out, so
//! a successor daemon rebuilds the same inode numbers (the kernel keeps using the ones it was
//! given) without asking the store.
//!
//! Inode numbers are positions in the namespace's node table (ino 1 is the root, then one per
//! node created), and nodes are only ever added, so the journal is append-only: record `i`
//! is inode `i + 2`. A record is `parent (u64 LE) | kind (u8: 0 file, 1 directory) | name
//! length (u16 LE) | name`. It is written first and published second: the header's end
//! offset and count are stored (release) after the bytes, so a reader (acquire) never sees a
//! half-written record, and a daemon killed mid-append leaves the journal as it was before.
//! Appends happen under the namespace's tree lock, in inode order.
//!
//! The cost is about 11 bytes plus the name per listed object, in shared memory (a memfd,
//! charged to the daemon's memory cgroup like its heap).

use std::sync::atomic::Ordering;

use super::shared::Region;
use crate::namespace::{NodeLog, RestoredNode as NodeRecord};

const MAGIC: u64 = u64::from_le_bytes(*b"RIFNODES");
const FORMAT: u64 = 1;
const HEADER: u64 = 64;
const OFF_MAGIC: u64 = 0;
const OFF_FORMAT: u64 = 8;
const OFF_END: u64 = 16;
const OFF_COUNT: u64 = 24;
/// Non-zero once an append failed: the journal no longer matches the tree.
const OFF_BROKEN: u64 = 32;
/// Address space reserved for the journal: about 100 million objects.
pub const RESERVE: usize = 4 << 30;

/// See the module documentation.
pub struct NodeJournal {
    region: Region,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("node journal: {0}")]
    Io(#[from] std::io::Error),
    #[error("node journal: not a journal of this format")]
    Format,
    #[error("node journal: a record could not be written, so it does not match the tree")]
    Broken,
    #[error("node journal: torn record at offset {0}")]
    Torn(u64),
}

impl NodeJournal {
    /// A new, empty journal.
    pub fn create() -> Result<NodeJournal, JournalError> {
        let region = Region::create("riffle-nodes", RESERVE)?;
        region.ensure(HEADER)?;
        region.word(OFF_FORMAT).store(FORMAT, Ordering::Relaxed);
        region.word(OFF_END).store(HEADER, Ordering::Relaxed);
        region.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(NodeJournal { region })
    }

    /// A journal a predecessor wrote (from the keeper).
    pub fn open(fd: std::os::fd::OwnedFd) -> Result<NodeJournal, JournalError> {
        let region = Region::open(fd, RESERVE)?;
        if region.size() < HEADER
            || region.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || region.word(OFF_FORMAT).load(Ordering::Relaxed) != FORMAT
        {
            return Err(JournalError::Format);
        }
        if region.word(OFF_BROKEN).load(Ordering::Acquire) != 0 {
            return Err(JournalError::Broken);
        }
        Ok(NodeJournal { region })
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Nodes recorded (the root not counted).
    pub fn count(&self) -> u64 {
        self.region.word(OFF_COUNT).load(Ordering::Acquire)
    }

    /// Every recorded node, in inode order. A successor reads them once it holds the serving
    /// lock: until then its predecessor may still append (and grow the file).
    pub fn records(&self) -> Result<Vec<NodeRecord>, JournalError> {
        self.region.refresh()?;
        if self.region.word(OFF_BROKEN).load(Ordering::Acquire) != 0 {
            return Err(JournalError::Broken);
        }
        let end = self.region.word(OFF_END).load(Ordering::Acquire);
        let count = self.count();
        let mut out = Vec::with_capacity(count as usize);
        let mut at = HEADER;
        while at < end {
            let mut head = [0u8; 11];
            if !self.region.read(at, &mut head) {
                return Err(JournalError::Torn(at));
            }
            let parent = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
            let is_dir = head[8] == 1;
            let len = u16::from_le_bytes([head[9], head[10]]) as usize;
            let mut name = vec![0u8; len];
            if at + 11 + len as u64 > end || !self.region.read(at + 11, &mut name) {
                return Err(JournalError::Torn(at));
            }
            let name = String::from_utf8(name).map_err(|_| JournalError::Torn(at))?;
            out.push(NodeRecord {
                ino: out.len() as u64 + 2,
                parent,
                is_dir,
                name,
            });
            at += 11 + len as u64;
        }
        if out.len() as u64 != count {
            return Err(JournalError::Torn(at));
        }
        Ok(out)
    }

    fn append(&self, parent: u64, is_dir: bool, name: &str) -> Result<(), JournalError> {
        let end = self.region.word(OFF_END).load(Ordering::Relaxed);
        let len = u16::try_from(name.len()).map_err(|_| JournalError::Broken)?;
        let size = 11 + u64::from(len);
        self.region.ensure(end + size)?;
        let mut head = [0u8; 11];
        head[..8].copy_from_slice(&parent.to_le_bytes());
        head[8] = u8::from(is_dir);
        head[9..].copy_from_slice(&len.to_le_bytes());
        self.region.write(end, &head);
        self.region.write(end + 11, name.as_bytes());
        self.region.word(OFF_COUNT).fetch_add(1, Ordering::Release);
        self.region
            .word(OFF_END)
            .store(end + size, Ordering::Release);
        Ok(())
    }
}

impl NodeLog for NodeJournal {
    fn created(&self, ino: u64, parent: u64, is_dir: bool, name: &str) {
        if self.region.word(OFF_BROKEN).load(Ordering::Relaxed) != 0 {
            return;
        }
        let expected = self.count() + 2;
        let result = if ino == expected {
            self.append(parent, is_dir, name)
        } else {
            Err(JournalError::Broken)
        };
        if let Err(e) = result {
            self.region.word(OFF_BROKEN).store(1, Ordering::Release);
            tracing::warn!(error = %e, ino, expected, "the node journal stopped; a successor daemon will not be able to resume this mount");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_inode_order_through_a_copy_of_the_descriptor() {
        let journal = NodeJournal::create().unwrap();
        journal.created(2, 1, true, "train");
        journal.created(3, 2, false, "a.jpg");
        journal.created(4, 2, false, "é ü.jpg");
        let fd = journal.region().fd().try_clone_to_owned().unwrap();
        drop(journal);
        let again = NodeJournal::open(fd).unwrap();
        let records = again.records().unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(
            records[2],
            NodeRecord {
                ino: 4,
                parent: 2,
                is_dir: false,
                name: "é ü.jpg".into()
            }
        );
        assert!(records[0].is_dir);
    }

    #[test]
    fn an_out_of_order_inode_breaks_the_journal_and_a_successor_refuses_it() {
        let journal = NodeJournal::create().unwrap();
        journal.created(2, 1, false, "a");
        journal.created(4, 1, false, "c");
        let fd = journal.region().fd().try_clone_to_owned().unwrap();
        assert!(matches!(NodeJournal::open(fd), Err(JournalError::Broken)));
    }

    #[test]
    fn a_half_written_record_is_not_seen() {
        let journal = NodeJournal::create().unwrap();
        journal.created(2, 1, false, "a");
        // Bytes of a next record written but not published (a kill between the two).
        let end = journal.region.word(OFF_END).load(Ordering::Relaxed);
        journal.region.ensure(end + 20).unwrap();
        journal.region.write(end, &[9u8; 20]);
        assert_eq!(journal.records().unwrap().len(), 1);
    }
}
