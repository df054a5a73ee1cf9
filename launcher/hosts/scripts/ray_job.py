"""launcher's side of a Ray cluster, run on its head node by the Python that has Ray (``ray[default]``).

Unlike the other host scripts it imports Ray (only inside the functions that need it): launcher runs it on the head
as ``PYTHON -c TEXT COMMAND ARGS...`` for the job API, and writes it into an array's folder as ``driver.py`` where a
Ray job runs it. Its values come as arguments or from the array's ``job.json``, never by formatting its text.

Commands:

- ``submit ADDRESS ID SCRIPT ARGS...``: submit ``SCRIPT ARGS...`` (this file, written on the head: ``driver
  ARRAY_DIR`` or ``probe ...``) as the Ray job ``ID`` through the job API at ADDRESS (the dashboard's address as the
  head reaches it), run by this Python; prints ``{"submitted": ID}``.
- ``status ADDRESS ID``: the job's status and message as JSON (``{"status": null}`` for a job Ray does not know).
- ``list ADDRESS``: the launcher jobs Ray knows, as JSON (submission IDs that start with ``launcher-``).
- ``stop ADDRESS ID``: ask Ray to stop the job (its driver gets SIGTERM); prints ``{"stopped": bool}``.
- ``driver ARRAY_DIR``: the job's entry point (see :func:`drive`): one Ray task per replicate, spread over the nodes.
- ``probe OUT [REGISTRY_HOST REGISTRY_PORT]``: a Ray job of its own: one task on every alive node, each reporting its
  Docker engine, its runtimes and whether it reaches the registry; the cluster's facts go to OUT as JSON.

The driver keeps every node's work off the head's filesystem: a task on a node fetches the image (when its node
lacks that ID: pulled by digest from the registry, else the archive streamed from the head once per node), the
run's inputs (dataset, code, secrets) from the head's launcher area through an actor on the head (:class:`Head`),
runs the same container as a direct run, streams its log to the head as it goes, and sends its outputs back as one
tar stream whose SHA-256 the head checks before unpacking it into the run's folder (no absolute names, no ``..``,
no write through a symlink, no hard links or devices). Each run's folder on the head gets ``placed.json`` when its
task starts (node ID and address, task ID), ``task.log``, ``node-facts.txt`` and, when it ends, ``task.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import Any

JOB_FILE = "job.json"  # in the array's folder: what the driver runs (written by launcher.targets.ray)
CANCEL_FILE = "cancel"  # in the array's folder: `launcher stop` asks the driver to cancel every task
TASK_FILE = "task.json"  # in each run's folder on the head: how its task ended
PLACED_FILE = "placed.json"  # in each run's folder on the head: where its task started
LOG_FILE = "task.log"  # in each run's folder on the head: the container's output
FACTS_FILE = "node-facts.txt"  # in each run's folder on the head: the node's fact sheet (facts.sh)
AREA_MARK = "@AREA@"  # in a task's argv: the node's own launcher area
RUN_MARK = "@RUN@"  # in a task's argv: the run's folder on the node (one per node of a run of several)
OWNER_MARK = "@OWNER@"  # in a task's argv: the node user's UID:GID (who gets the outputs)
NODE_MARK = "@NODE{}@"  # in a task's argv: node J's address (a run of several nodes), filled in by the driver
PLACEMENT_WAIT_S = 120.0  # how long a run of several nodes waits for Ray to reserve them
NODE_AREA = "~/.launcher/ray-node"  # a node's own area: the inputs fetched from the head, the run's outputs
CHUNK = 4 << 20
JOB_PREFIX = "launcher-"
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_json(path: str, data: Any) -> None:
    """A JSON file written whole or not at all."""
    part = f"{path}.part"
    with open(part, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.replace(part, path)


def fill(argv: list[str], area: str, owner: str, run: str) -> list[str]:
    """A task's container argv with the node's area, owner and run folder in place of their marks."""
    return [a.replace(RUN_MARK, run).replace(AREA_MARK, area).replace(OWNER_MARK, owner) for a in argv]


def node_file(name: str, node: int) -> str:
    """A run folder's file of node k (task.log, placed.json, node-facts.txt): node 0's by its own name."""
    stem, dot, ext = name.rpartition(".")
    return name if node == 0 else f"{stem}-node{node}{dot}{ext}"


# -- the outputs' tar stream: made on the node, checked and unpacked on the head

def pack(folder: str, out: Any) -> None:
    """Folders, regular files and symlinks under folder as a tar stream into the file ``out`` (symlinks as links,
    never followed; every file whole, never as a hard link; anything else left out)."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, folder)
                st = os.lstat(path)
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue
                tar.inodes = {}  # type: ignore[attr-defined]  # each file whole: a hard link would point at another member
                info = tar.gettarinfo(path, arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)


