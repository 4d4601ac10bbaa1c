"""The first program of a sandbox: isolate this process, drop privileges, then exec the real program.

Run by ``relax.rewards.sandbox`` as ``python -I -S _sandbox_boot.py CONFIG_JSON`` in a new session
(its own process group). It imports only the standard library, because after ``-I -S`` nothing else
is importable, and it is a separate program rather than a ``preexec_fn`` because a ``preexec_fn``
runs between fork and exec of a multi-threaded parent, where taking any lock can deadlock.

In order:

1. new network and mount namespaces (plus a user namespace mapping our uid to root when we are not
   root): the program sees only a loopback interface that is down, so it has no network;
2. every mount read-only, then the scratch directory bound onto itself read-write: the scratch
   directory is the only place it can write (``/tmp``, ``/dev/shm`` and world-writable directories
   included);
3. resource limits: CPU seconds, address space, file size, process count, no core files;
4. when root: no supplementary groups, then the gid and uid of the unprivileged user (``nobody``);
5. a clean environment (``HOME`` and ``TMPDIR`` = scratch) and ``exec`` of the command in scratch.

Any failure before the exec exits with status 120 and the reason on stderr: a sandbox that cannot be
built is never run unisolated.
"""

import ctypes
import json
import os
import resource
import sys

BOOT_FAILED = 120

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_NOATIME, MS_NODIRATIME, MS_REMOUNT, MS_BIND = 1024, 2048, 32, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
# Per-mount flags a remount must keep (a user namespace may not clear them: EPERM).
KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
        "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

libc = ctypes.CDLL(None, use_errno=True)


def fail(step: str, detail: str = "") -> None:
    err = ctypes.get_errno()
    reason = detail or os.strerror(err)
    sys.stderr.write(f"relax sandbox: {step} failed: {reason}\n")
    sys.stderr.flush()
    os._exit(BOOT_FAILED)


def mount(source, target, flags: int, step: str) -> None:
    src = source.encode() if source else None
    if libc.mount(src, target.encode(), None, ctypes.c_ulong(flags), None) != 0:
        fail(f"{step} ({target})")


def mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, in the order of /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for spaces
            kept = 0
            for option in fields[5].split(","):
                kept |= KEPT.get(option, 0)
            points.append((point, kept))
    return points


def isolate(scratch: str, as_root: bool) -> None:
    flags = CLONE_NEWNS | CLONE_NEWNET | (0 if as_root else CLONE_NEWUSER)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(flags) != 0:
        fail("unshare (new network and mount namespaces)")
    if not as_root:  # map ourselves to root inside the user namespace, so that we may mount
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")
    mount(None, "/", MS_REC | MS_PRIVATE, "making mounts private")
    mount(scratch, scratch, MS_BIND, "binding the scratch directory")
    for point, kept in mount_points():
        if point == scratch:
            continue
        if libc.mount(None, point.encode(), None, ctypes.c_ulong(MS_REMOUNT | MS_BIND | MS_RDONLY | kept),
                      None) != 0:
            if ctypes.get_errno() == 2:  # ENOENT: a mount point hidden by a later mount
                continue
            fail(f"remounting {point} read-only")
    scratch_kept = dict(mount_points()).get(scratch, 0)
    mount(None, scratch, MS_REMOUNT | MS_BIND | scratch_kept | MS_NOSUID | MS_NODEV,
          "remounting the scratch directory read-write")


def limit(config: dict) -> None:
    cpu = int(config["cpu_seconds"])
    for name, value in (
        ("RLIMIT_CPU", (cpu, cpu + 1)),
        ("RLIMIT_AS", (config["memory_bytes"],) * 2),
        ("RLIMIT_FSIZE", (config["file_bytes"],) * 2),
        ("RLIMIT_NPROC", (config["processes"],) * 2),
        ("RLIMIT_CORE", (0, 0)),
    ):
        try:
            resource.setrlimit(getattr(resource, name), value)
        except (ValueError, OSError) as exc:
            fail(f"setrlimit {name}", str(exc))


def drop_privileges(uid: int, gid: int) -> None:
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    except OSError as exc:
        fail(f"switching to uid {uid}", str(exc))
    if os.getuid() != uid or os.geteuid() != uid:
        fail("switching user", f"still uid {os.getuid()}")


def main() -> None:
    config = json.loads(sys.argv[1])
    scratch = config["scratch"]
    as_root = os.geteuid() == 0
    program = os.open(config["argv"][0], os.O_RDONLY)  # opened before the switch (see sandbox.py)
    isolate(scratch, as_root)
    os.chdir(scratch)
    limit(config)
    if as_root:
        drop_privileges(config["uid"], config["gid"])
    env = {"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    try:
        os.execve(program, config["argv"], env)
    except OSError as exc:
        fail(f"exec {config['argv'][0]}", str(exc))


if __name__ == "__main__":
    main()
