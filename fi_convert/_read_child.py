"""The child process of a `child_read.ChildRing`: reader threads that read files' byte ranges
into a ring of shared memory, for the parent to copy out. Run as a script by the parent
(`python -I -S`), it imports nothing but the standard library (not torch: it starts in
milliseconds), and holds no interpreter lock of the parent's: the parent's Python runs at its
own speed beside the read.

argv: the ring's memory (an fd), the control socket (an fd, SOCK_SEQPACKET), threads, slot
bytes, slots. Messages from the parent, each one packet: b"F" with files' fds (`send_fds`), in
the order the jobs number them; b"J" jobs (id, file, offset, size); b"S" slots given back. To
the parent: b"H" once set up; b"R" (slot, id) for a job read into a slot; b"X" (id) and a
line, for a job that could not be read. The parent closing its end (or dying) ends this
process at once. Ctrl-C at a terminal reaches this process too (its group's): the parent takes
it and closes its end, so it is ignored here; any fault of this process's own ends it without
a word (the parent says it).
"""

import mmap
import os
import queue
import signal
import socket
import struct
import sys
import threading

JOB = struct.Struct("=iiqq")  # id, file, offset, size
SLOT = struct.Struct("=i")
READY = struct.Struct("=ii")  # slot, id


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # (started with the parent's signals held: SIGTERM ends this process as it comes)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    ring_fd, sock_fd, threads, chunk, slots = map(int, sys.argv[1:6])
    ring = mmap.mmap(ring_fd, slots * chunk, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    view = memoryview(ring)
    sock = socket.socket(fileno=sock_fd)
    files: list[int] = []
    jobs: queue.SimpleQueue = queue.SimpleQueue()
    free: queue.SimpleQueue = queue.SimpleQueue()
    for s in range(slots):
        free.put(s)

    def reader() -> None:
        while True:
            job_id, f, offset, size = jobs.get()
            s = free.get()
            into = view[s * chunk : s * chunk + size]
            done = 0
            try:
                while done < size:
                    n = os.preadv(files[f], [into[done:]], offset + done)
                    if n == 0:
                        raise EOFError(f"ends at byte {offset + done}, before byte {offset + size}")
                    done += n
            except BaseException as e:  # (each job is answered: the parent counts them)
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or repr(e)
                text = (
                    str(e)
                    if isinstance(e, EOFError)
                    else f"read failed at byte {offset + done} ({why})"
                )
                sock.send(b"X" + SLOT.pack(job_id) + text.encode())
                free.put(s)
                continue
            sock.send(b"R" + READY.pack(s, job_id))

    for _ in range(threads):
        threading.Thread(target=reader, daemon=True).start()
    sock.send(b"H")  # (set up: Ctrl-C ignored from here on)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 256)
        except OSError:
            break
        if not msg:
            break
        kind, body = msg[:1], msg[1:]
        if kind == b"F":
            files.extend(fds)
        elif kind == b"J":
            for job in JOB.iter_unpack(body):
                jobs.put(job)
        elif kind == b"S":
            for (s,) in SLOT.iter_unpack(body):
                free.put(s)
    os._exit(0)  # (the readers mid-read with it)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # (no traceback on the server's terminal: the parent says it ended)
        os._exit(1)
