//! The handle table: every file handle open on the mount, what it reads and how, in shared
//! memory, so that a successor daemon serves the handles its predecessor opened: the same
//! object version (a read never mixes two versions of a file), and for passthrough handles
//! the same backing id (the kernel refuses a second backing file on an inode that has one).
//!
//! Layout: a 4 KiB header (magic, format, the next file handle number, and the INIT
//! parameters as JSON, see [`super::InitParams`]), then
//! 128-byte slots. A slot is `fh | ino | size | backing id (u32) and ETag length (u32) |
//! ETag (up to 96 bytes)`; `fh` is written last (release) and is 0 while the slot is free,
//! so a reader sees a slot whole or not at all. A slot is filled before the open's reply is
//! sent and cleared at release, so the table holds exactly the handles the kernel can name.
//! Handle numbers come from the header's counter, which a successor continues, so no number
//! is ever given twice on one connection. Directory handles are not recorded: a successor
//! lists the directory again when it sees one it does not know.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use parking_lot::Mutex;

use super::shared::Region;

const MAGIC: u64 = u64::from_le_bytes(*b"RIFHANDL");
const FORMAT: u64 = 1;
const HEADER: u64 = 4096;
const OFF_MAGIC: u64 = 0;
const OFF_FORMAT: u64 = 8;
const OFF_NEXT_FH: u64 = 16;
const OFF_PARAMS_LEN: u64 = 24;
const OFF_PARAMS: u64 = 64;
const SLOT: u64 = 128;
const ETAG_MAX: usize = 96;
/// Address space reserved: half a million open handles.
const RESERVE: usize = 64 << 20;

/// One open file handle as the table records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleRecord {
    pub fh: u64,
    pub ino: u64,
    pub size: u64,
    pub etag: String,
    /// The passthrough backing id the handle reads through, if any.
    pub backing: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("handle table: {0}")]
    Io(#[from] std::io::Error),
    #[error("handle table: not a table of this format")]
    Format,
    #[error("handle table: INIT parameters unreadable: {0}")]
    Params(String),
}

/// See the module documentation.
pub struct HandleTable {
    region: Region,
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    by_fh: HashMap<u64, u64>,
    free: Vec<u64>,
    /// Slots ever used.
    used: u64,
}

impl HandleTable {
    pub fn create() -> Result<HandleTable, TableError> {
        let region = Region::create("riffle-handles", RESERVE)?;
        region.ensure(HEADER)?;
        region.word(OFF_FORMAT).store(FORMAT, Ordering::Relaxed);
        region.word(OFF_NEXT_FH).store(1, Ordering::Relaxed);
        region.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(HandleTable {
            region,
            slots: Mutex::default(),
        })
    }

    /// A table a predecessor kept. Its slots are read by [`Self::take_over`], once the
    /// predecessor has stopped serving: until then it may still open and release handles.
    pub fn open(fd: std::os::fd::OwnedFd) -> Result<HandleTable, TableError> {
        let region = Region::open(fd, RESERVE)?;
        if region.size() < HEADER
            || region.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || region.word(OFF_FORMAT).load(Ordering::Relaxed) != FORMAT
        {
            return Err(TableError::Format);
        }
        Ok(HandleTable {
            region,
            slots: Mutex::default(),
        })
    }

