"""What listens, and does it answer /v1/models without credentials? For the no-bypass tests.

Listening TCP sockets are read from /proc/<pid>/net/tcp{,6} (the network namespace of that pid:
the host's, or a container's), their owners from /proc/<pid>/fd. Every probe is a real connection.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from launcher import procs

_LISTEN = "0A"


def _hex_addr(field: str) -> tuple[str, int]:
    addr, port = field.split(":")
    if len(addr) == 8:
        ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1])
    else:  # /proc writes IPv6 as four little-endian 32-bit words
        raw = bytes.fromhex(addr)
        ip = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return ip, int(port, 16)


def listening(netns_pid: int | str = "self") -> dict[int, tuple[str, int]]:
    """{socket inode: (address, port)} of the TCP listeners in that pid's network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        path = Path(f"/proc/{netns_pid}/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == _LISTEN:
                out[int(cols[9])] = _hex_addr(cols[1])
    return out


def socket_inodes(pids: list[int]) -> set[int]:
    found: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found.add(int(target[8:-1]))
    return found


def process_tree(root: int) -> list[int]:
    """root and every descendant (by /proc/*/stat ppid)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := procs.stat_fields(int(entry))):
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def process_group(pgid: int) -> list[int]:
    return sorted(procs.group_members(pgid))


def ports_of(pids: list[int], netns_pid: int | str = "self") -> list[tuple[str, int]]:
    mine = socket_inodes(pids)
    return sorted({addr for inode, addr in listening(netns_pid).items() if inode in mine})


def get_v1_models(host: str, port: int, timeout: float = 5.0) -> str:
    """The status line a bare GET /v1/models gets (no credentials), or why there is none."""
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"GET /v1/models HTTP/1.0\r\nHost: probe\r\n\r\n")
            data = s.recv(256)
    except OSError as exc:
        return f"no answer ({type(exc).__name__})"
    line = data.split(b"\r\n", 1)[0].decode(errors="replace")
    return line if line.startswith("HTTP/") else f"not HTTP ({data[:16]!r})"


def probe_all(addrs: list[tuple[str, int]], timeout: float = 2.0) -> dict[str, str]:
    """get_v1_models on every address at once (vLLM's ZMQ and torch.distributed listeners accept and
    then say nothing: each costs its timeout)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(addrs))) as pool:
        lines = list(pool.map(lambda a: get_v1_models(a[0], a[1], timeout), addrs))
    return {f"{h}:{p}": line for (h, p), line in zip(addrs, lines)}


def get_over_uds(path: str, request_path: str, method: str = "GET", body: bytes = b"",
                 timeout: float = 10.0) -> str:
    """The status line of one request over a Unix socket, without credentials."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        head = (f"{method} {request_path} HTTP/1.0\r\nHost: engine\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        s.sendall(head + body)
        data = s.recv(256)
    return data.split(b"\r\n", 1)[0].decode(errors="replace")


def answered_ok(status_line: str) -> bool:
    parts = status_line.split()
    return len(parts) >= 2 and parts[0].startswith("HTTP/") and parts[1].startswith("2")
