#!/bin/sh
# Container entrypoint of the riffle-csi image, run under `tini -g`:
#
#   riffle-entrypoint riffle-csi     [ARGS...]   the CSI node plugin
#   riffle-entrypoint riffle-mounter [ARGS...]   the holder of the mount daemons
#   riffle-entrypoint riffle fd-store [ARGS...]  the node's fd store (plugin pod)
#
# The first argument names the binary (in /usr/local/bin) to keep running;
# the rest are its arguments. (For manifests written for the old
# riffle-csi-entrypoint, arguments that start with `-` mean riffle-csi.)
#
# The binary runs as a child of this loop rather than as tini's only child,
# so that its exit does not end the container; the loop restarts it in
# place.
# - riffle-mounter: the `riffle mount` daemons are processes of this
#   container (in their own sessions). A container restart kills them all,
#   so a crash of riffle-mounter must not end the container: the new
#   riffle-mounter serves the same socket, the daemons keep serving their
#   volumes meanwhile, and tini (PID 1, `-g`) reaps them when they exit.
# - riffle-csi: with --mounter-socket it runs no daemons, so a restart of
#   its container costs nothing but a few seconds without CSI service; the
#   loop just makes a crash cheaper still. Without --mounter-socket (no
#   mounter), its daemons are its children and the loop keeps them alive
#   across a crash of riffle-csi, as it did before the mounter existed.
#
# On SIGTERM (tini forwards it to this process group, the binary included;
# the daemons are in their own sessions and do not get it) the loop waits
# for the binary to stop and exits. The daemons of riffle-mounter end with
# the container; their FUSE connections live on in the fd store of the
# plugin's pod, and the next mounter takes the mounts over.
set -u

case ${1-} in
    riffle-csi | riffle-mounter | riffle)
        bin=$1
        shift
        ;;
    -* | "")
        bin=riffle-csi
        ;;
    *)
        echo "riffle-entrypoint: unknown program '$1' (riffle-csi, riffle-mounter or riffle)" >&2
        exit 64
        ;;
esac

child=
stopping=0
trap 'stopping=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT

delay=2
while :; do
    started=$(date +%s)
    "/usr/local/bin/$bin" "$@" &
    child=$!
    wait "$child"
    status=$?
    if [ "$stopping" = 1 ]; then
        # `wait` returned for the signal; now wait for the binary itself.
        wait "$child" 2>/dev/null
        exit 0
    fi
    child=
    # A binary that keeps failing at once (bad arguments, socket in use) is
    # retried with a growing delay, up to 30 s; one that ran a while is
    # restarted after 2 s.
    if [ $(($(date +%s) - started)) -ge 60 ]; then
        delay=2
    fi
    echo "riffle-entrypoint: $bin exited with status $status; restarting in ${delay}s" >&2
    sleep "$delay" &
    child=$!
    wait "$child"
    child=
    [ "$stopping" = 1 ] && exit 0
    delay=$((delay * 2))
    [ "$delay" -gt 30 ] && delay=30
done
