//! The keeper protocol: how a daemon gives its bundle (the `/dev/fuse` descriptor, the node
//! journal, the handle table, then the clones of `/dev/fuse` its other FUSE threads read) to a
//! keeper, and how a successor takes it back.
//!
//! One message per `SOCK_SEQPACKET` packet: a line of text, `VERB VERSION [detail]`, with
//! the descriptors attached (`SCM_RIGHTS`) where the verb carries a bundle.
//! - `HOLD 1` + bundle: the daemon's, once its connection is initialised. Answer `OK 1`.
//! - `TAKE 1`: a successor asks. Answer `GIVE 1` + bundle (copies: the keeper keeps its
//!   own), `BUSY 1` while another successor holds the lease (a lease ends when its socket
//!   closes, so a successor that dies mid-handover frees it), or `NONE 1` when nothing is
//!   held (`STARTING 1` from a store that started less than [`STORE_SETTLES`] ago: ask
//!   again).
//! - Anything else, or another version: `ERR 1 <reason>`; the asker stops.
//!
//! The version lets an old keeper and a new daemon (or the reverse) detect that they do not
//! speak the same protocol and fail with a clear reason instead of misreading each other.
//!
//! ## The bundle
//! `[fuse, nodes, handles, clone 1, …, clone K]`: [`BASE_FDS`] descriptors, then `K` ≤
//! [`MAX_CLONES`] clones of `fuse` (`FUSE_DEV_IOC_CLONE`), one per FUSE thread after the first
//! (`--fuse-threads` is at most [`MAX_DEVICES`], 64). A clone must be held wherever `fuse` is:
//! the kernel ends the requests a clone had carried when its last holder closes it, and
//! only the requests of clones still open are resent to a successor (`fs::handover`). So
//! keepers, adopters and stores hold and give the bundle whole, whatever its length, and a
//! receiver's control buffer has room for the largest ([`MAX_BUNDLE_FDS`], 66: 280 bytes). A bundle of any length from 3 to 66 is valid: 3 is one made by a daemon with one
//! FUSE thread or by a build from before the clones, and its successor serves with the one
//! descriptor (its other threads share it), never with a clone nobody else holds.
//!
//! **No version bump for the clones** (still version 1). The lines, the verbs and the first
//! three descriptors mean what they meant; only the count after them grows, and
//! `SCM_RIGHTS` carries the count, so a build of now reads a 3-descriptor bundle of a build
//! from before as it always did. The other way round there is nothing to misread either: a
//! build from before, given more than three, cannot receive the message at all (its control
//! buffer holds 4 descriptors: the kernel truncates it, `MSG_CTRUNC`, and it answers `ERR 1
//! keeper socket: ENOBUFS`), which the sender sees as a refusal: a first daemon then serves
//! without a keeper and says so, a keeper retries its store every second (each try leaves the
//! descriptors the kernel did install open in that store, until it restarts). A version 2 would
//! only change that error's words, and would cost every later build the code to speak both
//! versions; the builds that knew only three descriptors were never released (0.1.0 is the
//! first release and carries the clones), so no such peer exists outside development.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// The descriptors every bundle starts with: `/dev/fuse`, the node journal, the handle table.
pub const BASE_FDS: usize = 3;
/// Clones of the `/dev/fuse` descriptor a bundle may carry after [`BASE_FDS`]: one per FUSE
/// thread after the first, so `--fuse-threads` is at most [`MAX_DEVICES`].
pub const MAX_CLONES: usize = 63;
/// `/dev/fuse` descriptors a bundle may carry: the first and its clones.
pub const MAX_DEVICES: usize = 1 + MAX_CLONES;
/// Descriptors in the largest bundle.
pub const MAX_BUNDLE_FDS: usize = BASE_FDS + MAX_CLONES;

/// Whether `n` descriptors make a bundle.
pub fn is_bundle(n: usize) -> bool {
    (BASE_FDS..=MAX_BUNDLE_FDS).contains(&n)
}

