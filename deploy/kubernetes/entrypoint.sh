#!/bin/sh
# Container entrypoint for the riffle-csi image, run under `tini -g`.
#
# The FUSE mount daemons live in this container. If riffle-csi itself were
# PID 1 (or tini's only child), a crash of riffle-csi would end the
# container and the kernel would kill every daemon with it, breaking every
# mounted volume. This loop keeps the container alive and restarts
# riffle-csi in place, so a crash costs nothing: the daemons keep serving
# and the new riffle-csi re-adopts them from its state directory. tini
# reaps the daemons when they exit and forwards SIGTERM to this process
# group (riffle-csi included; the daemons run in their own sessions).
set -u
trap 'exit 0' TERM INT
while :; do
    /usr/local/bin/riffle-csi "$@" &
    wait $!
    status=$?
    echo "riffle-csi exited with status $status; restarting in 2s" >&2
    sleep 2
done
