"""Transfer benchmarks over SSH to a fresh test host container (see tests/testhost.py).

Prints, with targets:
- pull throughput of 1 GB of artifacts, as a ratio of OpenSSH `scp -r` on the same files (>= 0.8).
  The reference is scp as a user types it: OpenSSH's default ciphers. The launcher prefers
  AES-GCM for bulk data where the CPU has AES instructions, so the ratio against scp told to
  use that same cipher (`scp -c aes128-gcm@openssh.com`) is printed too: it is what remains
  once the cipher is equal, i.e. the cost of hashing every file on both ends.
- time to ship an unchanged image (< 2 s)
- time to ship a rebuilt image whose recipe layer alone changed, as a ratio of shipping it whole (<= 0.1)
- peak memory (max RSS) of the launcher process while shipping a multi-GB image and pulling 1 GB (< 200 MB)
- over a slow link (the test host's link limited to 200 Mbit/s with `tc ... tbf`, on the host side of
  its veth): the first ship of the CPU image to a fresh host, as a ratio of
  `docker save IMAGE | ssh HOST docker load` on the same link (<= 0.5); the one-off cost of making the
  compressed blobs is printed beside it (a later ship of those layers, to any host, reuses them)

Each operation runs in a child process of this script so that its peak RSS is its own.
Usage: python benchmarks/transfer.py [--pull-gb 1] [--image-gb 2] [--repeat 3] [--json]
                                    [--only all|slow-link] [--slow-link-mbit 200] [--slow-image REF]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))


def child(args: argparse.Namespace) -> None:
    """One operation, timed inside the process; prints JSON with seconds and peak RSS."""
    from launcher.hosts.ssh import SSHHost
    from launcher.transfers import pull, ship

    conn = json.loads(args.child_conn)
    t0 = time.perf_counter()
    host = SSHHost.connect(
        conn["spec"],
        identity=Path(conn["key"]),
        known_hosts=Path(conn["known_hosts"]),
        ssh_config=Path("/dev/null"),
    )
    t1 = time.perf_counter()
    out: dict[str, Any] = {"connect_s": t1 - t0}
    if args.child == "ship" and args.registry:
        res = ship.ship_image(host, args.image, via=args.registry)
        out.update(res.to_dict())
    elif args.child == "ship":
        res = ship.ship_image(host, args.image, cache_dir=Path(args.cache))
        out.update(res.to_dict())
    else:
        res2 = pull.pull_outputs(host, args.remote, Path(args.dest))
        out.update(res2.to_dict())
    out["op_s"] = time.perf_counter() - t1
    host.close()
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def run_child(conn: dict[str, str], *extra: str) -> dict[str, Any]:
    cp = subprocess.run(
        [sys.executable, __file__, "--child-conn", json.dumps(conn), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if cp.returncode != 0:
        raise SystemExit(f"child failed: {cp.stderr[-2000:]}")
    return json.loads(cp.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def docker_build(ctx: Path, dockerfile: str, tag: str) -> str:
    (ctx / "Dockerfile").write_text(dockerfile)
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True)
    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pull-gb", type=float, default=1.0)
    ap.add_argument("--image-gb", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=["ship", "pull"])
    ap.add_argument("--child-conn")
    ap.add_argument("--image")
    ap.add_argument("--cache")
    ap.add_argument("--remote")
    ap.add_argument("--dest")
    ap.add_argument("--registry")
    ap.add_argument("--only", choices=["all", "slow-link"], default="all")
    ap.add_argument("--slow-link-mbit", type=int, default=200)
    ap.add_argument("--slow-image", help="default: the largest CPU image launcher built here")
    args = ap.parse_args()
    if args.child_conn:
        child(args)
        return
    if args.only == "slow-link":
        print_slow_link(slow_link(args), args)
        return

    import testhost as th

    work = Path(tempfile.mkdtemp(prefix="launcher-bench-"))
    tags: list[str] = []
    host = th.start_testhost(work / "host")
    conn = {"spec": host.spec, "key": str(host.key), "known_hosts": str(host.known_hosts)}
    results: dict[str, Any] = {"host": host.ip}
    try:
        # a multi-GB image: a big "framework" layer under a small recipe layer; then the recipe changes
        base = th.base_image()
        run_tag = uuid.uuid4().hex[:8]
        big_ctx = work / "big"
        big_ctx.mkdir()
        mb = int(args.image_gb * 1024)
        big = f"launcher-bench/framework:{run_tag}"
        tags.append(big)
        docker_build(big_ctx, f"FROM {base}\nRUN head -c {mb}M /dev/urandom > /opt/framework.bin\n", big)
        ids = {}
        cache = str(work / "cache")
        from launcher.images import tree as imagetree

        base_keys = imagetree.base_layer_keys(base)
        for name in ("a", "b"):
            ctx = work / f"recipe-{name}"
            (ctx / "recipes" / "r").mkdir(parents=True)
            (ctx / "recipes" / "r" / "train.py").write_text(f"print('recipe {name} {uuid.uuid4()}')\n")
            tag = f"launcher-bench/image-{name}:{run_tag}"
            tags.append(tag)
            tags.append(docker_build(ctx, f"FROM {big}\nCOPY recipes /opt/launcher/recipes\n", tag))  # the original
            # as `launcher build` leaves it: normalised, its layers kept in the cache by digest
            ids[name] = imagetree.normalize(tag, tag=tag, base_keys=base_keys,
                                            layer_cache=Path(cache) / "images").image_id
        size = int(
            subprocess.run(
                ["docker", "image", "inspect", "--format", "{{.Size}}", ids["a"]],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        whole = run_child(conn, "--child", "ship", "--image", ids["a"], "--cache", cache)
        unchanged = [
            run_child(conn, "--child", "ship", "--image", ids["a"], "--cache", cache)
            for _ in range(args.repeat)
        ]
        rebuilt = run_child(conn, "--child", "ship", "--image", ids["b"], "--cache", cache)
        assert host.exec("docker", "run", "--rm", ids["b"], "cat", "/opt/launcher/recipes/r/train.py")
        results["image_bytes"] = size
        results["ship_whole"] = whole
        results["ship_unchanged"] = unchanged
        results["ship_rebuilt"] = rebuilt

        # the same through a registry on loopback and a reverse SSH tunnel, from a host with no images
        if shutil.which("docker-registry"):
            import socket

            from launcher.images import registry

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                address = f"127.0.0.1:{s.getsockname()[1]}"
            reg_pid = int(str(registry.start_local_registry(work / "registry", address)["pid"]))
            try:
                host.exec(
                    "sh",
                    "-c",
                    "docker rm -f $(docker ps -aq) 2>/dev/null; "
                    "docker rmi -f $(docker images -aq) 2>/dev/null; docker image prune -af",
                    check=False,
                )
                via = ["--child", "ship", "--registry", address, "--cache", cache]
                results["registry_whole"] = run_child(conn, *via, "--image", ids["a"])
                results["registry_unchanged"] = run_child(conn, *via, "--image", ids["a"])
                results["registry_rebuilt"] = run_child(conn, *via, "--image", ids["b"])
            finally:
                os.kill(reg_pid, signal.SIGTERM)
                pushed = subprocess.run(
                    [
                        "docker",
                        "image",
                        "ls",
                        "--format",
                        "{{.Repository}}:{{.Tag}}",
                        f"{address}/launcher/ship",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
                tags.extend(pushed)

        # pull: 1 GB in 4 files, scp -r against launcher's verified pull, interleaved
        parts = 4
        each = int(args.pull_gb * 1024 / parts)
        host.exec(
            "sh",
            "-c",
            f"mkdir -p /root/bench/out && for i in $(seq 1 {parts}); do "
            f"head -c {each}M /dev/urandom > /root/bench/out/part$i.bin; done",
        )
        from launcher.hosts.ssh import SSHHost

        with SSHHost.connect(
            host.spec, identity=host.key, known_hosts=host.known_hosts, ssh_config=Path("/dev/null")
        ) as h:
            fast = h.fast_ciphers
            h.fast_ciphers = False
            scp_opts = h.openssh_options(scp=True)  # the reference: OpenSSH's default ciphers
        scp_s: list[float] = []
        scp_fast_s: list[float] = []
        pulls: list[dict[str, Any]] = []
        for i in range(args.repeat):
            dest = work / f"scp-{i}"
            t = time.perf_counter()
            subprocess.run(
                ["scp", "-q", "-r", *scp_opts, f"{host.ip}:/root/bench/out", str(dest)], check=True
            )
            scp_s.append(time.perf_counter() - t)
            shutil.rmtree(dest)
            if fast:
                t = time.perf_counter()
                subprocess.run(
                    ["scp", "-q", "-r", *scp_opts, "-c", "aes128-gcm@openssh.com",
                     f"{host.ip}:/root/bench/out", str(dest)],
                    check=True,
                )
                scp_fast_s.append(time.perf_counter() - t)
                shutil.rmtree(dest)
            dest = work / f"pull-{i}" / "outputs"
            pulls.append(
                run_child(conn, "--child", "pull", "--remote", "/root/bench/out", "--dest", str(dest))
            )
            shutil.rmtree(dest.parent)
        results["scp_s"] = scp_s
        results["scp_same_cipher_s"] = scp_fast_s
        results["pull"] = pulls
    finally:
        host.stop()
        subprocess.run(["docker", "rmi", "-f", *reversed(tags)], capture_output=True, check=False)  # children first
        shutil.rmtree(work, ignore_errors=True)

    pull_s = statistics.median(p["op_s"] for p in results["pull"])
    scp_med = statistics.median(results["scp_s"])
    unchanged_s = statistics.median(u["op_s"] for u in results["ship_unchanged"])
    rebuilt_ratio = results["ship_rebuilt"]["op_s"] / results["ship_whole"]["op_s"]
    bytes_ratio = results["ship_rebuilt"]["bytes_sent"] / max(results["ship_whole"]["bytes_sent"], 1)
    peak = max(
        [
            results["ship_whole"]["maxrss_mb"],
            results["ship_rebuilt"]["maxrss_mb"],
            *(p["maxrss_mb"] for p in results["pull"]),
        ]
    )
    summary = {
        "pull_vs_scp_ratio": scp_med / pull_s,
        "pull_s": pull_s,
        "scp_s": scp_med,
        "pull_vs_scp_same_cipher_ratio": (
            statistics.median(results["scp_same_cipher_s"]) / pull_s if results["scp_same_cipher_s"] else None
        ),
        "pull_mb_per_s": args.pull_gb * 1024 / pull_s,
        "ship_unchanged_s": unchanged_s,
        "ship_unchanged_with_connect_s": statistics.median(
            u["op_s"] + u["connect_s"] for u in results["ship_unchanged"]
        ),
        "ship_whole_s": results["ship_whole"]["op_s"],
        "ship_rebuilt_s": results["ship_rebuilt"]["op_s"],
        "ship_rebuilt_time_ratio": rebuilt_ratio,
        "ship_rebuilt_bytes_ratio": bytes_ratio,
        "peak_rss_mb": peak,
        "image_gb": results["image_bytes"] / 1e9,
    }
    if "registry_whole" in results:
        summary["registry_whole_s"] = results["registry_whole"]["op_s"]
        summary["registry_unchanged_s"] = results["registry_unchanged"]["op_s"]
        summary["registry_rebuilt_s"] = results["registry_rebuilt"]["op_s"]
        summary["registry_rebuilt_time_ratio"] = summary["registry_rebuilt_s"] / summary["registry_whole_s"]
        summary["peak_rss_mb"] = max(summary["peak_rss_mb"], results["registry_whole"]["maxrss_mb"])
    if args.json:
        print(json.dumps({"summary": summary, "details": results}, indent=2))
        return
    ok = {True: "ok", False: "MISSED"}
    print(f"test host {results['host']} (a container on this machine, reached over SSH at its bridge IP)")
    print(
        f"pull {args.pull_gb:g} GB: {pull_s:.2f} s ({summary['pull_mb_per_s']:.0f} MB/s) vs scp -r "
        f"{scp_med:.2f} s: ratio {summary['pull_vs_scp_ratio']:.2f} (target >= 0.8: "
        f"{ok[summary['pull_vs_scp_ratio'] >= 0.8]})"
    )
    same = summary["pull_vs_scp_same_cipher_ratio"]
    if same is not None:
        print(
            f"  (launcher pulls with AES-GCM on this CPU; against `scp -c aes128-gcm@openssh.com`, "
            f"{statistics.median(results['scp_same_cipher_s']):.2f} s, the ratio is {same:.2f}: "
            "what sha256 on both ends costs)"
        )
    print(
        f"ship unchanged image: {unchanged_s:.2f} s, "
        f"{summary['ship_unchanged_with_connect_s']:.2f} s with the SSH connect "
        f"(target < 2 s: {ok[unchanged_s < 2]})"
    )
    print(
        f"ship {summary['image_gb']:.2f} GB image whole: {summary['ship_whole_s']:.2f} s; "
        f"rebuilt with only the recipe layer changed: {summary['ship_rebuilt_s']:.2f} s: "
        f"time ratio {rebuilt_ratio:.3f} "
        f"(target <= 0.1: {ok[rebuilt_ratio <= 0.1]}), bytes ratio {bytes_ratio:.5f}"
    )
    if "registry_whole_s" in summary:
        r = summary["registry_rebuilt_time_ratio"]
        print(
            f"ship via a loopback registry + reverse SSH tunnel (--ship-via): whole "
            f"{summary['registry_whole_s']:.2f} s, unchanged {summary['registry_unchanged_s']:.2f} s, "
            f"rebuilt {summary['registry_rebuilt_s']:.2f} s: time ratio {r:.3f} (target <= 0.1: {ok[r <= 0.1]})"
        )
    peak = summary["peak_rss_mb"]
    print(
        f"peak RSS of launcher while shipping and pulling: {peak:.0f} MB (target < 200 MB: {ok[peak < 200]})"
    )
    print_slow_link(slow_link(args), args)


def largest_cpu_image() -> str:
    out = subprocess.run(["docker", "images", "--filter", "label=org.launcher.variant=cpu", "--format",
                          "{{.ID}} {{.Size}}"], capture_output=True, text=True, check=True).stdout.split("\n")
    sizes = {}
    for line in out:
        if line.strip():
            image, size = line.split(" ", 1)
            sizes[image] = float(size.rstrip("GMkB")) * {"G": 1e9, "M": 1e6, "k": 1e3}.get(size.rstrip("B")[-1], 1)
    if not sizes:
        raise SystemExit("no CPU image launcher built here: run `launcher build cpu` (or give --slow-image)")
    return max(sizes, key=lambda k: sizes[k])


def veth_of(container: str) -> str:
    """The host side of the container's eth0: shaping its egress limits what flows into the container."""
    index = subprocess.run(["docker", "exec", container, "cat", "/sys/class/net/eth0/iflink"], capture_output=True,
                           text=True, check=True).stdout.strip()
    for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines():
        number, name = line.split(":")[:2]
        if number.strip() == index:
            return name.strip().split("@")[0]
    raise SystemExit(f"no host interface with index {index} for {container}")