/// A bundle in protocol order: the connection's `/dev/fuse` descriptor, the node journal,
/// the handle table, then the connection's clones (descriptors owned or borrowed alike).
pub fn bundle<F>(fuse: F, nodes: F, handles: F, clones: impl IntoIterator<Item = F>) -> Vec<F> {
    [fuse, nodes, handles].into_iter().chain(clones).collect()
}

/// The parts of a bundle, [`bundle`]'s inverse: `[fuse, nodes, handles]` and the clones;
/// `None` for a count of descriptors no bundle has.
pub fn unbundle<F>(mut fds: Vec<F>) -> Option<([F; BASE_FDS], Vec<F>)> {
    if !is_bundle(fds.len()) {
        return None;
    }
    let clones = fds.split_off(BASE_FDS);
    let base: [F; BASE_FDS] = fds.try_into().ok()?;
    Some((base, clones))
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("keeper socket: {0}")]
    Io(#[from] nix::Error),
    #[error("the keeper closed the connection")]
    Closed,
    #[error("keeper protocol: unexpected message '{0}'")]
    Unexpected(String),
    #[error("keeper protocol: the other side speaks version {0}, this build speaks {VERSION}")]
    Version(u32),
    #[error("keeper refused: {0}")]
    Refused(String),
    #[error("another successor holds the connection")]
    Busy,
    #[error("the keeper holds no connection")]
    Nothing,
    #[error("the fd store has just started and has not heard from every keeper yet")]
    Starting,
}

/// One message. `key` names one mount's bundle where one process keeps several (the fd
/// store, `riffle fd-store`); a keeper and its daemon leave it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hold(Option<String>),
    Ok,
    Take(Option<String>),
    Give,
    Busy,
    None,
    /// A store that just started holds nothing of the mount yet: ask again (the live keepers
    /// are about to give it their bundles, see [`STORE_SETTLES`]).
    Starting,
    /// Forget the bundle of `key` (the mount ended).
    Drop(String),
    Err(String),
}

impl Message {
    fn line(&self) -> String {
        let keyed = |verb: &str, key: &Option<String>| match key {
            Some(key) => format!("{verb} {VERSION} {key}"),
            None => format!("{verb} {VERSION}"),
        };
        match self {
            Message::Hold(key) => keyed("HOLD", key),
            Message::Take(key) => keyed("TAKE", key),
            Message::Drop(key) => format!("DROP {VERSION} {key}"),
            Message::Ok => format!("OK {VERSION}"),
            Message::Give => format!("GIVE {VERSION}"),
            Message::Busy => format!("BUSY {VERSION}"),
            Message::None => format!("NONE {VERSION}"),
            Message::Starting => format!("STARTING {VERSION}"),
            Message::Err(reason) => format!("ERR {VERSION} {reason}"),
        }
    }

    fn parse(line: &str) -> Result<Message, ProtocolError> {
        let mut parts = line.splitn(3, ' ');
        let verb = parts.next().unwrap_or("");
        let version: u32 = parts
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ProtocolError::Unexpected(line.to_string()))?;
        if version != VERSION {
            return Err(ProtocolError::Version(version));
        }
        let rest = parts.next().map(str::to_string);
        let key = || {
            rest.clone()
                .filter(|k| !k.is_empty() && !k.contains(char::is_whitespace))
                .ok_or_else(|| ProtocolError::Unexpected(line.to_string()))
        };
        Ok(match verb {
            "HOLD" => Message::Hold(rest.clone().map(|_| key()).transpose()?),
            "TAKE" => Message::Take(rest.clone().map(|_| key()).transpose()?),
            "DROP" => Message::Drop(key()?),
            "OK" => Message::Ok,
            "GIVE" => Message::Give,
            "BUSY" => Message::Busy,
            "NONE" => Message::None,
            "STARTING" => Message::Starting,
            "ERR" => Message::Err(rest.unwrap_or_default()),
            _ => return Err(ProtocolError::Unexpected(line.to_string())),
        })
    }
}

