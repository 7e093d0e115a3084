#!/usr/bin/env python3
"""The quickstart's report (deploy/local/quickstart.sh): every number comes from this run's files.

Reads, from --results: {cold,warm,local}.json (riffle-bench read-fs), {cold,warm,local}-proxy.json
(riffle-proxy's counters over each epoch), {before,cold,warm,local}-riffle.json (`riffle stats
--json` before the cold epoch and after each epoch). Prints the report and writes the figures it
is made of to report.json in the same directory (tests/quickstart.sh checks them). Exits 1 if a
reader saw a wrong byte or an error, or did not read every file of the manifest.
"""
import argparse
import json
import os
import platform


def load(results, name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)


def manifest_entries(path):
    """(key, size) of every object of a riffle-bench manifest (key TAB size TAB xxh3)."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3 and parts[1].isdigit():
                out.append((parts[0], int(parts[1])))
    return out


def mb(n):
    return f"{n / 1e6:,.1f} MB"


def num(n):
    return f"{n:,}"


def gets(proxy):
    r = proxy["requests"]
    return r["get_object"] + r["get_range"]


def stat(s, path):
    for part in path.split("."):
        s = s[part]
    return s


def main():
    ap = argparse.ArgumentParser()
    for a in ("results", "manifest", "mount", "bucket", "cache-dir", "local", "riffle", "bench",
              "proxy-url", "drop-caches", "try-plan"):
        ap.add_argument("--" + a, required=True)
    for a in ("latency-ms", "bandwidth-mbps", "threads", "seed", "elapsed"):
        ap.add_argument("--" + a, type=int, required=True)
    a = ap.parse_args()

    entries = manifest_entries(a.manifest)
    images = [k for k, _ in entries if k.startswith("images/")]
    shards = [k for k, _ in entries if k.startswith("shards/")]
    classes = sorted({k.split("/")[2] for k in images})
    total_bytes = sum(s for _, s in entries)

    runs = {n: load(a.results, n + ".json") for n in ("cold", "warm", "local")}
    proxy = {n: load(a.results, n + "-proxy.json") for n in ("cold", "warm", "local")}
    st = {n: load(a.results, n + "-riffle.json") for n in ("before", "cold", "warm")}

    def delta(path, epoch, prev):
        return stat(st[epoch], path) - stat(st[prev], path)

    files_read = sum(r["files"] for r in runs.values())
    bytes_read = sum(r["bytes"] for r in runs.values())
    wrong = sum(r["mismatches"] for r in runs.values())
    errors = sum(r["errors"] for r in runs.values())
    complete = all(r["files"] == len(entries) and r["bytes"] == total_bytes for r in runs.values())
    verified = wrong == 0 and errors == 0 and complete

    mode = st["warm"]["fuse"]["passthrough"]
    warm_opens = delta("fuse.opens", "warm", "cold")
    warm_pt = delta("fuse.passthrough_opens", "warm", "cold")
    warm_gets_proxy = gets(proxy["warm"])
    warm_gets_riffle = delta("store.get_requests", "warm", "cold")
    cold_fps, warm_fps, local_fps = (runs[n]["files_per_s"] for n in ("cold", "warm", "local"))

    w = print
    w("")
    w("=" * 100)
    w("rifflefs quickstart report")
    w("=" * 100)
    w(f"Dataset  s3://{a.bucket}: {num(len(images))} images in {len(classes)} class directories "
      f"(images/train/<class>/*.jpg) and {len(shards)} shards (shards/*.tar):")
    w(f"         {num(len(entries))} files, {mb(total_bytes)}, and nothing else in the bucket.")
    w(f"Store    Ceph RGW behind riffle-proxy ({a.proxy_url}): {a.latency_ms} ms to the first byte of every "
      f"response, {a.bandwidth_mbps or 'no'} MB/s cap per connection,")
    w(f"         like a real object store. Change it with RIFFLE_QUICKSTART_LATENCY_MS=N "
      f"(and RIFFLE_QUICKSTART_BANDWIDTH_MBPS=N).")
    drop = {"1": "dropped before every epoch", "0": "not dropped (RIFFLE_QUICKSTART_DROP_CACHES=0)"}.get(
        a.drop_caches, "could not be dropped")
    w(f"Reader   riffle-bench read-fs, {a.threads} threads: every file opened, read whole, closed, in a "
      f"fresh shuffle each epoch,")
    w(f"         like a DataLoader with shuffle=True; page cache {drop}.")
    w("")
    w(f"  {'':<34}{'files/s':>9}{'MB/s':>9}{'time':>9}{'GETs at the store':>20}")
    rows = (("cold epoch  (riffle, empty cache)", "cold"),
            ("warm epoch  (riffle, NVMe cache)", "warm"),
            ("local disk  (ext4 copy)", "local"))
    for label, n in rows:
        r = runs[n]
        g = "-" if n == "local" else num(gets(proxy[n]))
        w(f"  {label:<34}{r['files_per_s']:>9,.0f}{r['mb_per_s']:>9,.1f}{r['elapsed_s']:>8.2f}s{g:>20}")
    w(f"  warm / cold: {warm_fps / cold_fps:.1f}x the files/s.   warm / local disk: {warm_fps / local_fps:.2f}x.")
    if a.drop_caches != "1":
        w("  (The page cache was kept: local disk's copy, just written, was read from memory, so that ratio is not "
          "like for like.)")
    if a.latency_ms > 0:
        cold_opens = delta("prefetch.opens", "cold", "before")
        cold_ready = delta("prefetch.opens_already_cached", "cold", "before")
        w(f"  Waiting for the store, {a.threads} readers at >= {a.latency_ms} ms per file would open at most "
          f"~{a.threads * 1000 / a.latency_ms:,.0f} files/s;")
        w(f"  in the cold epoch {num(cold_ready)} of {num(cold_opens)} opens found their file already fetched "
          f"(epoch prefetch, on by default,")
        w("  fetches the files a shuffled epoch has not opened yet; an epoch plan, in Try next, gives riffle the "
          "order too).")
    check = "every byte checked" if verified else "CHECK FAILED"
    w(f"  Verified: {num(files_read)} files, {mb(bytes_read)} read, {check} against the manifest: "
      f"{wrong} wrong, {errors} errors.")
    w(f"  Warm epoch at the store: {warm_gets_proxy} GETs counted by the proxy, {warm_gets_riffle} sent by riffle.")
    w("")
    if mode == "enabled":
        why = (f"Linux {platform.release()} has FUSE passthrough (6.9+) and the daemon runs as root "
               f"(CAP_SYS_ADMIN),")
        then = (f"so {num(warm_pt)} of the warm epoch's {num(warm_opens)} opens got the cache file as backing "
                f"file: the kernel read it, the daemon saw no reads.")
    else:
        why = f"{mode}."
        then = ("Without passthrough the daemon serves every read from its cache (memory, or the NVMe "
                "cache checked by CRC): slower than local disk, and still 0 GETs.")
    w(f"Passthrough  {mode}: {why}")
    w(f"             {then}")
    w("")
    w(f"riffle stats {a.mount}, trimmed (the full list: riffle stats {a.mount}); per epoch:")
    w(f"  {'':<28}{'cold':>12}{'warm':>12}")
    def row(path, note, fmt=num):
        c, wv = delta(path, "cold", "before"), delta(path, "warm", "cold")
        w(f"  {path:<28}{fmt(c):>12}{fmt(wv):>12}   {note}")
    row("store.get_requests", "ranged GETs sent to the store")
    row("store.get_bytes", "bytes fetched from the store", mb)
    row("cache.write_bytes", "bytes written to the NVMe cache (--cache-dir)", mb)
    row("blocks.hits", "block reads served by the daemon from memory")
    row("cache.hits", "block reads served by the daemon from the NVMe cache")
    row("fuse.opens", "files opened")
    row("fuse.passthrough_opens", "opens handed to the kernel (reads bypass the daemon)")
    w(f"  cache.complete_objects {num(st['warm']['cache']['complete_objects'])} of {num(len(entries))} files "
      f"whole in the cache ({mb(st['warm']['cache']['bytes'])} in {a.cache_dir}); "
      f"fuse.passthrough {mode}")
    refused = st['warm']['cache'].get('free_floor_refusals', 0)
    if refused:
        w(f"  cache.free_floor_refusals {num(refused)}: the cache's filesystem is down to the "
          f"{mb(st['warm']['cache'].get('min_free', 0))} it keeps free (--cache-min-free), so blocks were not cached")
    w("")
    w("Try next:")
    w(f"  a plan:     bash {a.try_plan}   # the cold epoch again, empty cache, its order given to riffle "
      "first (riffle plan): fetched ahead of the readers")
    w(f"  warm:       {a.riffle} warm {a.mount} images/train   # fetch a subtree into the cache before the job starts")
    w(f"  PyTorch:    python3 deploy/local/pytorch_example.py {a.mount}/images/train   "
      f"# a Dataset + DataLoader(shuffle=True, num_workers=8)")
    w("  your bucket: riffle mount s3://BUCKET/PREFIX/ /mnt/data --cache-dir /nvme/riffle --metadata-ttl indefinite"
      "   (README, 'Mount a real bucket')")
    w("  Kubernetes: kubectl apply -k deploy/kubernetes   # CSI driver; volumes in pod specs (deploy/kubernetes/README.md)")
    w("")
    w(f"This run took {a.elapsed} s after the build.")

    summary = {
        "files": len(entries), "images": len(images), "classes": len(classes), "shards": len(shards),
        "bytes": total_bytes, "verified": verified, "files_read": files_read, "bytes_read": bytes_read,
        "mismatches": wrong, "errors": errors,
        "cold_gets_proxy": gets(proxy["cold"]), "warm_gets_proxy": warm_gets_proxy,
        "warm_gets_riffle": warm_gets_riffle, "warm_requests_proxy": proxy["warm"]["requests"]["total"],
        "passthrough": mode, "warm_opens": warm_opens, "warm_passthrough_opens": warm_pt,
        "files_per_s": {"cold": cold_fps, "warm": warm_fps, "local": local_fps},
        "elapsed_s": a.elapsed,
    }
    with open(os.path.join(a.results, "report.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if not verified:
        raise SystemExit("quickstart: a reader saw wrong bytes, errors or missing files (see " + a.results + ")")


if __name__ == "__main__":
    main()