def slow_link(args: argparse.Namespace) -> dict[str, Any]:
    """The first ship of the CPU image to a fresh host over a link limited to --slow-link-mbit, against
    `docker save | ssh docker load` on the same link; both start from a host without any of its layers."""
    import testhost as th

    image = args.slow_image or largest_cpu_image()
    info = json.loads(subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True,
                                     check=True).stdout)[0]
    image_id, size = info["Id"], int(info["Size"])
    work = Path(tempfile.mkdtemp(prefix="launcher-bench-slow-"))
    host = th.start_testhost(work / "host")
    conn = {"spec": host.spec, "key": str(host.key), "known_hosts": str(host.known_hosts)}
    out: dict[str, Any] = {"image": image_id, "image_bytes": size, "mbit": args.slow_link_mbit}
    veth = veth_of(host.container)
    try:
        subprocess.run(["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", f"{args.slow_link_mbit}mbit",
                        "burst", "1mb", "latency", "200ms"], check=True)

        def fresh() -> None:
            host.exec("sh", "-c", "docker rm -f $(docker ps -aq) 2>/dev/null; docker rmi -f $(docker images -aq) "
                      "2>/dev/null; docker image prune -af >/dev/null; rm -rf /root/.launcher/ship; true", check=False)

        fresh()
        t = time.perf_counter()
        subprocess.run(f"docker save {image_id} | ssh -F /dev/null -i {host.key} -o IdentitiesOnly=yes "
                       f"-o UserKnownHostsFile={host.known_hosts} -o StrictHostKeyChecking=yes root@{host.ip} "
                       "docker load -q", shell=True, check=True, capture_output=True)
        out["reference_s"] = time.perf_counter() - t
        fresh()
        cache = work / "cache"
        from launcher.images import blobs
        from launcher.images import tree as imagetree

        diffs = [str(d) for d in info["RootFS"]["Layers"]]
        layer_cache = Path(os.environ.get("LAUNCHER_CACHE", Path.home() / ".cache" / "launcher")) / "images"
        cached = imagetree.cached_image(layer_cache, image_id)
        t = time.perf_counter()  # the one-off cost: what a first slow ship of these layers pays once
        made, _ = blobs.ensure(image_id, diffs, cached[1] if cached else [], list(range(len(diffs))), cache,
                               config=cached[0] if cached else None)
        out["compress_once_s"] = time.perf_counter() - t
        out["blob_bytes"] = blobs.total_size(made)
        out["ship"] = run_child(conn, "--child", "ship", "--image", image_id, "--cache", str(cache))
        out["ship_s"] = out["ship"]["op_s"] + out["ship"]["connect_s"]
        assert host.exec("docker", "image", "inspect", "-f", "{{.Id}}", image_id).strip() == image_id
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True, check=False)
        host.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["ratio"] = out["ship_s"] / out["reference_s"]
    return out


def print_slow_link(r: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps({"slow_link": r}, indent=2))
        return
    ok = {True: "ok", False: "MISSED"}
    print(
        f"slow link ({r['mbit']} Mbit/s, tc tbf): first ship of the {r['image_bytes'] / 1e9:.2f} GB CPU image to a "
        f"fresh host: {r['ship_s']:.1f} s ({r['ship']['bytes_sent'] / 1e9:.2f} GB sent, compressed) vs "
        f"`docker save | ssh docker load` {r['reference_s']:.1f} s: ratio {r['ratio']:.2f} "
        f"(target <= 0.5: {ok[r['ratio'] <= 0.5]}); making the blobs once took {r['compress_once_s']:.1f} s"
    )


if __name__ == "__main__":
    main()