class Refused(Exception):
    """A member of an outputs stream that would land outside its folder or write through a link."""


def _inside(folder: str, name: str) -> str:
    if not name or name.startswith("/") or "\\" in name or any(p in ("..", "") for p in name.split("/")):
        raise Refused(f"refused member {name!r} of the outputs stream: not a plain relative path")
    parent = folder
    for part in name.split("/")[:-1]:  # no component on the way may be a link (a write would go through it)
        parent = os.path.join(parent, part)
        if os.path.islink(parent):
            raise Refused(f"refused member {name!r} of the outputs stream: {part!r} on its way is a symlink")
    return os.path.join(folder, name)


def unpack(stream: Any, folder: str) -> int:
    """Unpack an outputs stream made by :func:`pack` into folder; returns the number of members. Refuses (Refused)
    absolute names, ``..``, writes through a symlink and anything but folders, regular files and symlinks."""
    count = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            target = _inside(folder, m.name)
            if os.path.islink(target):
                raise Refused(f"refused member {m.name!r} of the outputs stream: it is already a symlink")
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                os.chmod(target, (m.mode & 0o777) | 0o700)
            elif m.isreg():
                src = tar.extractfile(m)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    if src is not None:
                        shutil.copyfileobj(src, f, CHUNK)
                os.chmod(target, (m.mode & 0o777) | 0o600)
                os.utime(target, (m.mtime, m.mtime))
            elif m.issym():
                if os.path.lexists(target):
                    raise Refused(f"refused member {m.name!r} of the outputs stream: a symlink over a file")
                os.symlink(m.linkname, target)
            else:
                raise Refused(f"refused member {m.name!r} of the outputs stream: not a folder, file or symlink")
            count += 1
    return count


# -- the head's side of the tasks: inputs served, logs, placement and outputs written, all in run folders

