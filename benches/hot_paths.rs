//! Criterion micro-benchmarks of the hot paths (`cargo bench -p rifflefs`):
//! inode lookup in a listed directory, the in-memory block cache, the fetcher's read path on
//! a memory hit, and the NVMe cache's block index lookup, block read and block write.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rifflefs::cache::{CacheConfig, DiskCache, ObjectIdentity, SizeLimit};
use rifflefs::fetch::{FetchConfig, Fetcher, ObjectVersion};
use rifflefs::namespace::{MetadataTtl, Namespace, ROOT_INO};
use rifflefs::store::memory::MemoryStore;

const BLOCK: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn namespace_lookup(c: &mut Criterion) {
    let rt = runtime();
    let store = Arc::new(MemoryStore::new());
    for i in 0..100_000 {
        store.put(&format!("big/f{i:06}"), Vec::new());
    }
    let ns = Namespace::new(store, "", MetadataTtl::Indefinite);
    let dir = rt.block_on(ns.lookup(ROOT_INO, "big")).expect("dir");
    rt.block_on(ns.readdir(dir.ino)).expect("listing");
    let mut i = 0u32;
    c.bench_function("namespace: lookup in a listed 100k-entry directory", |b| {
        b.iter(|| {
            i = (i + 7919) % 100_000;
            rt.block_on(ns.lookup(dir.ino, &format!("f{i:06}")))
                .expect("lookup")
        })
    });
}

fn fetch_memory_hit(c: &mut Criterion) {
    let rt = runtime();
    let store = Arc::new(MemoryStore::new());
    let etag = store.put("obj", vec![7u8; 64 << 20]);
    let fetcher = Fetcher::new(store, FetchConfig::default(), rt.handle().clone(), None);
    let obj = Arc::new(ObjectVersion {
        key: Arc::from("obj"),
        etag: Arc::from(etag.as_str()),
        size: 64 << 20,
    });
    rt.block_on(fetcher.read(&obj, 0..64 << 20))
        .expect("warm up");
    let mut group = c.benchmark_group("fetch");
    group.throughput(Throughput::Bytes(128 << 10));
    let mut off = 0u64;
    group.bench_function("128 KiB read, memory-cache hit", |b| {
        b.iter(|| {
            off = (off + (1 << 20) + 4096) % (63 << 20);
            rt.block_on(fetcher.read(&obj, off..off + (128 << 10)))
                .expect("read")
        })
    });
    group.finish();
}

fn disk_cache(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cc = CacheConfig::new(dir.path(), SizeLimit::Bytes(4 << 30));
    cc.min_free = SizeLimit::Bytes(0);
    let cache = DiskCache::open(cc).expect("cache");
    let id = ObjectIdentity::new("bench", "bucket", "obj", "etag", 256 * BLOCK);
    let block = bytes::Bytes::from(vec![42u8; BLOCK as usize]);
    for i in 0..64 {
        rt.block_on(cache.write_block(&id, i, block.clone()))
            .expect("fill");
    }
    let mut group = c.benchmark_group("nvme cache");
    group.bench_function("block index lookup (has_block)", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % 64;
            cache.has_block(&id, i)
        })
    });
    group.throughput(Throughput::Bytes(BLOCK));
    group.bench_function("1 MiB block read (io_uring, CRC checked)", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % 64;
            rt.block_on(cache.read_block(&id, i)).expect("read")
        })
    });
    let mut next = 64u64;
    group.bench_function(
        "1 MiB block write (O_DIRECT, journal record, index insert)",
        |b| {
            b.iter_batched(
                || {
                    // A new object every time: a block already present is not written again.
                    next += 1;
                    ObjectIdentity::new("bench", "bucket", format!("w{next}"), "etag", BLOCK)
                },
                |wid| rt.block_on(cache.write_block(&wid, 0, block.clone())),
                BatchSize::SmallInput,
            )
        },
    );
    group.finish();
}

criterion_group! {
    name = hot_paths;
    config = Criterion::default().sample_size(20);
    targets = namespace_lookup, fetch_memory_hit, disk_cache
}
criterion_main!(hot_paths);
