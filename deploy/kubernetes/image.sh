#!/usr/bin/env bash
# Builds the riffle-csi image without a container registry: the runtime stage of
# deploy/kubernetes/Dockerfile on a Debian root filesystem made from Debian's own packages
# (mmdebstrap), with binaries cargo built on this machine. For clusters and build machines
# that reach a Debian mirror (or a local one, --mirror) but no registry.
#
#   1. Reads the Dockerfile's runtime stage (its last FROM): the Debian suite of
#      `FROM debian:SUITE-slim`, the packages of its one `apt-get install`, and every other
#      instruction. Any instruction it cannot replay is an error, so the two never drift.
#   2. The base: `mmdebstrap --variant=minbase --include=PACKAGES SUITE` with the -slim
#      images' dpkg excludes (no docs, man pages or locales) and no apt caches, imported into
#      podman as localhost/riffle-base:KEY. KEY is a hash of the suite, mirror, architecture,
#      packages and these options; the tarball is kept in the cache directory, so a rerun
#      reuses it (mmdebstrap takes about a minute and 181 MB of downloads).
#   3. Checks that the binaries' glibc symbol versions exist in the suite's libc6 (a binary
#      built on a newer distribution than the image's fails at start otherwise).
#   4. `podman build` of the runtime stage with `FROM` set to the base, the apt-get RUN left
#      out (its packages are in the base) and `COPY --from=build /src/target/release/...`
#      taken from --bin-dir. Same paths, modes, entrypoint and packages as the Dockerfile's
#      image (csi/tests/containers.rs builds both and compares their files).
#   5. Saves the image as an OCI archive, for `podman load`, `docker load` (Docker 25+) or
#      `skopeo copy oci-archive:FILE docker://REGISTRY/riffle-csi:TAG`.
#
# Usage: deploy/kubernetes/image.sh [options]
#   --bin-dir DIR      riffle, riffle-csi and riffle-mounter [target/release]
#   --tag NAME         the image's name in the local store [localhost/riffle-csi:VERSION]
#   --output FILE      the OCI archive [riffle-csi-VERSION.oci.tar]; --output none: no archive
#   --version V        the image's org.opencontainers.image.version label [riffle --version]
#   --strip-debug      strip debug information from the image's copies of the binaries
#                      (a debug build's 520 MB become 100 MB; release builds keep line tables)
#   --mirror URL       the Debian mirror mmdebstrap and apt use [mmdebstrap's default]
#   --cache-dir DIR    where base tarballs are kept [$RIFFLE_IMAGE_CACHE, else
#                      ${XDG_CACHE_HOME:-~/.cache}/riffle-image]
#   --base-only        build (or find) the base image, print its name, stop
# Needs root, podman, mmdebstrap (apt-get install podman mmdebstrap), and objdump and objcopy
# (binutils) for the glibc check and --strip-debug. Prints the image's name, size and the
# time it took.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
dockerfile=$here/Dockerfile
bin_dir=$repo/target/release
tag=
output=
version=
strip=0
mirror=
base_only=0
cache=${RIFFLE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/riffle-image}
binaries=(riffle riffle-csi riffle-mounter)

die() { echo "image.sh: $*" >&2; exit 1; }
usage() { sed -n '/^# Usage:/,/^# Needs root/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 64; }
while [ $# -gt 0 ]; do
    case $1 in
        --bin-dir) bin_dir=${2:?}; shift 2 ;;
        --tag) tag=${2:?}; shift 2 ;;
        --output) output=${2:?}; shift 2 ;;
        --version) version=${2:?}; shift 2 ;;
        --strip-debug) strip=1; shift ;;
        --mirror) mirror=${2:?}; shift 2 ;;
        --cache-dir) cache=${2:?}; shift 2 ;;
        --base-only) base_only=1; shift ;;
        -h | --help) usage ;;
        *) echo "image.sh: unknown argument $1" >&2; usage ;;
    esac