class HeadFiles:
    """The head's launcher area as the tasks reach it (a Ray actor on the head node): only the inputs job.json names
    are read, only into the runs' folders it names is anything written."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.tmp = tempfile.mkdtemp(prefix="launcher-ray-")
        self.packed: dict[str, tuple[str, str, int]] = {}
        self.lock = threading.Lock()
        self.runs = {t["run_id"]: t for t in job["tasks"]}

    def _input(self, run_id: str, which: str) -> str:
        task = self.runs[run_id]
        if which == "image":  # the archive launcher left, else the head's engine saves the image once
            archive = str(task["image_archive"])
            return archive if os.path.exists(archive) else self._saved(str(task["image_id"]))
        if which not in task["inputs"]:
            raise KeyError(f"{which} is not an input of {run_id}")
        return os.path.join(str(self.job["area"]), str(task["inputs"][which]))

    def _saved(self, image_id: str) -> str:
        """`docker save` of an image ID the head's engine holds (launcher sent no archive: it found the image
        there), once per job, into the actor's own folder."""
        path = os.path.join(self.tmp, f"{image_id.removeprefix('sha256:')}.tar")
        with self.lock:
            if not os.path.exists(path):
                try:
                    done = subprocess.run(["docker", "save", "-o", f"{path}.part", image_id], capture_output=True,
                                          text=True)
                    why = "" if done.returncode == 0 else done.stderr.strip()[-300:] or f"exit {done.returncode}"
                except OSError as exc:
                    why = str(exc)
                if why:
                    raise RuntimeError(f"the head has no archive of {image_id} and its engine cannot save it: {why}")
                os.replace(f"{path}.part", path)
        return path

    def open(self, run_id: str, which: str) -> tuple[str, str, int]:
        """An input as (token, sha256, size): the image archive as it is, a folder packed into a stream once."""
        path = self._input(run_id, which)
        with self.lock:
            if path in self.packed:
                return self.packed[path]
            if os.path.isdir(path):
                made = os.path.join(self.tmp, f"{len(self.packed)}.tar")
                with open(made, "wb") as f:
                    pack(path, f)
                served = made
            else:
                served = path
            digest = hashlib.sha256()
            with open(served, "rb") as f:
                for block in iter(lambda: f.read(CHUNK), b""):
                    digest.update(block)
            self.packed[path] = (served, digest.hexdigest(), os.path.getsize(served))
            return self.packed[path]

    def read(self, token: str, offset: int, size: int) -> bytes:
        if token not in {p[0] for p in self.packed.values()}:
            raise KeyError("not an input this head served")
        with open(token, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def forget_secret(self, run_id: str) -> None:
        """The secrets' file of a run, once its task ended on every node (each node's docker read it)."""
        if "secret" in self.runs[run_id]["inputs"]:
            path = self._input(run_id, "secret")
            with self.lock:
                self.packed.pop(path, None)
            try:
                os.unlink(path)
            except OSError:
                pass

    def _run_file(self, run_id: str, name: str) -> str:
        return os.path.join(self.runs[run_id]["run_dir"], name)

    def placed(self, run_id: str, where: dict[str, Any], node: int = 0) -> None:
        write_json(self._run_file(run_id, node_file(PLACED_FILE, int(node))), where)

    def facts(self, run_id: str, text: str, node: int = 0) -> None:
        with open(self._run_file(run_id, node_file(FACTS_FILE, int(node))), "w") as f:
            f.write(text)

    def log(self, run_id: str, data: bytes, node: int = 0) -> None:
        with open(self._run_file(run_id, node_file(LOG_FILE, int(node))), "ab") as f:
            f.write(data)

    def begin_outputs(self, run_id: str) -> str:
        fd, path = tempfile.mkstemp(dir=self.runs[run_id]["run_dir"], prefix=".outputs-", suffix=".tar")
        os.close(fd)
        return path

    def put(self, run_id: str, path: str, data: bytes) -> None:
        if os.path.dirname(path) != self.runs[run_id]["run_dir"]:
            raise KeyError("not an outputs stream of this run")
        with open(path, "ab") as f:
            f.write(data)

    def end_outputs(self, run_id: str, path: str, sha256: str, size: int) -> str:
        """Check the stream's size and SHA-256, then unpack it into the run's outputs; '' or why it was refused."""
        if os.path.dirname(path) != self.runs[run_id]["run_dir"]:
            return "not an outputs stream of this run"
        try:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(CHUNK), b""):
                    digest.update(block)
            got = os.path.getsize(path)
            if got != size or digest.hexdigest() != sha256:
                return (f"the outputs arrived damaged on the head ({got} bytes, sha256 {digest.hexdigest()[:12]}; "
                        f"the node sent {size} bytes, sha256 {sha256[:12]})")
            out = os.path.join(self.runs[run_id]["run_dir"], "out")
            os.makedirs(out, exist_ok=True)
            with open(path, "rb") as f:
                unpack(f, out)
            return ""
        except (Refused, tarfile.TarError, OSError) as exc:
            return str(exc)
        finally:
            try:
                os.unlink(path)
            except OSError:
                pass

    def cleanup(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


# -- on the node

def _fetch(head: Any, ray: Any, run_id: str, which: str, sink: Any) -> None:
    """Copy an input from the head into the file ``sink``, checking its SHA-256."""
    token, sha, size = ray.get(head.open.remote(run_id, which))
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        block = ray.get(head.read.remote(token, offset, CHUNK))
        if not block:
            break
        digest.update(block)
        sink.write(block)
        offset += len(block)
    if offset != size or digest.hexdigest() != sha:
        raise RuntimeError(f"the {which} input of {run_id} arrived damaged from the head ({offset} of {size} bytes)")


def _image_id(image: str) -> str:
    done = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _ensure_image(head: Any, ray: Any, task: dict[str, Any], area: str) -> str:
    """The pinned image on this node: there already, pulled by digest, or loaded from the head's archive (once per
    node: a lock file keeps two tasks from loading it together). Returns the image ID the node has."""
    import fcntl

    image = str(task["image_id"])
    os.makedirs(area, exist_ok=True)
    with open(os.path.join(area, "image.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _image_id(image) == image:
            return image
        source = task["image_source"]
        if source.get("kind") == "registry":
            done = subprocess.run(["docker", "pull", "-q", source["ref"]], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"docker pull {source['ref']} failed: {done.stderr.strip()[-300:]}")
        else:
            load = subprocess.Popen(["docker", "load", "-q"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
            try:
                _fetch(head, ray, task["run_id"], "image", load.stdin)
            finally:
                assert load.stdin is not None
                load.stdin.close()
                err = load.stderr.read().decode(errors="replace") if load.stderr else ""
                load.wait()
            if load.returncode != 0:
                raise RuntimeError(f"docker load of the image from the head failed: {err.strip()[-300:]}")
        return _image_id(str(image))


def _unpack_input(head: Any, ray: Any, run_id: str, which: str, target: str) -> None:
    """A folder input at target (fetched once per content: a folder there already is kept)."""
    if os.path.isdir(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    part = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".part-")
    with tempfile.TemporaryFile() as f:
        _fetch(head, ray, run_id, which, f)
        f.seek(0)
        unpack(f, part)
    try:
        os.rename(part, target)
    except OSError:  # another task of this node put it there first
        shutil.rmtree(part, ignore_errors=True)


def run_task(head: Any, task: dict[str, Any], facts: str) -> dict[str, Any]:
    """One replicate (or node ``task["node"]`` of one) on the node this task landed on; returns its task.json fields
    (the driver writes them). The run's folder on the node holds its outputs and secrets only while it runs."""
    import ray

    ctx = ray.get_runtime_context()
    node_ip = ray.util.get_node_ip_address()
    run_id, name, node = task["run_id"], task["container"], int(task.get("node", 0))
    result: dict[str, Any] = {"node_id": ctx.get_node_id(), "node": node_ip, "task_id": ctx.get_task_id(),
                              "image_ran": "", "exit_code": None, "status": "failed", "error": ""}
    area = os.path.expanduser(NODE_AREA)
    run_dir = os.path.join(area, "runs", str(task.get("folder") or run_id))
    ray.get(head.placed.remote(run_id, {k: result[k] for k in ("node_id", "node", "task_id")}
                               | {"started_at": now()}, node))
    head.facts.remote(run_id, subprocess.run(["sh", "-c", facts], capture_output=True, text=True).stdout, node)
    secret = ""
    try:
        have = _ensure_image(head, ray, task, area)
        if have != task["image_id"]:
            result.update(exit_code=125, error=f"node {node_ip} does not have the pinned image {task['image_id']} "
                                               f"(it has: {have or 'none'}); nothing was run")
            return result
        result["image_ran"] = have
        os.makedirs(run_dir, exist_ok=True)
        for which, rel in sorted(task["inputs"].items()):
            if which == "secret":  # beside the run's outputs, readable by this user alone
                secret = os.path.join(run_dir, os.path.basename(rel))
                fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    _fetch(head, ray, run_id, which, f)
            else:
                _unpack_input(head, ray, run_id, which, os.path.join(area, rel))
        out = os.path.join(run_dir, "out")
        for sub in ["out", *task.get("make", [])]:
            os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        argv = fill(task["argv"], area, f"{os.getuid()}:{os.getgid()}", run_dir)
        started = subprocess.run(argv, capture_output=True, text=True)
        if secret:  # docker read it when it created the container
            os.unlink(secret)
            secret = ""
        if started.returncode != 0:
            result.update(exit_code=started.returncode,
                          error=f"the container did not start on {node_ip}: {started.stderr.strip()[-300:]}")
            return result
        code = _wait(head, run_id, name, node)
        subprocess.run(["docker", "rm", name], capture_output=True)
        result["exit_code"] = code
        why = _send_outputs(head, ray, run_id, out)
        if why:
            result["error"] = why
        elif code == 0:
            result["status"] = "succeeded"
        else:
            killed = f" (killed by signal {code - 128})" if code is not None and code > 128 else ""
            result["error"] = f"the container exited {code}{killed} on {node_ip}"
        return result
    except KeyboardInterrupt:  # ray.cancel: the container goes with the task
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        result.update(status="cancelled", exit_code=143, error="cancelled (launcher stop)")
        raise
    finally:
        if secret and os.path.exists(secret):
            os.unlink(secret)
        shutil.rmtree(run_dir, ignore_errors=True)


def _wait(head: Any, run_id: str, name: str, node: int) -> int | None:
    """The container's exit code, its log streamed to the head meanwhile. The task's own thread only waits in short
    steps, so that a cancel (Ray raises KeyboardInterrupt in it) is seen within half a second."""
    ended: dict[str, int | None] = {}

    def wait() -> None:
        done = subprocess.run(["docker", "wait", name], capture_output=True, text=True)
        text = done.stdout.strip()
        ended["code"] = int(text) if text.lstrip("-").isdigit() else None

    follower = threading.Thread(target=_stream_logs, args=(head, run_id, name, node), daemon=True)
    waiter = threading.Thread(target=wait, daemon=True)
    follower.start()
    waiter.start()
    while waiter.is_alive():
        waiter.join(0.5)
    follower.join(30)
    return ended.get("code")


def _stream_logs(head: Any, run_id: str, name: str, node: int) -> None:
    """The container's output to the head's task.log as it comes, in pieces of about a second."""
    import ray

    follow = subprocess.Popen(["docker", "logs", "-f", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert follow.stdout is not None
    pending: list[bytes] = []
    last = time.monotonic()
    sent: list[Any] = []
    for line in iter(follow.stdout.readline, b""):
        pending.append(line)
        if time.monotonic() - last > 1.0 or sum(map(len, pending)) > 65536:
            sent.append(head.log.remote(run_id, b"".join(pending), node))
            pending, last = [], time.monotonic()
    if pending:
        sent.append(head.log.remote(run_id, b"".join(pending), node))
    follow.wait()
    ray.get(sent)


def _send_outputs(head: Any, ray: Any, run_id: str, out: str) -> str:
    """The run's outputs to the head as one tar stream, its SHA-256 checked there; '' or why they did not arrive."""
    with tempfile.TemporaryFile() as f:
        pack(out, f)
        size = f.tell()
        f.seek(0)
        digest = hashlib.sha256()
        path = ray.get(head.begin_outputs.remote(run_id))
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
            ray.get(head.put.remote(run_id, path, block))
    return str(ray.get(head.end_outputs.remote(run_id, path, digest.hexdigest(), size)))


def stop_container(name: str) -> bool:
    done = subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    return done.returncode == 0


# -- the driver: the Ray job of one array

def _failure(exc: BaseException, placed: dict[str, Any]) -> dict[str, Any]:
    """task.json's fields of a task that raised: cancelled, its node lost, or an error in launcher's task."""
    import ray

    kind = type(exc).__name__
    where = f"node {placed.get('node')} ({placed.get('node_id', '?')[:12]})" if placed.get("node") else "its node"
    result: dict[str, Any] = {**{k: placed.get(k) for k in ("node_id", "node", "task_id")}, "exit_code": None,
                                "image_ran": ""}
    if isinstance(exc, ray.exceptions.TaskCancelledError) or kind == "TaskCancelledError":
        return {**result, "status": "cancelled", "error": "cancelled (launcher stop)"}
    if isinstance(exc, (ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                        ray.exceptions.ObjectLostError)) or "NodeDied" in kind:
        return {**result, "status": "failed", "error": f"{where} left the cluster while it ran ({kind})"}
    text = str(exc).strip().splitlines()
    return {**result, "status": "failed", "error": f"{kind} on {where}: {text[-1] if text else ''}"[:500]}


def units(task: dict[str, Any], peers: list[str] | None = None) -> list[dict[str, Any]]:
    """The task of each node of a run (one for a run of one node): node k's container and argv, node J's address in
    place of @NODE<J>@, its own folder on its node (a home the nodes share keeps them apart)."""
    base = {k: v for k, v in task.items() if k != "nodes"}
    out = []
    for k, spec in enumerate(task["nodes"]):
        argv = list(spec["argv"])
        for j, address in enumerate(peers or []):
            argv = [a.replace(NODE_MARK.format(j), address) for a in argv]
        out.append({**base, **spec, "node": k, "argv": argv,
                    "folder": task["run_id"] if k == 0 else f"{task['run_id']}-node{k}"})
    return out


def merge(count: int, ended: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """A run's task.json from its nodes' results, in the order they ended: node 0's placement, every node's address;
    the first node that failed names the failure (the others were stopped because of it)."""
    if count == 1 and ended:
        return dict(ended[0][1])
    by_node = dict(ended)
    first = by_node.get(0, {})
    merged: dict[str, Any] = {key: first.get(key) for key in ("node_id", "node", "task_id", "image_ran")}
    merged["nodes"] = [by_node.get(k, {}).get("node") for k in range(count)]
    merged["node_ids"] = [by_node.get(k, {}).get("node_id") for k in range(count)]
    failed = [(k, r) for k, r in ended if r.get("status") == "failed"]
    if failed:
        k, r = failed[0]
        merged.update(status="failed", exit_code=r.get("exit_code"), error=f"node {k}: {r.get('error') or 'failed'}")
    elif any(r.get("status") == "cancelled" for _, r in ended) or len(ended) < count:
        merged.update(status="cancelled", exit_code=None, error="cancelled (launcher stop)")
    else:
        merged.update(status="succeeded", exit_code=0, error="")
    return merged


def drive(array_dir: str) -> int:
    """The Ray job of an array: every replicate one task (a run of several nodes: one task per node, on nodes Ray
    reserves together in a placement group, one node each), spread over the nodes (at most max_parallel replicates
    at once; runs of several nodes one at a time, their nodes on their hosts' ports), each run's task.json written
    as it ends; the first node of a run to fail stops its others; a cancel file in the array's folder (or SIGTERM)
    cancels the rest."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    with open(os.path.join(array_dir, JOB_FILE)) as f:
        job = json.load(f)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    ray.init(log_to_driver=False)
    here = ray.get_runtime_context().get_node_id()
    head = ray.remote(HeadFiles).options(
        num_cpus=0, max_concurrency=16,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote(job)
    remote_task = ray.remote(run_task)
    res = job.get("resources") or {}
    need = {"num_cpus": res.get("num_cpus", 1), "num_gpus": res.get("num_gpus", 0), "memory": res.get("memory")}
    bundle = {"CPU": need["num_cpus"], **({"GPU": need["num_gpus"]} if need["num_gpus"] else {}),
              **({"memory": need["memory"]} if need["memory"] else {})}
    todo = list(job["tasks"])
    several = any(len(t["nodes"]) > 1 for t in todo)
    limit = 1 if several else int(job.get("max_parallel") or len(todo))
    runs: dict[str, dict[str, Any]] = {}  # run ID -> its task, its nodes' results as they end, its placement group
    running: dict[Any, tuple[str, dict[str, Any]]] = {}  # a node's task -> its run ID and its unit
    cancelled: set[Any] = set()

    def finish(run_id: str, result: dict[str, Any]) -> None:
        run = runs.pop(run_id)
        result.update(ended_at=now(), job_id=job["job_id"])
        write_json(os.path.join(run["task"]["run_dir"], TASK_FILE), result)
        ray.get(head.forget_secret.remote(run_id))
        if run["pg"] is not None:
            remove_placement_group(run["pg"])

    def stop_on_node(unit: dict[str, Any]) -> None:
        """Remove a cancelled task's container on its node (the task removes it itself when it sees the cancel)."""
        placed = _read(os.path.join(unit["run_dir"], node_file(PLACED_FILE, unit["node"])))
        if placed.get("node_id"):
            strategy = NodeAffinitySchedulingStrategy(node_id=placed["node_id"], soft=False)
            try:
                ray.get(ray.remote(stop_container).options(num_cpus=0, scheduling_strategy=strategy)
                        .remote(unit["container"]), timeout=60)
            except Exception:  # noqa: S110 - a node gone takes its containers with it
                pass

    def start(task: dict[str, Any]) -> None:
        count, pg = len(task["nodes"]), None
        runs[task["run_id"]] = {"task": task, "ended": [], "pg": None}
        if count == 1:
            strategies: list[Any] = ["SPREAD"]
            peers = None
        else:
            pg = placement_group([dict(bundle) for _ in range(count)], strategy="STRICT_SPREAD")
            runs[task["run_id"]]["pg"] = pg
            ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_WAIT_S)
            if not ready:
                finish(task["run_id"], {"status": "failed", "exit_code": None, "error": (
                    f"Ray could not reserve {count} nodes with {bundle} each, one task per node, in "
                    f"{PLACEMENT_WAIT_S:.0f} s: the cluster has fewer nodes with that much free")})
                return
            where = placement_group_table(pg)["bundles_to_node_id"]
            address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
            peers = [address[where[k]] for k in range(count)]
            strategies = [PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=k)
                          for k in range(count)]
        for unit, strategy in zip(units(task, peers), strategies, strict=True):
            ref = remote_task.options(**need, scheduling_strategy=strategy, max_retries=0,
                                      name=f"launcher:{unit['folder']}").remote(head, unit, job["facts"])
            running[ref] = (task["run_id"], unit)

    try:
        while todo or running:
            while todo and len(runs) < limit and not stopping.is_set():
                start(todo.pop(0))
            if stopping.is_set() or os.path.exists(os.path.join(array_dir, CANCEL_FILE)):
                stopping.set()
                for task in todo:
                    write_json(os.path.join(task["run_dir"], TASK_FILE),
                               {"status": "cancelled", "exit_code": None, "error": "cancelled before it started",
                                "ended_at": now(), "job_id": job["job_id"]})
                todo = []
                for ref in set(running) - cancelled:
                    ray.cancel(ref)
                    cancelled.add(ref)
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in done:
                run_id, unit = running.pop(ref)
                try:
                    result = ray.get(ref)
                except BaseException as exc:
                    result = _failure(exc, _read(os.path.join(unit["run_dir"], node_file(PLACED_FILE, unit["node"]))))
                    if result["status"] == "cancelled":
                        stop_on_node(unit)
                run = runs[run_id]
                run["ended"].append((unit["node"], result))
                others = [r for r, (rid, _) in running.items() if rid == run_id]
                if result.get("status") == "failed":  # the first node to fail stops the others
                    for other in set(others) - cancelled:
                        ray.cancel(other)
                        cancelled.add(other)
                if not others:
                    finish(run_id, merge(len(run["task"]["nodes"]), run["ended"]))
    finally:  # the driver itself stopped (Ray's SIGKILL aside): no run is left without its result
        for ref, (_, unit) in running.items():
            ray.cancel(ref, force=True)
            stop_on_node(unit)
        raised = sys.exc_info()[1]
        why = f"{type(raised).__name__}: {raised}" if raised is not None else "it ended"
        for task in [*(r["task"] for r in runs.values()), *todo]:
            if not os.path.exists(os.path.join(task["run_dir"], TASK_FILE)):
                write_json(os.path.join(task["run_dir"], TASK_FILE),
                           {"status": "failed", "exit_code": None, "ended_at": now(), "job_id": job["job_id"],
                            "error": f"launcher's Ray driver stopped before the task ended ({why})"[:500]})
        for run in runs.values():
            if run["pg"] is not None:
                remove_placement_group(run["pg"])
        ray.get([head.forget_secret.remote(run_id) for run_id in list(runs)])
    ray.get(head.cleanup.remote())
    return 0


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# -- the cluster's facts (provision --scheduler ray): a job of its own

def probe_node(registry: list[str]) -> dict[str, Any]:
    import ray

    fmt = "{{.ServerVersion}} {{range $k, $v := .Runtimes}}{{$k}},{{end}}"
    info = subprocess.run(["docker", "info", "--format", fmt], capture_output=True, text=True)
    version, _, runtimes = info.stdout.strip().partition(" ")
    facts: dict[str, Any] = {"node_id": ray.get_runtime_context().get_node_id(),
                               "address": ray.util.get_node_ip_address(),
                               "docker": version if info.returncode == 0 and version else None,
                               "nvidia_runtime": "nvidia" in runtimes}
    if registry:
        import socket

        try:
            socket.create_connection((registry[0], int(registry[1])), timeout=5).close()
            facts["reaches_registry"] = True
        except OSError:
            facts["reaches_registry"] = False
    return facts


def probe(out: str, registry: list[str]) -> int:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(log_to_driver=False)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    fn = ray.remote(probe_node)
    refs = [fn.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
            .remote(registry) for n in alive]
    nodes = []
    for n, ref in zip(alive, refs, strict=True):
        res = n.get("Resources") or {}
        entry: dict[str, Any] = {"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                                   "cpus": res.get("CPU"), "gpus": res.get("GPU", 0),
                                   "memory_mb": int(res.get("memory", 0)) >> 20 if res.get("memory") else None,
                                   "head": bool(res.get("node:__internal_head__"))}
        try:
            entry.update(ray.get(ref, timeout=60))
        except Exception as exc:
            entry.update(docker=None, probe_error=f"{type(exc).__name__}: {str(exc).strip()[:200]}")
        nodes.append(entry)
    write_json(out, {"ray_version": ray.__version__, "nodes": nodes})
    return 0


# -- the job API, for launcher over SSH: Ray's REST API with the standard library (no Ray imported for a question a
# group's watcher asks every second or two), Ray's own client where the cluster asks for its authentication

class Unauthorized(Exception):
    pass


def _rest(address: str, method: str, path: str, body: Any = None) -> Any:
    """One call of the job API's REST interface; None for a job it does not know (404)."""
    import urllib.error
    import urllib.request

    if not address.startswith(("http://", "https://")):
        raise ValueError(f"the job API's address {address!r} is not http:// or https://")
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(address.rstrip("/") + path, data=data, method=method,  # noqa: S310 - checked above
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - http(s), checked above
            text = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        if exc.code in (401, 403):
            raise Unauthorized(str(exc.code)) from exc
        raise RuntimeError(f"HTTP {exc.code} from {address}{path}: {exc.read()[:200].decode(errors='replace')}") \
            from exc
    return json.loads(text) if text.strip() else None


def _by_client(address: str, cmd: str, args: list[str]) -> Any:
    """The same call through Ray's JobSubmissionClient (it adds the cluster's authentication headers)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    if cmd == "submit":
        client.submit_job(entrypoint=args[0], submission_id=args[1], entrypoint_num_cpus=0)
        return {"submitted": args[1]}
    if cmd == "status":
        try:
            info = client.get_job_info(args[0])
        except RuntimeError:  # Ray does not know it
            return {"status": None}
        return {"status": str(info.status), "message": info.message or ""}
    if cmd == "list":
        return [{"id": j.submission_id, "status": str(j.status)} for j in client.list_jobs()
                if (j.submission_id or "").startswith(JOB_PREFIX)]
    return {"stopped": bool(client.stop_job(args[0]))}


def api(address: str, cmd: str, args: list[str]) -> Any:
    """submit ENTRYPOINT ID | status ID | list | stop ID, as JSON-ready answers."""
    try:
        if cmd == "submit":
            _rest(address, "POST", "/api/jobs/", {"entrypoint": args[0], "submission_id": args[1],
                                                  "entrypoint_num_cpus": 0})
            return {"submitted": args[1]}
        if cmd == "status":
            info = _rest(address, "GET", f"/api/jobs/{args[0]}")
            if not isinstance(info, dict):
                return {"status": None}
            return {"status": str(info.get("status") or "") or None, "message": str(info.get("message") or "")}
        if cmd == "list":
            jobs = _rest(address, "GET", "/api/jobs/") or []
            return [{"id": j.get("submission_id"), "status": j.get("status")} for j in jobs
                    if isinstance(j, dict) and str(j.get("submission_id") or "").startswith(JOB_PREFIX)]
        answer = _rest(address, "POST", f"/api/jobs/{args[0]}/stop")
        return {"stopped": bool(isinstance(answer, dict) and answer.get("stopped"))}
    except Unauthorized:
        return _by_client(address, cmd, args)


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "driver":
        return drive(args[0])
    if cmd == "probe":
        return probe(args[0], args[1:3])
    if cmd not in ("submit", "status", "list", "stop"):
        print(json.dumps({"error": f"unknown command {cmd}"}))
        return 2
    address, rest = args[0], args[1:]
    if cmd == "submit":  # ID SCRIPT ARGS...: the script run by this Python, the one that has Ray
        entry = " ".join(["exec", _quote(sys.executable), *map(_quote, rest[1:])])
        rest = [entry, rest[0]]
    try:
        print(json.dumps(api(address, cmd, rest)))
    except Exception as exc:  # one line for launcher to name the problem
        lines = str(exc).strip().splitlines()
        print(json.dumps({"error": f"{type(exc).__name__}: {lines[-1] if lines else ''}"}))
        return 3
    return 0


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
