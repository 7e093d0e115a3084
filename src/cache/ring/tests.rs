use super::buf::{keeps, POOL, POOL_EXTRA_BYTES};
use super::*;
use std::fs::OpenOptions;

#[test]
fn block_buffers_are_mapped_and_reused_within_the_pool_bound() {
    let size = 1 << 20;
    let mut a = AlignedBuf::with_capacity(size);
    assert!(a.mapped && a.is_empty());
    assert_eq!(
        a.extend_from_slice(&vec![5u8; size + 10]),
        size,
        "only what fits"
    );
    assert!(is_aligned(a.as_ref()) && a.as_ref().iter().all(|&b| b == 5));
    let small = AlignedBuf::copy_from(&[1u8; 5000]);
    assert!(!small.mapped && small.len() == 5000 && !is_aligned(small.as_ref()));
    // Many buffers dropped at once: the pool keeps at most its bound (no budget is set in
    // these tests), the rest is unmapped.
    let many: Vec<AlignedBuf> = (0..(POOL_EXTRA_BYTES / size + 8))
        .map(|_| AlignedBuf::with_capacity(size))
        .collect();
    drop(many);
    drop(a);
    // One lock for both: other tests' buffers come and go on other threads meanwhile.
    let (pooled, counted) = {
        let pool = POOL.lock();
        (pool.bufs.iter().map(|&(_, s)| s).sum::<usize>(), pool.bytes)
    };
    assert_eq!(pooled, counted);
    assert!(pooled <= POOL_EXTRA_BYTES, "{pooled} bytes pooled");
    // A reused buffer starts empty, whatever its pages held.
    let b = AlignedBuf::with_capacity(size);
    assert!(b.mapped && b.is_empty() && b.as_ref().is_empty());
}

#[test]
fn freed_buffers_are_kept_within_the_reserved_share_and_the_extra() {
    const MIB: usize = 1 << 20;
    // Nothing reserved: the extra alone.
    assert!(keeps(POOL_EXTRA_BYTES - MIB, MIB, 0));
    assert!(!keeps(POOL_EXTRA_BYTES, MIB, 0));
    // 32 MiB reserved (an eighth of 256M): up to 48 MiB kept, not a byte more.
    assert!(keeps(POOL_EXTRA_BYTES + 31 * MIB, MIB, 32 * MIB));
    assert!(!keeps(POOL_EXTRA_BYTES + 32 * MIB, MIB, 32 * MIB));
    // 8 MiB reserved (an eighth of 64M): the share and as much again, 16 MiB.
    assert!(keeps(15 * MIB, MIB, 8 * MIB));
    assert!(!keeps(16 * MIB, MIB, 8 * MIB));
}

fn file(dir: &std::path::Path) -> Arc<File> {
    Arc::new(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .expect("open"),
    )
}