done
for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install podman mmdebstrap)"
done
started=$(date +%s)

# --- 1. The Dockerfile's runtime stage, one instruction per line (continuations joined,
# comments dropped).
stage=$(awk '
    /^[[:space:]]*#/ { next }
    { line = line $0 }
    /\\$/ { sub(/\\$/, "", line); next }
    line ~ /[^[:space:]]/ { print line }
    { line = "" }
' "$dockerfile" | awk 'toupper($1) == "FROM" { buf = "" } { buf = buf $0 "\n" } END { printf "%s", buf }')
from=$(printf '%s\n' "$stage" | head -n 1)
[[ $from =~ ^FROM[[:space:]]+debian:([a-z]+)(-slim)?[[:space:]]*$ ]] ||
    die "the Dockerfile's runtime stage must start FROM debian:SUITE[-slim], not: $from"
suite=${BASH_REMATCH[1]}
packages=
instructions=()
while IFS= read -r line; do
    word=${line%%[[:space:]]*}
    case ${word^^} in
        FROM) ;;
        RUN)
            [ -z "$packages" ] || die "more than one RUN in the runtime stage: $line"
            [[ $line =~ apt-get[[:space:]]+install[[:space:]]+-y[[:space:]]+--no-install-recommends[[:space:]]+([^&]+)\&\& ]] ||
                die "image.sh replays only the runtime stage's apt-get install, not: $line"
            read -r -a pkgs <<<"${BASH_REMATCH[1]}"
            packages=$(printf '%s\n' "${pkgs[@]}" | sort -u | paste -sd, -)
            ;;
        COPY)
            # The build stage's outputs come from --bin-dir; everything else from this repo.
            line=${line/--from=build \/src\/target\/release\//bin\/}
            line=${line//\/src\/target\/release\//bin\/}
            [[ $line != *--from=* ]] || die "a COPY --from other than the build stage's target/release: $line"
            instructions+=("$line")
            ;;
        ENTRYPOINT | CMD | ENV | LABEL | WORKDIR | USER | EXPOSE | STOPSIGNAL | ARG)
            instructions+=("$line") ;;
        *) die "image.sh cannot replay the runtime stage's instruction: $line" ;;
    esac
done <<<"$stage"
[ -n "$packages" ] || die "the runtime stage installs no packages (no apt-get install found)"

# --- 2. The base image, cached by everything that decides its content.
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
# The -slim images' dpkg excludes (their /etc/dpkg/dpkg.cfg.d/docker) and no apt caches.
dpkg_opts=(
    'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright'
    'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/groff/*'
    'path-exclude=/usr/share/info/*' 'path-exclude=/usr/share/lintian/*'
    'path-exclude=/usr/share/linda/*' 'path-exclude=/usr/share/locale/*'
    'path-include=/usr/share/locale/locale.alias'
)
apt_opts=('Dir::Cache::pkgcache ""' 'Dir::Cache::srcpkgcache ""')
key=$(printf '%s\n' "$suite" "$arch" "$mirror" "$packages" "${dpkg_opts[@]}" "${apt_opts[@]}" |
    sha256sum | cut -c1-16)
base=localhost/riffle-base:$key
if ! podman image exists "$base"; then
    mkdir -p "$cache"
    tarball=$cache/rootfs-$suite-$arch-$key.tar
    if [ ! -s "$tarball" ]; then
        echo >&2 "== mmdebstrap $suite with $packages (about a minute)"
        args=(--variant=minbase --format=tar "--architectures=$arch" "--include=$packages")
        for o in "${dpkg_opts[@]}"; do args+=("--dpkgopt=$o"); done
        for o in "${apt_opts[@]}"; do args+=("--aptopt=$o"); done
        # shellcheck disable=SC2086 # an empty mirror is no argument
        mmdebstrap --quiet "${args[@]}" "$suite" "$tarball.tmp" $mirror ||
            die "mmdebstrap failed (a Debian mirror must be reachable; --mirror names another)"
        mv "$tarball.tmp" "$tarball"
    fi
    echo >&2 "== podman import $tarball as $base"
    # The PATH of Debian's own images (an imported image has no environment).
    podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --message "debian $suite minbase + $packages (mmdebstrap)" \
        "$tarball" "$base" >/dev/null
