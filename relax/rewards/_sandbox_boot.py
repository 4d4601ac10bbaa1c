"""The first program of a sandbox: isolate, drop privileges, run the real program, outlive none of it.

Run by ``relax.rewards.sandbox`` as ``python -I -S _sandbox_boot.py CONFIG_JSON`` in a new session
(its own process group). It imports only the standard library, because after ``-I -S`` nothing else
is importable, and it is a separate program rather than a ``preexec_fn`` because a ``preexec_fn``
runs between fork and exec of a multi-threaded parent, where taking any lock can deadlock.

In order:

1. new network, mount and PID namespaces (plus a user namespace mapping our uid to root when we are
   not root): the program sees only a loopback interface that is down, so it has no network;
2. every mount read-only, then the scratch directory bound onto itself read-write: the scratch
   directory is the only place it can write (``/tmp``, ``/dev/shm`` and world-writable directories
   included);
3. a fork: the child is process 1 of the new PID namespace (its "init"); this process stays outside
   as the supervisor and relays the program's exit status;
4. the init mounts a ``/proc`` of the new namespace where the kernel allows it, and forks the program:
   resource limits (CPU seconds, address space, file size, process count, no core files), when root
   no supplementary groups and the gid and uid of the unprivileged user (``nobody``), a clean
   environment (``HOME`` and ``TMPDIR`` = scratch), then ``exec`` of the command in scratch;
5. when the program's first process ends, the init exits; the kernel then kills every process left
   in the namespace (whatever it forked, ``setsid`` or not, daemon or not) and reaps them before the
   supervisor's ``waitpid`` of the init returns. SIGTERM to the supervisor (the wall-clock timeout)
   kills the init the same way.

Any failure before the exec exits with status 120 and the reason on stderr: a sandbox that cannot be
built is never run unisolated.
"""

import ctypes
import json
import os
import resource
import signal
import sys

BOOT_FAILED = 120

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
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
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | (0 if as_root else CLONE_NEWUSER)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(flags) != 0:
        fail("unshare (new network, mount and PID namespaces)")
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


def exec_program(config: dict, program: int) -> None:
    """In the program's own process (process 2 of the namespace): limits, user, environment, exec."""
    scratch = config["scratch"]
    os.chdir(scratch)
    limit(config)
    if config["as_root"]:
        drop_privileges(config["uid"], config["gid"])
    env = {"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    try:
        os.execve(program, config["argv"], env)
    except OSError as exc:
        fail(f"exec {config['argv'][0]}", str(exc))


def mount_own_proc() -> None:
    """A /proc that lists only this namespace's processes. Best effort: a container that masks parts
    of its /proc forbids a new proc mount (EPERM), and the program then sees the outer /proc."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY
    libc.mount(b"proc", b"/proc", b"proc", ctypes.c_ulong(flags), None)


def run_init(config: dict, program: int, status_pipe: int) -> None:
    """Process 1 of the new PID namespace: start the program, reap orphans until the program's own
    process ends, report its wait status, exit. Exiting kills the rest of the namespace."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the supervisor gone: so are we
    mount_own_proc()
    child = os.fork()
    if child == 0:
        os.close(status_pipe)
        exec_program(config, program)
    os.close(program)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # cannot happen before the program is reaped; be safe anyway
            os._exit(BOOT_FAILED)
        if pid == child:
            break
    os.write(status_pipe, str(status).encode())
    os._exit(0)


def relay(status: int) -> None:
    """End this process the way the program ended: its exit code, or killed by its signal."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not end a process by default (e.g. SIGCHLD): say it


def supervise(init: int, status_pipe: int) -> None:
    """Outside the namespace: wait for the init (whose end kills the whole namespace), then relay."""

    def stop(signum, frame):  # the wall-clock timeout: end the namespace, then let waitpid return
        os.kill(init, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    os.waitpid(init, 0)
    report = os.read(status_pipe, 64)
    if not report:  # the init was killed (timeout) before it could report
        relay(signal.SIGKILL)  # a wait status of "killed by SIGKILL" is the signal number itself
    relay(int(report))


def main() -> None:
    # SIGTERM before the supervisor is ready: default action, and relax falls back to killing the group.
    config = json.loads(sys.argv[1])
    config["as_root"] = os.geteuid() == 0
    program = os.open(config["argv"][0], os.O_RDONLY)  # opened before the switch (see sandbox.py)
    isolate(config["scratch"], config["as_root"])
    read_end, write_end = os.pipe()
    init = os.fork()  # process 1 of the new PID namespace
    if init == 0:
        os.close(read_end)
        run_init(config, program, write_end)
    os.close(write_end)
    os.close(program)
    supervise(init, read_end)


if __name__ == "__main__":
    main()
