//! The `riffle mount` options a volume may set, for the CSI plugin (`riffle-csi`), and their
//! validation by `riffle mount`'s own parser.
//!
//! A volume (a Kubernetes PV or inline volume) names riffle options in its attributes and
//! mount options; the plugin accepts exactly the flags of [`VOLUME_OPTIONS`], the one list of
//! them. Every other `riffle mount` option is reserved to the node, where the plugin sets it
//! itself or not at all: where the cache lives (`--cache-dir`), the daemon's files
//! (`--pid-file`, `--log-file`, ...), how it runs (`--foreground`, `--restart`,
//! `--allow-other`), the peer ring (`--peer-*`), and anything that would reach the node's own
//! credentials or ports (`--profile`, `--metrics-addr`). A new `riffle mount` option is thus
//! reserved until it is added here.
//!
//! Values are not checked here by kind: [`check_mount_args`] parses an argument vector with
//! [`MountArgs`]'s clap definition, so a value a volume sets is refused exactly when
//! `riffle mount` would refuse it, with its message. [`Spelling`] is how one value has one
//! spelling (`444` and `0444` are one mode), so that settings written differently compare
//! equal.

use std::ffi::OsString;

use clap::{Args, Command, Parser};

use super::args::{clap_one_line, Cli, MountArgs};

/// How a value is spelled canonically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// As written (trimmed).
    AsWritten,
    /// A number in decimal without leading zeros, or a keyword in lower case (`indefinite`,
    /// `debug`).
    Keyword,
    /// An octal mode of four digits (`0444`).
    Octal,
}

/// A `riffle mount` option a volume may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeOption {
    /// The long flag without its dashes (`cache-size`).
    pub flag: &'static str,
    /// Whether its value is a path on the node: then it is set only as a volume attribute
    /// (which a cluster administrator writes, unlike a pod's inline mount options) and must
    /// be absolute (the daemon's working directory is not the volume's).
    pub node_path: bool,
    /// How its value is spelled canonically.
    pub spelling: Spelling,
}

const fn volume(flag: &'static str, spelling: Spelling) -> VolumeOption {
    VolumeOption {
        flag,
        node_path: false,
        spelling,
    }
}

/// Every `riffle mount` option a volume may set; the rest are reserved to the node.
pub const VOLUME_OPTIONS: &[VolumeOption] = &[
    volume("endpoint-url", Spelling::AsWritten),
    volume("region", Spelling::AsWritten),
    volume("force-path-style", Spelling::AsWritten),
    volume("no-sign-request", Spelling::AsWritten),
    volume("uid", Spelling::Keyword),
    volume("gid", Spelling::Keyword),
    volume("file-mode", Spelling::Octal),
    volume("dir-mode", Spelling::Octal),
    volume("metadata-ttl", Spelling::Keyword),
    volume("max-inflight", Spelling::Keyword),
    volume("max-memory", Spelling::AsWritten),
    volume("max-idle-backings", Spelling::Keyword),
    volume("cache-size", Spelling::AsWritten),
    volume("cache-min-free", Spelling::AsWritten),
    VolumeOption {
        flag: "prefetch-plan",
        node_path: true,
        spelling: Spelling::AsWritten,
    },
    volume("warm", Spelling::AsWritten),
    volume("log-level", Spelling::Keyword),
];

/// The volume option whose flag is `flag`.
pub fn volume_option(flag: &str) -> Option<&'static VolumeOption> {
    VOLUME_OPTIONS.iter().find(|o| o.flag == flag)
}

impl Spelling {
    /// The canonical spelling of `value`; a value it cannot read is returned as it is (and
    /// [`check_mount_args`] refuses it).
    pub fn canonical(self, value: &str) -> String {
        let value = value.trim();
        match self {
            Spelling::AsWritten => value.to_string(),
            Spelling::Keyword => value
                .parse::<u64>()
                .map_or_else(|_| value.to_ascii_lowercase(), |n| n.to_string()),
            Spelling::Octal => super::args::parse_mode(value)
                .map_or_else(|_| value.to_string(), |m| format!("{m:04o}")),
        }
    }
}

/// Checks an S3 endpoint URL as `--endpoint-url` does (for endpoints of other services that
/// follow the same rules, such as an STS endpoint).
pub fn check_endpoint_url(url: &str) -> Result<(), String> {
    super::args::parse_endpoint(url).map(|_| ())
}

/// `riffle mount`'s arguments, as clap defines them.
fn mount_command() -> Command {
    MountArgs::augment_args(Command::new("mount"))
}

/// Whether `--flag` is a switch (takes no value); false for a flag `riffle mount` lacks.
pub fn is_switch(flag: &str) -> bool {
    mount_command()
        .get_arguments()
        .find(|a| a.get_long() == Some(flag))
        .is_some_and(|a| !a.get_action().takes_values())
}

/// Checks `riffle mount` option arguments (`--flag=value` or `--switch`, without source and
/// mountpoint) with `riffle mount`'s own parser; the error is its message, on one line.
pub fn check_mount_args(args: &[OsString]) -> Result<(), String> {
    let argv = ["riffle", "mount", "s3://bucket", "/mountpoint"]
        .into_iter()
        .map(OsString::from)
        .chain(args.iter().cloned());
    Cli::try_parse_from(argv)
        .map(|_| ())
        .map_err(|e| clap_one_line(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> Result<(), String> {
        check_mount_args(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn every_volume_option_is_a_mount_option() {
        let command = mount_command();
        for o in VOLUME_OPTIONS {
            assert!(
                command
                    .get_arguments()
                    .any(|a| a.get_long() == Some(o.flag)),
                "{}",
                o.flag
            );
        }
        assert!(is_switch("warm") && is_switch("force-path-style"));
        assert!(!is_switch("cache-size") && !is_switch("no-such-flag"));
        assert!(volume_option("cache-dir").is_none());
    }

    #[test]
    fn values_are_checked_by_riffles_parser() {
        assert_eq!(check(&["--file-mode=0444", "--warm"]), Ok(()));
        let err = check(&["--file-mode=999"]).unwrap_err();
        assert!(err.contains("--file-mode") && !err.contains('\n'), "{err}");
        assert!(check(&["--cache-size=120%", "--cache-dir=/c"]).is_err());
    }

    #[test]
    fn spellings() {
        assert_eq!(Spelling::Octal.canonical("444"), "0444");
        assert_eq!(Spelling::Octal.canonical("rw"), "rw");
        assert_eq!(Spelling::Keyword.canonical(" 007"), "7");
        assert_eq!(Spelling::Keyword.canonical("Indefinite"), "indefinite");
        assert_eq!(Spelling::Keyword.canonical("DEBUG"), "debug");
        assert_eq!(Spelling::AsWritten.canonical(" 80% "), "80%");
    }
}