fi
if [ "$base_only" = 1 ]; then
    echo "$base"
    exit 0
fi

# --- 3. The binaries, and their glibc against the suite's.
for b in "${binaries[@]}"; do
    [ -x "$bin_dir/$b" ] || die "$bin_dir/$b is missing: cargo build --release -p rifflefs --bin riffle -p riffle-csi --bin riffle-csi --bin riffle-mounter (or --bin-dir)"
done
if command -v objdump >/dev/null; then
    needed=$(for b in "${binaries[@]}"; do objdump -T "$bin_dir/$b"; done |
        grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
    root=$(podman image mount "$base")
    have=$(awk '/^Package: libc6$/ { p = 1 } p && /^Version:/ { print $2; exit }' "$root/var/lib/dpkg/status")
    podman image unmount "$base" >/dev/null
    have=${have%%-*}
    [ -n "$have" ] || die "cannot read libc6's version in $base"
    if [ "$(printf '%s\n%s\n' "$needed" "$have" | sort -V | tail -n 1)" != "$have" ]; then
        die "the binaries in $bin_dir need glibc $needed, $suite has $have: build them on Debian $suite (or in the Dockerfile's build stage), or change the Dockerfile's runtime FROM to a newer suite"
    fi
else
    echo "image.sh: objdump (binutils) not found: glibc compatibility not checked" >&2
fi
if [ -z "$version" ]; then
    version=$("$bin_dir/riffle" --version | awk '{print $2}')
fi
tag=${tag:-localhost/riffle-csi:$version}
output=${output:-riffle-csi-$version.oci.tar}

# --- 4. The image: the runtime stage on the base, binaries from --bin-dir.
ctx=$(mktemp -d "${TMPDIR:-/tmp}/riffle-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
for b in "${binaries[@]}"; do
    if [ "$strip" = 1 ]; then
        objcopy --strip-debug "$bin_dir/$b" "$ctx/bin/$b"
    else
        cp "$bin_dir/$b" "$ctx/bin/$b"
    fi
done
{
    echo "FROM $base"
    for i in "${instructions[@]}"; do
        # Files COPY'd from the repository (not bin/): into the context, same relative path.
        if [[ ${i^^} == COPY* ]]; then
            read -r -a words <<<"$i"
            for src in "${words[@]:1:${#words[@]}-2}"; do
                case $src in
                    --*) ;;
                    bin/*) ;;
                    *) mkdir -p "$ctx/$(dirname "$src")"
                       cp -p "$repo/$src" "$ctx/$src" ;;
                esac
            done
        fi
        echo "$i"
    done
} >"$ctx/Containerfile"
echo >&2 "== podman build $tag (the Dockerfile's runtime stage on $base)"
previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# No intermediate images: a rebuild leaves nothing behind (the base is the cache).
podman build --quiet --pull=never --layers=false -f "$ctx/Containerfile" -t "$tag" \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.title=riffle-csi" \
    --label "org.opencontainers.image.base.name=debian:$suite minbase ($key)" \
    "$ctx" >/dev/null
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]; then
    # The image this tag named before, unless a container or another tag still uses it.
    podman rmi "$previous" >/dev/null 2>&1 || true
fi

# --- 5. The OCI archive.
if [ "$output" != none ]; then
    rm -f "$output"
    podman save --quiet --format oci-archive -o "$output" "$tag"
fi
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image $tag: $((size / 1000000)) MB, built in $(($(date +%s) - started)) s"
if [ "$output" != none ]; then
    echo "OCI archive $output: $(($(stat -c %s "$output") / 1000000)) MB"
fi
