//! The fstab helper form: `riffle SOURCE MOUNTPOINT -o OPTIONS`.
//!
//! `mount -t fuse.riffle` and fstab lines (`riffle#s3://bucket/ /mnt fuse ro,...` or type
//! `fuse.riffle`) go through mount.fuse3, which runs `riffle SOURCE MOUNTPOINT -o a,b=c`. This
//! rewrites that into `riffle mount SOURCE MOUNTPOINT --a --b c`, dropping the generic mount
//! options that only mean something to mount(8) or the kernel (`ro`, `_netdev`, `nofail`,
//! `x-systemd.*`, ...). Option names are riffle's long flags, with `_` accepted for `-`.

/// Generic options handled by mount(8), systemd or the kernel, ignored here.
const GENERIC: &[&str] = &[
    "ro",
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
    "async",
    "sync",
    "dirsync",
    "default_permissions",
];

/// True when the command line is `riffle s3://... MOUNTPOINT ...`.
pub fn is_helper_form(args: &[std::ffi::OsString]) -> bool {
    args.get(1)
        .is_some_and(|a| a.to_string_lossy().starts_with("s3://"))
}

/// Rewrites a helper-form command line into the `mount` subcommand; other command lines are
/// returned unchanged. Fails on options riffle cannot honour (`rw`).
pub fn rewrite(args: Vec<String>) -> Result<Vec<String>, String> {
    let is_helper = args.get(1).is_some_and(|a| a.starts_with("s3://"));
    if !is_helper {
        return Ok(args);
    }
    let mut out = vec![args[0].clone(), "mount".to_string()];
    let mut rest = args.into_iter().skip(1);
    while let Some(arg) = rest.next() {
        if arg == "-o" {
            let Some(options) = rest.next() else {
                return Err("-o needs a list of options".into());
            };
            for opt in options.split(',').filter(|o| !o.is_empty()) {
                let (name, value) = match opt.split_once('=') {
                    Some((n, v)) => (n, Some(v)),
                    None => (opt, None),
                };
                if name == "rw" {
                    return Err("riffle mounts are read-only; remove 'rw' from the options".into());
                }
                if GENERIC.contains(&name)
                    || name.starts_with("x-")
                    || matches!(name, "subtype" | "fsname")
                {
                    continue;
                }
                out.push(format!("--{}", name.replace('_', "-")));
                if let Some(v) = value {
                    out.push(v.to_string());
                }
            }
        } else if arg == "-f" {
            out.push("--foreground".into());
        } else {
            out.push(arg);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn rewrites_the_helper_form() {
        let got = rewrite(v(&[
            "riffle",
            "s3://datasets/imagenet/",
            "/mnt/imagenet",
            "-o",
            "ro,allow_other,_netdev,nofail,endpoint-url=http://rgw:7480,force-path-style,metadata-ttl=indefinite,x-systemd.automount,dev,suid",
        ]))
        .unwrap();
        assert_eq!(
            got,
            v(&[
                "riffle",
                "mount",
                "s3://datasets/imagenet/",
                "/mnt/imagenet",
                "--allow-other",
                "--endpoint-url",
                "http://rgw:7480",
                "--force-path-style",
                "--metadata-ttl",
                "indefinite",
            ])
        );
    }

    #[test]
    fn leaves_subcommands_alone_and_refuses_rw() {
        let normal = v(&["riffle", "mount", "s3://b/", "/m"]);
        assert_eq!(rewrite(normal.clone()).unwrap(), normal);
        assert!(rewrite(v(&["riffle", "s3://bkt/", "/m", "-o", "rw"])).is_err());
    }
}
