//! The FUSE-over-io_uring ABI (`linux/fuse.h`, protocol 7.42, Linux 6.14+).
//!
//! Each ring entry is two buffers the server registers with the kernel: a header buffer
//! ([`ReqHeader`]: the `fuse_in_header`/`fuse_out_header` area, the operation's fixed
//! argument, and the entry's own in/out record) and a payload buffer (every other argument,
//! and the whole reply after its header).

use std::mem::size_of;

use crate::ll::fuse_abi as abi;
use crate::ll::fuse_abi::fuse_opcode as op;

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for the in (40 bytes) or out (16 bytes) header.
pub(crate) const IN_OUT_HEADER_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for an operation's fixed-size argument.
pub(crate) const OP_IN_OUT_SZ: usize = 128;

/// `enum fuse_uring_cmd`.
pub(crate) const CMD_REGISTER: u32 = 1;
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct EntInOut {
    pub(crate) flags: u64,
    /// The request's `unique`, to be given back with the commit.
    pub(crate) commit_id: u64,
    /// Bytes used in the payload buffer (the kernel's on the way in, ours on the way out).
    pub(crate) payload_sz: u32,
    pub(crate) padding: u32,
    pub(crate) reserved: u64,
}

/// `struct fuse_uring_req_header`.
#[repr(C)]
pub(crate) struct ReqHeader {
    pub(crate) in_out: [u8; IN_OUT_HEADER_SZ],
    pub(crate) op_in: [u8; OP_IN_OUT_SZ],
    pub(crate) ring_ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`: the command area of the 128-byte SQE.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct CmdReq {
    pub(crate) flags: u64,
    pub(crate) commit_id: u64,
    pub(crate) qid: u16,
    pub(crate) padding: [u8; 6],
}

impl CmdReq {
    /// The 80-byte command area of an `IORING_OP_URING_CMD` SQE holding this request.
    pub(crate) fn to_cmd(self) -> [u8; 80] {
        let mut cmd = [0u8; 80];
        cmd[0..8].copy_from_slice(&self.flags.to_ne_bytes());
        cmd[8..16].copy_from_slice(&self.commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_ne_bytes());
        cmd
    }
}

/// The size of the fixed argument the kernel puts in `op_in` for `opcode` (its first
/// argument, `in_args[0]`, which since Linux 6.14 is always the operation's header, empty
/// for operations that have none, such as `LOOKUP`). Everything after it is in the payload.
/// The in-header's `len` cannot tell it: the kernel does not set it for background requests
/// (asynchronous reads, releases) sent over the ring. Operations this table does not know are
/// given an empty header: the parser then sees the payload only and fuser answers `ENOSYS`.
pub(crate) fn op_header_len(opcode: u32) -> usize {
    let Ok(code) = op::try_from(opcode) else {
        return 0;
    };
    match code {
        op::FUSE_GETATTR => size_of::<abi::fuse_getattr_in>(),
        op::FUSE_SETATTR => size_of::<abi::fuse_setattr_in>(),
        op::FUSE_MKNOD => size_of::<abi::fuse_mknod_in>(),
        op::FUSE_MKDIR => size_of::<abi::fuse_mkdir_in>(),
        op::FUSE_RENAME => size_of::<abi::fuse_rename_in>(),
        op::FUSE_RENAME2 => size_of::<abi::fuse_rename2_in>(),
        op::FUSE_LINK => size_of::<abi::fuse_link_in>(),
        op::FUSE_OPEN | op::FUSE_OPENDIR => size_of::<abi::fuse_open_in>(),
        op::FUSE_CREATE => size_of::<abi::fuse_create_in>(),
        op::FUSE_READ | op::FUSE_READDIR | op::FUSE_READDIRPLUS => size_of::<abi::fuse_read_in>(),
        op::FUSE_WRITE => size_of::<abi::fuse_write_in>(),
        op::FUSE_RELEASE | op::FUSE_RELEASEDIR => size_of::<abi::fuse_release_in>(),
        op::FUSE_FLUSH => size_of::<abi::fuse_flush_in>(),
        op::FUSE_FSYNC | op::FUSE_FSYNCDIR => size_of::<abi::fuse_fsync_in>(),
        // Without FUSE_SETXATTR_EXT (fuser never asks for it) the short form.
        op::FUSE_SETXATTR => size_of::<abi::fuse_setxattr_in>(),
        op::FUSE_GETXATTR | op::FUSE_LISTXATTR => size_of::<abi::fuse_getxattr_in>(),
        op::FUSE_GETLK | op::FUSE_SETLK | op::FUSE_SETLKW => size_of::<abi::fuse_lk_in>(),
        op::FUSE_ACCESS => size_of::<abi::fuse_access_in>(),
        op::FUSE_BMAP => size_of::<abi::fuse_bmap_in>(),
        op::FUSE_IOCTL => size_of::<abi::fuse_ioctl_in>(),
        op::FUSE_POLL => size_of::<abi::fuse_poll_in>(),
        op::FUSE_FALLOCATE => size_of::<abi::fuse_fallocate_in>(),
        op::FUSE_LSEEK => size_of::<abi::fuse_lseek_in>(),
        op::FUSE_COPY_FILE_RANGE => size_of::<abi::fuse_copy_file_range_in>(),
        // LOOKUP, UNLINK, RMDIR, SYMLINK, REMOVEXATTR (a name in the payload), READLINK,
        // STATFS, DESTROY (nothing); FORGET, BATCH_FORGET, INTERRUPT and INIT never come over
        // the ring.
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_kernel() {
        // Sizes from linux/fuse.h 7.42.
        assert_eq!(size_of::<EntInOut>(), 32);
        assert_eq!(size_of::<ReqHeader>(), 288);
        assert_eq!(size_of::<CmdReq>(), 24);
        assert_eq!(size_of::<abi::fuse_in_header>(), 40);
        assert_eq!(size_of::<abi::fuse_out_header>(), 16);
    }

    #[test]
    fn operation_headers_have_their_abi_sizes() {
        assert_eq!(op_header_len(op::FUSE_LOOKUP as u32), 0);
        assert_eq!(op_header_len(op::FUSE_GETATTR as u32), 16);
        assert_eq!(op_header_len(op::FUSE_OPEN as u32), 8);
        assert_eq!(op_header_len(op::FUSE_READ as u32), 40);
        assert_eq!(op_header_len(op::FUSE_RELEASE as u32), 24);
        assert_eq!(op_header_len(op::FUSE_FLUSH as u32), 24);
        assert_eq!(op_header_len(op::FUSE_READDIRPLUS as u32), 40);
        assert_eq!(op_header_len(op::FUSE_STATFS as u32), 0);
        assert_eq!(op_header_len(9999), 0);
    }

    #[test]
    fn the_command_area_holds_the_request_at_its_offsets() {
        let cmd = CmdReq {
            flags: 0,
            commit_id: 0x1122_3344_5566_7788,
            qid: 3,
            padding: [0; 6],
        }
        .to_cmd();
        assert_eq!(&cmd[8..16], &0x1122_3344_5566_7788u64.to_ne_bytes());
        assert_eq!(&cmd[16..18], &3u16.to_ne_bytes());
    }
}