/// Both kinds of lane: io_uring rings and the `plain` threads.
fn rings(lanes: usize) -> [Ring; 2] {
    let uring = Ring::with_io_uring(lanes).expect("io_uring");
    let plain = Ring::with_plain_threads(lanes).expect("threads");
    assert!(uring.uses_io_uring() && !plain.uses_io_uring());
    [uring, plain]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_and_writes() {
    for ring in rings(2) {
        concurrent_reads_and_writes_through(Arc::new(ring)).await;
    }
}

async fn concurrent_reads_and_writes_through(ring: Arc<Ring>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = file(dir.path());
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let (ring, f) = (ring.clone(), f.clone());
        tasks.push(tokio::spawn(async move {
            let data = Bytes::from(vec![i as u8; 10_000]);
            ring.write(&f, i * 10_000, IoBuf::Bytes(data)).await?;
            let back = ring.read(&f, i * 10_000, 10_000).await?;
            assert!(back.iter().all(|&b| b == i as u8));
            Ok::<_, io::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("join").expect("io");
    }
    let past_end = ring.read(&f, 64 * 10_000, 10).await;
    assert_eq!(
        past_end.map(|_| ()).map_err(|e| e.kind()),
        Err(io::ErrorKind::UnexpectedEof)
    );
    assert!(ring.submitted() >= 64 * 2);
}

#[test]
fn read_then_answers_on_the_ring_thread_even_when_the_ring_is_dropped_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = file(dir.path());
    std::os::unix::fs::FileExt::write_all_at(&*f, b"hello, ring", 0).expect("write");
    let ring = Arc::new(Ring::new(1).expect("io_uring"));
    let (tx, rx) = std::sync::mpsc::channel();
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let held = ring.clone();
    ring.read_then(f.clone(), 7, 4, move |got| {
        let thread = std::thread::current().name().map(str::to_string);
        let _ = wait_go.recv();
        // The last owner lets go here, on the ring thread: Drop must not join itself.
        drop(held);
        let _ = tx.send((got.map(|b| b.to_vec()), thread));
    });
    drop(ring);
    go.send(()).expect("callback waiting");
    let (got, thread) = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("answered");
    assert_eq!(got.expect("read"), b"ring");
    assert_eq!(thread.as_deref(), Some("riffle-uring-0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_write_starts_only_after_the_first_and_never_after_a_failure() {
    for ring in rings(1) {
        chained_writes_through(ring).await;
    }
}

async fn chained_writes_through(ring: Ring) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = file(dir.path());
    let journal = Arc::new(
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.path().join("journal"))
            .expect("open journal"),
    );
    for i in 0..32u64 {
        let block = Bytes::from(vec![i as u8; 20_000]);
        let record = Bytes::from(vec![b'a' + i as u8; 4]);
        ring.write_then(
            (&data, i * 20_000, IoBuf::Bytes(block)),
            (&journal, 0, IoBuf::Bytes(record)),
        )
        .await
        .expect("chained write");
        // Both writes are done when the reply comes.
        let back = std::fs::read(dir.path().join("f")).expect("read data");
        assert_eq!(back.len() as u64, (i + 1) * 20_000);
        assert!(back[(i * 20_000) as usize..].iter().all(|&b| b == i as u8));
        let records = std::fs::read(dir.path().join("journal")).expect("read journal");
        assert_eq!(records.len() as u64, (i + 1) * 4);
    }

    // The first write fails (the file is open read-only): the second never happens.
    let read_only = Arc::new(File::open(dir.path().join("f")).expect("open read-only"));
    let failed = ring
        .write_then(
            (&read_only, 0, IoBuf::Bytes(Bytes::from_static(b"nope"))),
            (&journal, 0, IoBuf::Bytes(Bytes::from_static(b"XXXX"))),
        )
        .await;
    assert!(failed.is_err());
    let records = std::fs::read(dir.path().join("journal")).expect("read journal");
    assert_eq!(records.len(), 32 * 4);
    assert!(!records.contains(&b'X'));
}

#[test]
fn aligned_buffers_are_aligned() {
    let b = AlignedBuf::copy_from(&[7u8; 5000]);
    assert_eq!(b.as_ref().len(), 5000);
    assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
    assert!(b.as_ref().iter().all(|&x| x == 7));
}

/// `io_uring_setup` refused as a container's default seccomp profile refuses it (`ENOSYS`),
/// by a filter on this thread only: `Ring::new` falls back to `plain` threads, which read and
/// write (the threads it starts inherit the filter).
#[test]
fn where_io_uring_is_refused_the_ring_falls_back_to_plain_threads() {
    std::thread::spawn(|| {
        refuse_io_uring_setup_on_this_thread();
        assert_eq!(
            io_uring::IoUring::new(8)
                .map(|_| ())
                .map_err(|e| e.raw_os_error()),
            Err(Some(libc::ENOSYS)),
            "the filter refuses io_uring_setup"
        );
        let ring = Ring::new(2).expect("a ring, of threads");
        assert!(!ring.uses_io_uring());
        let dir = tempfile::tempdir().expect("tempdir");
        let f = file(dir.path());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let block = AlignedBuf::copy_from(&[9u8; 2 * ALIGN]);
            ring.write(&f, ALIGN as u64, IoBuf::Aligned(block))
                .await
                .expect("write");
            let back = ring.read(&f, ALIGN as u64, 2 * ALIGN).await.expect("read");
            assert!(back.len() == 2 * ALIGN && back.iter().all(|&b| b == 9));
            assert!(
                is_aligned(&back),
                "reads land in aligned buffers (O_DIRECT)"
            );
            let past_end = ring.read(&f, 3 * ALIGN as u64, 1).await;
            assert_eq!(
                past_end.map(|_| ()).map_err(|e| e.kind()),
                Err(io::ErrorKind::UnexpectedEof)
            );
        });
        let (tx, rx) = std::sync::mpsc::channel();
        ring.read_then(f, 0, ALIGN, move |got| {
            let _ = tx.send(got.map(|b| b.iter().all(|&b| b == 0)));
        });
        let zeros = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("answered");
        assert!(zeros.expect("read_then"), "the hole reads as zeros");
    })
    .join()
    .expect("the test thread");
}

/// Installs a seccomp filter on the calling thread (not the process) that fails
/// `io_uring_setup` with `ENOSYS` and allows everything else.
pub(crate) fn refuse_io_uring_setup_on_this_thread() {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let mut program = [
        // Load the system call number; if it is io_uring_setup, fail it, else allow it.
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_io_uring_setup as u32,
        },
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: prctl and seccomp with valid arguments; `prog` outlives the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &prog as *const libc::sock_fprog
            ),
            0,
            "seccomp: {}",
            io::Error::last_os_error()
        );
    }
}
