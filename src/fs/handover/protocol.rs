//! The keeper protocol: how a daemon gives its bundle (the `/dev/fuse` descriptor, the node
//! journal and the handle table) to a keeper, and how a successor takes it back.
//!
//! One message per `SOCK_SEQPACKET` packet: a line of text, `VERB VERSION [detail]`, with
//! the descriptors attached (`SCM_RIGHTS`) where the verb carries a bundle.
//! - `HOLD 1` + bundle: the daemon's, once its connection is initialised. Answer `OK 1`.
//! - `TAKE 1`: a successor asks. Answer `GIVE 1` + bundle (copies: the keeper keeps its
//!   own), `BUSY 1` while another successor holds the lease (a lease ends when its socket
//!   closes, so a successor that dies mid-handover frees it), or `NONE 1` when nothing is
//!   held.
//! - Anything else, or another version: `ERR 1 <reason>`; the asker stops.
//!
//! The version lets an old keeper and a new daemon (or the reverse) detect that they do not
//! speak the same protocol and fail with a clear reason instead of misreading each other.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// Descriptors in a bundle.
pub const BUNDLE_FDS: usize = 3;

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
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hold,
    Ok,
    Take,
    Give,
    Busy,
    None,
    Err(String),
}

impl Message {
    fn line(&self) -> String {
        let verb = match self {
            Message::Hold => "HOLD",
            Message::Ok => "OK",
            Message::Take => "TAKE",
            Message::Give => "GIVE",
            Message::Busy => "BUSY",
            Message::None => "NONE",
            Message::Err(reason) => return format!("ERR {VERSION} {reason}"),
        };
        format!("{verb} {VERSION}")
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
        Ok(match verb {
            "HOLD" => Message::Hold,
            "OK" => Message::Ok,
            "TAKE" => Message::Take,
            "GIVE" => Message::Give,
            "BUSY" => Message::Busy,
            "NONE" => Message::None,
            "ERR" => Message::Err(parts.next().unwrap_or("").to_string()),
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
    let mut space = nix::cmsg_space!([RawFd; BUNDLE_FDS]);
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

/// Daemon side: gives the bundle to the keeper and waits for its `OK`.
pub fn hold(socket: BorrowedFd<'_>, bundle: &[BorrowedFd<'_>]) -> Result<(), ProtocolError> {
    send(socket, &Message::Hold, bundle)?;
    match recv(socket)?.0 {
        Message::Ok => Ok(()),
        Message::Err(reason) => Err(ProtocolError::Refused(reason)),
        other => Err(ProtocolError::Unexpected(other.line())),
    }
}

/// Successor side: takes the bundle from the keeper.
pub fn take(socket: BorrowedFd<'_>) -> Result<Vec<OwnedFd>, ProtocolError> {
    send(socket, &Message::Take, &[])?;
    match recv(socket)? {
        (Message::Give, fds) if fds.len() == BUNDLE_FDS => Ok(fds),
        (Message::Give, fds) => Err(ProtocolError::Unexpected(format!(
            "GIVE with {} descriptors",
            fds.len()
        ))),
        (Message::Busy, _) => Err(ProtocolError::Busy),
        (Message::None, _) => Err(ProtocolError::Nothing),
        (Message::Err(reason), _) => Err(ProtocolError::Refused(reason)),
        (other, _) => Err(ProtocolError::Unexpected(other.line())),
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
            Message::Hold if fds.len() == BUNDLE_FDS => {
                // A daemon holds a lease on what it gave.
                self.bundle = Some(fds);
                self.lease = Some(client);
                (Message::Ok, Vec::new())
            }
            Message::Hold => (
                Message::Err(format!(
                    "HOLD needs {BUNDLE_FDS} descriptors, got {}",
                    fds.len()
                )),
                Vec::new(),
            ),
            Message::Take => match (&self.bundle, self.lease) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn bundle() -> Vec<OwnedFd> {
        (0..BUNDLE_FDS)
            .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
            .collect()
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
            hold(daemon.as_fd(), &borrowed).unwrap();
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
            assert_eq!(take(successor.as_fd()).unwrap().len(), BUNDLE_FDS);
        });
        assert!(holder.is_holding(), "the keeper keeps its own copies");
    }

    #[test]
    fn two_successors_racing_exactly_one_wins_until_it_dies() {
        let mut holder = Holder::default();
        assert_eq!(holder.answer(9, Message::Take, Vec::new()).0, Message::None);
        holder.answer(1, Message::Hold, bundle());
        holder.disconnected(1);
        let (first, got) = holder.answer(2, Message::Take, Vec::new());
        let (second, nothing) = holder.answer(3, Message::Take, Vec::new());
        assert_eq!((first, got.len()), (Message::Give, BUNDLE_FDS));
        assert_eq!((second, nothing.len()), (Message::Busy, 0));
        // The winner dies mid-handover: the lease ends and the other may take it.
        holder.disconnected(2);
        assert_eq!(holder.answer(3, Message::Take, Vec::new()).0, Message::Give);
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
        let (reply, _) = holder.answer(1, Message::Hold, Vec::new());
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
                take(successor.as_fd()),
                Err(ProtocolError::Closed)
            ));
        });
    }
}