/// A connected pair of keeper sockets (close-on-exec).
pub fn pair() -> Result<(OwnedFd, OwnedFd), ProtocolError> {
    Ok(socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?)
}

/// A connection to the seqpacket socket at `path` (a keeper's store).
pub fn connect(path: &std::path::Path) -> Result<OwnedFd, ProtocolError> {
    use nix::sys::socket::{connect as connect_to, socket, UnixAddr};
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    connect_to(fd.as_raw_fd(), &addr)?;
    Ok(fd)
}

/// Sends `message` with `fds` attached.
pub fn send(
    socket: BorrowedFd<'_>,
    message: &Message,
    fds: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    let line = message.line();
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let iov = [IoSlice::new(line.as_bytes())];
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(socket.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None)?;
    Ok(())
}

/// Receives one message and the descriptors attached to it.
pub fn recv(socket: BorrowedFd<'_>) -> Result<(Message, Vec<OwnedFd>), ProtocolError> {
    let mut buf = [0u8; 512];
    let mut space = nix::cmsg_space!([RawFd; MAX_BUNDLE_FDS]);
    let (bytes, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(received) = cmsg {
                // SAFETY: the kernel just installed these descriptors for us; nothing else
                // owns them.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    if bytes == 0 {
        return Err(ProtocolError::Closed);
    }
    let line = String::from_utf8_lossy(&buf[..bytes]);
    Ok((Message::parse(line.trim_end())?, fds))
}

/// Gives the bundle (of mount `key`, to a store) and waits for the `OK`.
pub fn hold(
    socket: BorrowedFd<'_>,
    key: Option<&str>,
    bundle: &[BorrowedFd<'_>],
) -> Result<(), ProtocolError> {
    send(socket, &Message::Hold(key.map(str::to_string)), bundle)?;
    match recv(socket)?.0 {
        Message::Ok => Ok(()),
        Message::Busy => Err(ProtocolError::Busy),
        Message::Err(reason) => Err(ProtocolError::Refused(reason)),
        other => Err(ProtocolError::Unexpected(other.line())),
    }
}

/// Takes the bundle (of mount `key`, from a store).
pub fn take(socket: BorrowedFd<'_>, key: Option<&str>) -> Result<Vec<OwnedFd>, ProtocolError> {
    send(socket, &Message::Take(key.map(str::to_string)), &[])?;
    match recv(socket)? {
        (Message::Give, fds) if is_bundle(fds.len()) => Ok(fds),
        (Message::Give, fds) => Err(ProtocolError::Unexpected(format!(
            "GIVE with {} descriptors",
            fds.len()
        ))),
        (Message::Busy, _) => Err(ProtocolError::Busy),
        (Message::None, _) => Err(ProtocolError::Nothing),
        (Message::Starting, _) => Err(ProtocolError::Starting),
        (Message::Err(reason), _) => Err(ProtocolError::Refused(reason)),
        (other, _) => Err(ProtocolError::Unexpected(other.line())),
    }
}

/// Serves one client of a keeper or a store: each message is given to `answer`, whose reply
/// (with its descriptors) goes back. Returns when the client closes its socket (`Ok`) or sends
/// something unreadable (after telling it why), or when a reply cannot be sent.
pub fn serve_client(
    socket: BorrowedFd<'_>,
    mut answer: impl FnMut(Message, Vec<OwnedFd>) -> (Message, Vec<OwnedFd>),
) -> Result<(), ProtocolError> {
    loop {
        let (message, fds) = match recv(socket) {
            Ok(received) => received,
            Err(ProtocolError::Closed) => return Ok(()),
            Err(e) => {
                let _ = send(socket, &Message::Err(e.to_string()), &[]);
                return Err(e);
            }
        };
        let (reply, attach) = answer(message, fds);
        let attach: Vec<BorrowedFd<'_>> = attach.iter().map(std::os::fd::AsFd::as_fd).collect();
        send(socket, &reply, &attach)?;
    }
}

/// Tells the store at the other end of `socket` that mount `key` ended, and waits for its
/// answer (best effort: a store that is gone has nothing to forget).
pub fn drop_key(socket: BorrowedFd<'_>, key: &str) {
    if send(socket, &Message::Drop(key.to_string()), &[]).is_ok() {
        let _ = recv(socket);
    }
}

/// Keeper side: what it holds and who has the lease. One per connection kept.
#[derive(Default)]
pub struct Holder {
    bundle: Option<Vec<OwnedFd>>,
    /// The client that took the bundle last and is still connected.
    lease: Option<u64>,
}

impl Holder {
    pub fn is_holding(&self) -> bool {
        self.bundle.is_some()
    }

    /// Copies of the held bundle.
    pub fn copies(&self) -> Option<Vec<OwnedFd>> {
        self.bundle
            .as_ref()?
            .iter()
            .map(|fd| fd.try_clone())
            .collect::<Result<Vec<_>, _>>()
            .ok()
    }

    /// The held `/dev/fuse` descriptor.
    pub fn fuse(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.bundle
            .as_ref()
            .and_then(|b| b.first())
            .map(|fd| fd.as_fd())
    }

    /// Answers one message from client `client`; returns the reply and what to attach.
    pub fn answer(
        &mut self,
        client: u64,
        message: Message,
        fds: Vec<OwnedFd>,
    ) -> (Message, Vec<OwnedFd>) {
        match message {
            Message::Hold(_) if self.lease.is_some_and(|owner| owner != client) => {
                // Another client holds the mount (a keeper that took it over): one keeper per
                // mount, so a second is refused rather than put in its place.
                (Message::Busy, Vec::new())
            }
            Message::Hold(_) if is_bundle(fds.len()) => {
                // A daemon holds a lease on what it gave.
                self.bundle = Some(fds);
                self.lease = Some(client);
                (Message::Ok, Vec::new())
            }
            Message::Hold(_) => (
                Message::Err(format!(
                    "HOLD needs {BASE_FDS} to {MAX_BUNDLE_FDS} descriptors (/dev/fuse, nodes, handles, then up to {MAX_CLONES} clones of /dev/fuse), got {}",
                    fds.len()
                )),
                Vec::new(),
            ),
            Message::Take(_) => match (&self.bundle, self.lease) {
                (None, _) => (Message::None, Vec::new()),
                (Some(_), Some(owner)) if owner != client => (Message::Busy, Vec::new()),
                (Some(bundle), _) => {
                    let copies: Result<Vec<OwnedFd>, _> =
                        bundle.iter().map(|fd| fd.try_clone()).collect();
                    match copies {
                        Ok(copies) => {
                            self.lease = Some(client);
                            (Message::Give, copies)
                        }
                        Err(e) => (
                            Message::Err(format!("cannot copy a descriptor: {e}")),
                            Vec::new(),
                        ),
                    }
                }
            },
            other => (
                Message::Err(format!("unexpected '{}'", other.line())),
                Vec::new(),
            ),
        }
    }

    /// Client `client`'s socket closed (it exited or died): its lease ends.
    pub fn disconnected(&mut self, client: u64) {
        if self.lease == Some(client) {
            self.lease = None;
        }
    }

    /// Drops the bundle (the connection ended).
    pub fn clear(&mut self) {
        self.bundle = None;
        self.lease = None;
    }
}

/// The fd store's side: one [`Holder`] per mount key, so that a copy of each mount's
/// connection lives in a process outside the keepers' container (`riffle fd-store`).
pub struct Store {
    holders: std::collections::HashMap<String, Holder>,
    /// When this store started: a young one has not yet heard from every live keeper.
    started: std::time::Instant,
}

/// How long a new store answers `STARTING` (ask again) rather than `NONE` for a mount it holds
/// nothing of: the live keepers give it their bundles within about a second of its start
/// (see `cli::keeper`), and `NONE` tells a take-over that no connection is kept anywhere, so
/// the mount may be replaced. A take-over asks again for longer than this.
pub const STORE_SETTLES: std::time::Duration = std::time::Duration::from_secs(5);

impl Default for Store {
    fn default() -> Store {
        Store::started_at(std::time::Instant::now())
    }
}

impl Store {
    /// A store that started at `started`.
    pub fn started_at(started: std::time::Instant) -> Store {
        Store {
            holders: std::collections::HashMap::new(),
            started,
        }
    }

    /// Whether client `client` may drop `holder`: it holds the lease (a keeper drops on its
    /// lease's connection) or no one does, or the connection has ended. So a keeper that
    /// lost a race for the mount never drops the winner's copy.
    fn may_drop(client: u64, holder: &Holder) -> bool {
        holder.lease.is_none_or(|owner| owner == client)
            || holder.fuse().is_none_or(connection_gone)
    }

    /// Answers one message from client `client`.
    pub fn answer(
        &mut self,
        client: u64,
        message: Message,
        fds: Vec<OwnedFd>,
    ) -> (Message, Vec<OwnedFd>) {
        match message {
            Message::Hold(Some(key)) => {
                let holder = self.holders.entry(key).or_default();
                holder.answer(client, Message::Hold(None), fds)
            }
            Message::Take(Some(key)) => match self.holders.get_mut(&key) {
                Some(holder) => holder.answer(client, Message::Take(None), fds),
                None if self.started.elapsed() < STORE_SETTLES => (Message::Starting, Vec::new()),
                None => (Message::None, Vec::new()),
            },
            Message::Drop(key) => match self.holders.get(&key) {
                Some(holder) if !Store::may_drop(client, holder) => (Message::Busy, Vec::new()),
                _ => {
                    self.holders.remove(&key);
                    (Message::Ok, Vec::new())
                }
            },
            other => (
                Message::Err(format!("the store needs a key: '{}'", other.line())),
                Vec::new(),
            ),
        }
    }

    /// Client `client` went away: its leases end.
    pub fn disconnected(&mut self, client: u64) {
        for holder in self.holders.values_mut() {
            holder.disconnected(client);
        }
    }

    /// Forgets every bundle whose connection `is_gone` says has ended.
    pub fn sweep(&mut self, is_gone: impl Fn(BorrowedFd<'_>) -> bool) -> usize {
        let before = self.holders.len();
        self.holders
            .retain(|_, holder| holder.fuse().is_some_and(|fd| !is_gone(fd)));
        before - self.holders.len()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }
}

/// Whether the FUSE connection behind `fuse` has ended (unmounted or aborted): the kernel
/// then reports an error on the descriptor.
pub fn connection_gone(fuse: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fuse, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
        }),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn bundle() -> Vec<OwnedFd> {
        (0..BASE_FDS)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect()
    }

    /// A bundle of `n` distinct files (told apart by inode).
    fn distinct(n: usize) -> Vec<OwnedFd> {
        (0..n)
            .map(|_| OwnedFd::from(tempfile::tempfile().unwrap()))
            .collect()
    }

    fn inodes(fds: &[OwnedFd]) -> Vec<u64> {
        fds.iter()
            .map(|fd| nix::sys::stat::fstat(fd).unwrap().st_ino)
            .collect()
    }

    /// `fds` held by a keeper over a socket pair, then taken back by a successor.
    fn hold_and_take(fds: &[OwnedFd]) -> Vec<OwnedFd> {
        let mut holder = Holder::default();
        let (daemon, keeper) = pair().unwrap();
        let borrowed: Vec<BorrowedFd> = fds.iter().map(|f| f.as_fd()).collect();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (message, fds) = recv(keeper.as_fd()).unwrap();
                let (reply, _) = holder.answer(1, message, fds);
                send(keeper.as_fd(), &reply, &[]).unwrap();
            });
            hold(daemon.as_fd(), None, &borrowed).unwrap();
        });
        holder.disconnected(1);
        let (successor, keeper) = pair().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (message, fds) = recv(keeper.as_fd()).unwrap();
                let (reply, attach) = holder.answer(2, message, fds);
                let attach: Vec<BorrowedFd> = attach.iter().map(|f| f.as_fd()).collect();
                send(keeper.as_fd(), &reply, &attach).unwrap();
            });
            take(successor.as_fd(), None).unwrap()
        })
    }

    #[test]
    fn a_bundle_with_clones_travels_whole_and_in_order() {
        for n in [BASE_FDS + 3, MAX_BUNDLE_FDS] {
            let given = distinct(n);
            let taken = hold_and_take(&given);
            assert_eq!(taken.len(), n);
            assert_eq!(inodes(&taken), inodes(&given), "the same files, in order");
        }
    }

    #[test]
    fn an_old_three_descriptor_bundle_is_held_and_given_as_it_came() {
        let given = distinct(BASE_FDS);
        let taken = hold_and_take(&given);
        assert_eq!(inodes(&taken), inodes(&given));
        // The store too, and a bundle with clones beside it.
        let mut store = settled_store();
        let key = |k: &str| Some(k.to_string());
        assert_eq!(
            store
                .answer(1, Message::Hold(key("old")), distinct(BASE_FDS))
                .0,
            Message::Ok
        );
        assert_eq!(
            store
                .answer(2, Message::Hold(key("new")), distinct(BASE_FDS + 3))
                .0,
            Message::Ok
        );
        store.disconnected(1);
        store.disconnected(2);
        let sizes: Vec<usize> = ["old", "new"]
            .iter()
            .map(|k| store.answer(3, Message::Take(key(k)), Vec::new()).1.len())
            .collect();
        assert_eq!(sizes, [BASE_FDS, BASE_FDS + 3]);
    }

    #[test]
    fn more_descriptors_than_a_bundle_has_are_refused() {
        let mut holder = Holder::default();
        let (reply, _) = holder.answer(1, Message::Hold(None), distinct(MAX_BUNDLE_FDS + 1));
        assert!(matches!(reply, Message::Err(r) if r.contains("to 66")));
        assert!(!holder.is_holding());
        assert!(!is_bundle(BASE_FDS - 1) && is_bundle(BASE_FDS) && !is_bundle(MAX_BUNDLE_FDS + 1));
        // Over a socket, a message with too many for the control buffer is an error, not a
        // bundle cut short.
        let (a, b) = pair().unwrap();
        let many = distinct(MAX_BUNDLE_FDS + 8);
        let borrowed: Vec<BorrowedFd> = many.iter().map(|f| f.as_fd()).collect();
        send(a.as_fd(), &Message::Give, &borrowed).unwrap();
        assert!(matches!(
            recv(b.as_fd()),
            Err(ProtocolError::Io(nix::Error::ENOBUFS))
        ));
    }

    /// What the module documentation says of a build from before the clones: its control
    /// buffer (room for 3 descriptors) cannot take a bundle with clones, so it fails to
    /// receive it (and refuses) rather than misread it as a 3-descriptor bundle.
    #[test]
    fn a_receiver_with_room_for_three_cannot_misread_a_bundle_with_clones() {
        use nix::sys::socket::{recvmsg, MsgFlags};
        let (a, b) = pair().unwrap();
        let given = distinct(BASE_FDS + 3);
        let borrowed: Vec<BorrowedFd> = given.iter().map(|f| f.as_fd()).collect();
        send(a.as_fd(), &Message::Hold(None), &borrowed).unwrap();
        let mut buf = [0u8; 512];
        let mut space = nix::cmsg_space!([RawFd; 3]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            b.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .unwrap();
        assert!(msg.flags.contains(MsgFlags::MSG_CTRUNC));
        assert!(matches!(msg.cmsgs(), Err(nix::Error::ENOBUFS)));
    }

    #[test]
    fn hold_then_take_over_a_socket_pair() {
        let (daemon, keeper) = pair().unwrap();
        let mut holder = Holder::default();
        let give = bundle();
        let borrowed: Vec<BorrowedFd> = give.iter().map(|f| f.as_fd()).collect();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (message, fds) = recv(keeper.as_fd()).unwrap();
                let (reply, attach) = holder.answer(1, message, fds);
                send(keeper.as_fd(), &reply, &[]).unwrap();
                assert!(attach.is_empty());
            });
            hold(daemon.as_fd(), None, &borrowed).unwrap();
        });
        assert!(holder.is_holding());
        // The daemon dies: its lease ends; a successor takes the bundle.
        holder.disconnected(1);
        let (successor, keeper2) = pair().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let (message, fds) = recv(keeper2.as_fd()).unwrap();
                let (reply, attach) = holder.answer(2, message, fds);
                let attach: Vec<BorrowedFd> = attach.iter().map(|f| f.as_fd()).collect();
                send(keeper2.as_fd(), &reply, &attach).unwrap();
            });
            assert_eq!(take(successor.as_fd(), None).unwrap().len(), BASE_FDS);
        });
        assert!(holder.is_holding(), "the keeper keeps its own copies");
    }

    #[test]
    fn two_successors_racing_exactly_one_wins_until_it_dies() {
        let mut holder = Holder::default();
        assert_eq!(
            holder.answer(9, Message::Take(None), Vec::new()).0,
            Message::None
        );
        holder.answer(1, Message::Hold(None), bundle());
        holder.disconnected(1);
        let (first, got) = holder.answer(2, Message::Take(None), Vec::new());
        let (second, nothing) = holder.answer(3, Message::Take(None), Vec::new());
        assert_eq!((first, got.len()), (Message::Give, BASE_FDS));
        assert_eq!((second, nothing.len()), (Message::Busy, 0));
        // The winner dies mid-handover: the lease ends and the other may take it.
        holder.disconnected(2);
        assert_eq!(
            holder.answer(3, Message::Take(None), Vec::new()).0,
            Message::Give
        );
    }

    #[test]
    fn another_version_or_a_short_bundle_is_refused_with_a_reason() {
        assert!(matches!(
            Message::parse("TAKE 2"),
            Err(ProtocolError::Version(2))
        ));
        assert!(matches!(
            Message::parse("HELLO"),
            Err(ProtocolError::Unexpected(_))
        ));
        let mut holder = Holder::default();
        let (reply, _) = holder.answer(1, Message::Hold(None), Vec::new());
        assert!(matches!(reply, Message::Err(r) if r.contains("needs 3")));
        // A keeper that answers with another version: the asker gets a clear error.
        let (a, b) = pair().unwrap();
        nix::unistd::write(&b, b"GIVE 2").unwrap();
        assert!(matches!(recv(a.as_fd()), Err(ProtocolError::Version(2))));
    }

    #[test]
    fn a_keeper_that_dies_mid_handover_is_an_error_not_a_hang() {
        let (successor, keeper) = pair().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                let _ = recv(keeper.as_fd());
                drop(keeper); // dies before answering
            });
            assert!(matches!(
                take(successor.as_fd(), None),
                Err(ProtocolError::Closed)
            ));
        });
    }

    #[test]
    fn keys_keep_mounts_apart_and_a_lease_ends_with_its_client() {
        let mut store = settled_store();
        let key = |k: &str| Some(k.to_string());
        assert_eq!(
            store.answer(1, Message::Hold(key("a")), bundle()).0,
            Message::Ok
        );
        assert_eq!(
            store.answer(2, Message::Hold(key("b")), bundle()).0,
            Message::Ok
        );
        assert_eq!(
            store.answer(3, Message::Take(key("c")), Vec::new()).0,
            Message::None
        );
        // Keeper 1 still holds its lease on "a"; its death ends it.
        assert_eq!(
            store.answer(3, Message::Take(key("a")), Vec::new()).0,
            Message::Busy
        );
        store.disconnected(1);
        let (give, fds) = store.answer(3, Message::Take(key("a")), Vec::new());
        assert_eq!((give, fds.len()), (Message::Give, BASE_FDS));
        assert_eq!(
            store.answer(4, Message::Take(key("a")), Vec::new()).0,
            Message::Busy
        );
        assert!(matches!(
            store.answer(4, Message::Take(None), Vec::new()).0,
            Message::Err(_)
        ));
        assert_eq!(
            store.answer(2, Message::Drop("b".into()), Vec::new()).0,
            Message::Ok
        );
        assert_eq!(store.len(), 1);
        // /dev/null never reports an error: nothing is swept; an always-gone check sweeps all.
        assert_eq!(store.sweep(connection_gone), 0);
        assert_eq!(store.sweep(|_| true), 1);
        assert!(store.is_empty());
    }

    #[test]
    fn one_keeper_per_mount_a_second_hold_or_a_strangers_drop_is_refused() {
        let mut store = settled_store();
        let key = || Some("m".to_string());
        // Keeper A took the mount over from the store: its connection 2 holds the lease.
        store.answer(1, Message::Hold(key()), bundle());
        store.disconnected(1);
        assert_eq!(
            store.answer(2, Message::Take(key()), Vec::new()).0,
            Message::Give
        );
        // An adopter B of the old daemon asks for the mount: refused.
        assert_eq!(
            store.answer(3, Message::Hold(key()), bundle()).0,
            Message::Busy
        );
        // B cannot drop A's copy either, while A holds it and the connection lives.
        assert_eq!(
            store.answer(3, Message::Drop("m".into()), Vec::new()).0,
            Message::Busy
        );
        assert_eq!(store.len(), 1);
        // A drops it on its lease's connection (the mount ended).
        assert_eq!(
            store.answer(2, Message::Drop("m".into()), Vec::new()).0,
            Message::Ok
        );
        assert!(store.is_empty());
        // Once A's lease ends, B may hold it; and drop it with no lease held.
        store.answer(2, Message::Hold(key()), bundle());
        store.disconnected(2);
        assert_eq!(
            store.answer(3, Message::Hold(key()), bundle()).0,
            Message::Ok
        );
        store.disconnected(3);
        assert_eq!(
            store.answer(4, Message::Drop("m".into()), Vec::new()).0,
            Message::Ok
        );
    }

    /// A store that has been up longer than [`STORE_SETTLES`].
    fn settled_store() -> Store {
        let started = std::time::Instant::now()
            .checked_sub(STORE_SETTLES * 2)
            .expect("an instant in the past");
        Store::started_at(started)
    }

    #[test]
    fn a_young_store_never_says_it_holds_nothing() {
        // Just started: the live keepers have not given it their bundles yet, so a take-over
        // is told to ask again, never that no connection is kept.
        let mut young = Store::default();
        let key = || Some("m".to_string());
        assert_eq!(
            young.answer(1, Message::Take(key()), Vec::new()).0,
            Message::Starting
        );
        assert_eq!(
            young.answer(2, Message::Hold(key()), bundle()).0,
            Message::Ok
        );
        assert_eq!(
            young.answer(1, Message::Take(key()), Vec::new()).0,
            Message::Busy
        );
        let mut settled = settled_store();
        assert_eq!(
            settled.answer(1, Message::Take(key()), Vec::new()).0,
            Message::None
        );
    }

    #[test]
    fn keyed_lines_round_trip_and_bad_keys_are_refused() {
        for m in [
            Message::Hold(Some("k1".into())),
            Message::Take(None),
            Message::Drop("abc".into()),
            Message::Starting,
            Message::Err("no such thing".into()),
        ] {
            assert_eq!(Message::parse(&m.line()).unwrap(), m);
        }
        assert!(Message::parse("DROP 1").is_err());
        assert!(Message::parse("TAKE 1 two words").is_err());
    }
}
