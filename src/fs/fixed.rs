//! The FUSE handlers whose answer never changes: one line each instead of one function each.
//!
//! [`fixed_answers!`] writes, inside `impl Filesystem for RiffleFs`, one handler per line that
//! ignores its arguments, times the request under its [`FuseOp`](super::latency::FuseOp) and
//! sends the same reply every time: an errno (`error(Errno::ENOSYS)`) or success (`ok()`).
//! Why each operation answers what it answers is in the module documentation of [`super`]
//! and on each line of the list.

/// `fn name(ArgType, ...): ReplyType => FuseOp variant, reply method(errno);` writes
/// `fn name(&self, _req: &Request, _: ArgType, ..., reply: ReplyType)` that starts the
/// variant's timer and calls the reply method (with the errno, if given).
macro_rules! fixed_answers {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ty),* $(,)?): $reply:ty => $op:ident, $answer:ident($($errno:expr)?);
    )*) => {$(
        $(#[$doc])*
        fn $name(&self, _req: &Request, $(_: $arg,)* reply: $reply) {
            let _timer = self.ops.start(FuseOp::$op);
            reply.$answer($($errno)?);
        }
    )*};
}

pub(super) use fixed_answers;
