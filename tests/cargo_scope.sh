# Sourced by tests/run.sh and the test scripts it runs (tests/quickstart.sh, tests/containers.sh).
#
# One test run compiles every crate once. Cargo resolves a dependency's features from the packages
# a command selects and whether it builds their dev-dependencies, so `cargo build -p rifflefs`
# after `cargo test --workspace` compiles a second copy of tokio, hyper, the AWS SDK and all
# that sits on them (about 3 GB of debug build each), and a CI machine's disk has room for one
# copy. Every cargo command of a test run therefore selects the whole workspace with the RGW
# tests' features, as `cargo test` does.
RIFFLE_CARGO_SCOPE=(--workspace --features rifflefs/rgw-tests,riffle-csi/rgw-tests)

# The debug binaries (riffle, riffle-csi, riffle-mounter, riffle-bench, riffle-proxy in
# target/debug), built as `cargo test` builds them for the integration tests: after the tests'
# build there is nothing left to do.
build_debug_binaries() {
    cargo test "${RIFFLE_CARGO_SCOPE[@]}" --no-run -q
}
