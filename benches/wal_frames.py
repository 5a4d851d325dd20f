#!/usr/bin/env python3
"""What a SQLite write-ahead log holds, by B-tree: which tables and indexes the gate's commits
rewrite, and how much of the log each one is.

    benches/wal_frames.py DB [WAL]      (WAL defaults to DB-wal)

Take the snapshot while the gate runs under load (copy the -wal file first, then the database):
the log holds every page each commit since its last restart rewrote, one 4 KiB frame a page, so
frames per B-tree is what each costs in bytes written (and copied back again by the checkpoint).
Pages are named with SQLite's `dbstat` table on a copy of the database; a page the database file
does not hold yet (the log only) is counted as "(new page)". Frames of an earlier log generation
(other salts) are not counted.
"""
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile


def frames(wal_path):
    """(page numbers of the log's current frames, commits among them, page size)."""
    with open(wal_path, "rb") as f:
        wal = f.read()
    if len(wal) < 32:
        return [], 0, 0
    _magic, _ver, page_size, _ckpt, salt1, salt2, _c1, _c2 = struct.unpack(">IIIIIIII", wal[:32])
    pages, commits, off = [], 0, 32
    while off + 24 + page_size <= len(wal):
        page, db_size, s1, s2, _k1, _k2 = struct.unpack(">IIIIII", wal[off:off + 24])
        if (s1, s2) != (salt1, salt2):
            break
        pages.append(page)
        commits += db_size != 0
        off += 24 + page_size
    return pages, commits, page_size


def names(db_path):
    """Page number -> the table or index it belongs to (read from a copy: no log replayed)."""
    with tempfile.TemporaryDirectory() as d:
        copy = os.path.join(d, "db")
        shutil.copyfile(db_path, copy)
        con = sqlite3.connect(copy)
        try:
            return dict(con.execute("SELECT pageno, name FROM dbstat"))
        finally:
            con.close()


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    db = sys.argv[1]
    wal = sys.argv[2] if len(sys.argv) == 3 else db + "-wal"
    pages, commits, page_size = frames(wal)
    if not pages:
        sys.exit(f"{wal}: no frames")
    owner = names(db)
    count = collections.Counter(owner.get(p, "(new page)") for p in pages)
    total = len(pages)
    print(f"{total} frames of {page_size} bytes in {commits} commits "
          f"({total / max(commits, 1):.1f} frames per commit)")
    for name, n in count.most_common():
        print(f"{n:9d} {100 * n / total:5.1f}%  {n / max(commits, 1):6.2f}/commit  {name}")


if __name__ == "__main__":
    main()