    /// Takes the slots over as the predecessor left them and returns the handles recorded
    /// there. Called by the successor once it holds the serving lock (no other process writes
    /// the table from then on), before it records a handle of its own.
    pub fn take_over(&self) -> Result<Vec<HandleRecord>, TableError> {
        let size = self.region.refresh()?;
        let capacity = (size - HEADER) / SLOT;
        let mut slots = self.slots.lock();
        *slots = Slots::default();
        for slot in 0..capacity {
            let fh = self.slot_word(slot, 0).load(Ordering::Acquire);
            if fh == 0 {
                slots.free.push(slot);
            } else {
                slots.by_fh.insert(fh, slot);
            }
        }
        slots.free.reverse();
        slots.used = capacity;
        drop(slots);
        Ok(self.live())
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// A new handle number, never given before on this connection.
    pub fn next_fh(&self) -> u64 {
        self.region.word(OFF_NEXT_FH).fetch_add(1, Ordering::AcqRel)
    }

    /// Saves the connection's INIT parameters (once, at the first INIT).
    pub fn set_params(&self, json: &[u8]) -> Result<(), TableError> {
        if json.len() as u64 > HEADER - OFF_PARAMS {
            return Err(TableError::Params("too long".into()));
        }
        self.region.write(OFF_PARAMS, json);
        self.region
            .word(OFF_PARAMS_LEN)
            .store(json.len() as u64, Ordering::Release);
        Ok(())
    }

    /// The INIT parameters saved by [`Self::set_params`].
    pub fn params(&self) -> Result<Vec<u8>, TableError> {
        let len = self.region.word(OFF_PARAMS_LEN).load(Ordering::Acquire);
        if len == 0 || len > HEADER - OFF_PARAMS {
            return Err(TableError::Params("none saved".into()));
        }
        let mut out = vec![0u8; len as usize];
        self.region.read(OFF_PARAMS, &mut out);
        Ok(out)
    }

    fn slot_word(&self, slot: u64, field: u64) -> &std::sync::atomic::AtomicU64 {
        self.region.word(HEADER + slot * SLOT + field)
    }

    /// Records open handle `fh`; false (and nothing recorded) when it cannot be.
    pub fn record(&self, record: &HandleRecord) -> bool {
        if record.fh == 0 || record.etag.len() > ETAG_MAX {
            return false;
        }
        let mut slots = self.slots.lock();
        let slot = match slots.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = slots.used;
                if self.region.ensure(HEADER + (slot + 1) * SLOT).is_err() {
                    return false;
                }
                slots.used += 1;
                slot
            }
        };
        let base = HEADER + slot * SLOT;
        self.slot_word(slot, 8).store(record.ino, Ordering::Relaxed);
        self.slot_word(slot, 16)
            .store(record.size, Ordering::Relaxed);
        let backing = u64::from(record.backing.unwrap_or(0));
        self.slot_word(slot, 24).store(
            backing | ((record.etag.len() as u64) << 32),
            Ordering::Relaxed,
        );
        self.region.write(base + 32, record.etag.as_bytes());
        self.slot_word(slot, 0).store(record.fh, Ordering::Release);
        slots.by_fh.insert(record.fh, slot);
        true
    }

    /// Forgets handle `fh` (released); nothing if it was not recorded.
    pub fn release(&self, fh: u64) {
        let mut slots = self.slots.lock();
        if let Some(slot) = slots.by_fh.remove(&fh) {
            self.slot_word(slot, 0).store(0, Ordering::Release);
            slots.free.push(slot);
        }
    }

    /// Every recorded handle.
    pub fn live(&self) -> Vec<HandleRecord> {
        let slots = self.slots.lock();
        let mut out: Vec<HandleRecord> = slots
            .by_fh
            .iter()
            .map(|(&fh, &slot)| {
                let packed = self.slot_word(slot, 24).load(Ordering::Relaxed);
                let backing = (packed & 0xffff_ffff) as u32;
                let len = ((packed >> 32) as usize).min(ETAG_MAX);
                let mut etag = vec![0u8; len];
                self.region.read(HEADER + slot * SLOT + 32, &mut etag);
                HandleRecord {
                    fh,
                    ino: self.slot_word(slot, 8).load(Ordering::Relaxed),
                    size: self.slot_word(slot, 16).load(Ordering::Relaxed),
                    etag: String::from_utf8_lossy(&etag).into_owned(),
                    backing: (backing != 0).then_some(backing),
                }
            })
            .collect();
        out.sort_by_key(|r| r.fh);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(fh: u64, backing: Option<u32>) -> HandleRecord {
        HandleRecord {
            fh,
            ino: fh + 100,
            size: 4096 * fh,
            etag: format!("\"etag-{fh}\""),
            backing,
        }
    }

    #[test]
    fn a_successor_sees_the_open_handles_and_continues_the_numbers() {
        let table = HandleTable::create().unwrap();
        table.set_params(br#"{"x":1}"#).unwrap();
        let fhs: Vec<u64> = (0..5).map(|_| table.next_fh()).collect();
        assert_eq!(fhs, vec![1, 2, 3, 4, 5]);
        for &fh in &fhs {
            assert!(table.record(&record(fh, (fh % 2 == 0).then_some(fh as u32))));
        }
        table.release(2);
        table.release(4);
        let fd = table.region().fd().try_clone_to_owned().unwrap();
        drop(table);
        let successor = HandleTable::open(fd).unwrap();
        assert_eq!(
            successor.take_over().unwrap(),
            vec![record(1, None), record(3, None), record(5, None)]
        );
        assert_eq!(successor.params().unwrap(), br#"{"x":1}"#);
        assert_eq!(successor.next_fh(), 6);
        // Freed slots are reused, handles released by the successor leave the table.
        assert!(successor.record(&record(6, Some(9))));
        successor.release(1);
        assert_eq!(
            successor.live(),
            vec![record(3, None), record(5, None), record(6, Some(9))]
        );
    }

    /// A successor opens the table while its predecessor still serves (it waits for the
    /// serving lock): what the predecessor records and releases meanwhile, in slots past the
    /// first megabyte too, is what the successor takes over.
    #[test]
    fn a_successor_takes_over_what_the_predecessor_did_after_it_opened_the_table() {
        let predecessor = HandleTable::create().unwrap();
        predecessor.set_params(b"{}").unwrap();
        assert!(predecessor.record(&record(1, Some(7))));
        let successor =
            HandleTable::open(predecessor.region().fd().try_clone_to_owned().unwrap()).unwrap();
        // Enough handles to grow the table past its first step.
        let many = 2 * (super::super::shared::GROW_STEP / SLOT);
        for fh in 2..=many {
            assert!(predecessor.record(&record(fh, Some(fh as u32))));
        }
        predecessor.release(1);
        drop(predecessor);
        let live = successor.take_over().unwrap();
        assert_eq!(live.len() as u64, many - 1);
        assert_eq!(live.first(), Some(&record(2, Some(2))));
        assert_eq!(live.last(), Some(&record(many, Some(many as u32))));
        // A new record takes the freed slot, not one of the predecessor's.
        assert!(successor.record(&record(many + 1, None)));
        assert_eq!(successor.live().len() as u64, many);
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let region = Region::create("not-a-table", 1 << 20).unwrap();
        region.ensure(HEADER).unwrap();
        let fd = region.fd().try_clone_to_owned().unwrap();
        assert!(matches!(HandleTable::open(fd), Err(TableError::Format)));
    }
}
